"""Admin pages: the fleet map and machines, partitions, tenants and plans, trials, usage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import StringConstraints, TypeAdapter, ValidationError

from api.dashboard import charts, fleetmap, forms, sessions
from api.dashboard.web import AdminUser, DashboardRoute, Form, markup, render
from api.deps import DbDep, RuntimeDep, SettingsDep
from api.schemas import Email, KeyName, PlanName, TenantName
from api.views import hours, partition_out, tenant_out, tenant_status, usage_csv
from scheduler import bus
from scheduler.billing import remaining_ipu_ms
from scheduler.errors import DomainError, InvalidRequest
from scheduler.jobspec import PartitionName
from scheduler.services.capacity import fleet, machines, partitions
from scheduler.services.tenancy import keys as key_service
from scheduler.services.tenancy import tenants as tenant_service
from scheduler.services.tenancy import trials
from scheduler.services.tenancy import usage as usage_service
from scheduler.services.tenancy.scope import ALL_TENANTS, OneTenant
from scheduler.text import TEXT
from vipu.machine_types import MACHINE_TYPE_NAMES
from vipu.topology import parse_machine_id

router = APIRouter(prefix="/admin", include_in_schema=False, route_class=DashboardRoute)

MachineId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9._-]+$")]
Name = Annotated[str, Path(min_length=1, max_length=64)]
HEALTH = {"drain": "draining", "fail": "failed", "restore": "up"}
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# POD64s on one page of the fleet map: 4 rows of 2, each IPU still big enough to read its letter.
MAP_PODS = 8
CHART_DAYS = 30
PARTITION_NAME: TypeAdapter[str] = TypeAdapter(PartitionName)
TENANT_NAME: TypeAdapter[str] = TypeAdapter(TenantName)
# The API's rules for the same fields, so both faces refuse alike.
REASON: TypeAdapter[str] = TypeAdapter(Annotated[str, StringConstraints(max_length=1000, pattern=TEXT)])
HEALTH_REASON: TypeAdapter[str] = TypeAdapter(Annotated[str, StringConstraints(max_length=500, pattern=TEXT)])
EMAIL: TypeAdapter[str] = TypeAdapter(Email)
PLAN: TypeAdapter[str] = TypeAdapter(PlanName)
KEY_NAME: TypeAdapter[str] = TypeAdapter(KeyName)


def _key_once(request: Request, user: sessions.DashSession, **context: Any) -> Response:
    """A page that shows a new API key exactly once: never cached, never stored anywhere."""
    return render(request, "key_once.html", context, user=user)


@router.get("", response_class=HTMLResponse)
def admin_home() -> Response:
    return RedirectResponse("/admin/fleet", status_code=303)


# Fleet and machines -----------------------------------------------------------------------------------


@router.get("/fleet", response_class=HTMLResponse)
def fleet_page(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    user: AdminUser,
    machine: Annotated[str | None, Query(max_length=32, pattern=r"^[A-Za-z0-9._-]*$")] = None,
    pod_from: Annotated[int, Query(ge=0, le=1023)] = 0,
) -> Response:
    if machine:
        try:
            pod_from = parse_machine_id(machine)[0]  # the page of the map that holds it
        except ValueError:
            machine = None
    with db.read() as s:
        summary = partitions.fleet_summary(
            session=s,
            head_size=None,
            policy=settings.placement_policy,
            allocators=runtime.allocators,
        )
        # A page past the end of the fleet shows its last page.
        pod_from = min(pod_from, max(0, (summary.get("pods") or 1) - 1))
        pod_from -= pod_from % MAP_PODS
        view = partitions.fleet_view(session=s, pod_from=pod_from, pods=MAP_PODS)
        names = {t.id: t.name for t in usage_service.tenant_totals(session=s, scope=ALL_TENANTS)}
        live = fleet.list_partitions(session=s, scope=ALL_TENANTS, limit=100_000)
        jobs = {p.name: p.job_id for p in live}
        created = {p.name: p.pk for p in live}  # creation order: what gives each its letter
        down = [
            {"id": m.id, "health": m.health, "reason": m.health_reason}
            for m in fleet.machines_not_up(session=s)
        ]
        racks = fleet.racks(session=s)
    keys = fleetmap.legend(view, names, jobs, created)
    selected = None
    if machine:
        selected = next((m for p in view["pods"] for m in p["machines"] if m["id"] == machine), None)
    total = summary.get("pods") or len(view["pods"])
    return render(
        request,
        "admin_fleet.html",
        {
            "map": markup(fleetmap.draw(view, keys, selected=machine if selected else None)),
            "legend": keys,
            "summary": summary,
            "selected": selected,
            "down": down,
            "tenant_names": names,
            "pods": view["pods"],
            "total_pods": total,
            # Pages of the map, (first pod, last pod), when the fleet does not fit on one.
            "pages": [(a, min(a + MAP_PODS, total) - 1) for a in range(0, total, MAP_PODS)]
            if total > MAP_PODS
            else [],
            "pod_from": pod_from,
            "map_pods": MAP_PODS,
            "racks": racks,
        },
        user=user,
    )


# Racks and servers: the fleet changes while it runs -----------------------------------------------------


@router.post("/fleet/racks")
def add_rack(request: Request, db: DbDep, user: AdminUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    errors: dict[str, str] = {}
    pods = forms.optional_int(form.get("pods", "1"), "pods", errors, maximum=2) or 1
    if errors:
        raise InvalidRequest(errors["pods"], field="pods")
    with db.write() as s:
        rack = fleet.add_rack(
            session=s, machine_type=form.get("machine_type", ""), layout=form.get("layout", ""), units=pods
        )
    bus.wake_scheduler("fleet")
    sessions.flash(user, f"rack{rack:04d} added: the scheduler places on it from its next pass.")
    return RedirectResponse("/admin/fleet#racks", status_code=303)


@router.post("/fleet/servers")
def add_servers(request: Request, db: DbDep, user: AdminUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    errors: dict[str, str] = {}
    count = forms.optional_int(form.get("count", "1"), "count", errors, maximum=64) or 1
    if errors:
        raise InvalidRequest(errors["count"], field="count")
    with db.write() as s:
        added = fleet.add_servers(session=s, model=form.get("model", ""), count=count)
    bus.wake_scheduler("fleet")
    sessions.flash(user, "added " + ", ".join(fleet.unit_name(u, "server") for u in added) + ".")
    return RedirectResponse("/admin/fleet#racks", status_code=303)


@router.post("/fleet/racks/{rack_id}/{action}")
def rack_action(
    request: Request,
    rack_id: Annotated[str, Path(max_length=16)],
    action: Annotated[str, Path(pattern="^(drain|restore|retire)$")],
    db: DbDep,
    user: AdminUser,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    rack = fleet.parse_rack(rack_id)
    with db.write() as s:
        if action == "retire":
            retired = fleet.retire(session=s, rack=rack)
            message = f"{rack_id} retired ({', '.join(retired)})."
        else:
            fleet.drain_rack(session=s, rack=rack, health=HEALTH[action], reason=None)
            message = f"{rack_id}: every machine {HEALTH[action]}."
    bus.wake_scheduler("fleet")
    sessions.flash(user, message)
    return RedirectResponse("/admin/fleet#racks", status_code=303)


@router.post("/fleet/units/{unit_id}/retire")
def retire_unit(
    request: Request, unit_id: Annotated[str, Path(max_length=16)], db: DbDep, user: AdminUser, form: Form
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        retired = fleet.retire(session=s, unit=fleet.parse_unit(unit_id))
    bus.wake_scheduler("fleet")
    sessions.flash(user, f"retired {', '.join(retired)}.")
    return RedirectResponse("/admin/fleet#racks", status_code=303)


@router.post("/machines/{machine_id}/{action}")
def machine_action(
    request: Request,
    machine_id: MachineId,
    action: Annotated[str, Path(pattern="^(drain|fail|restore)$")],
    db: DbDep,
    user: AdminUser,
    settings: SettingsDep,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    raw = form.get("reason", "").strip(forms.BLANKS)
    reason = forms.valid(HEALTH_REASON, raw, "reason", "visible text, 500 at most.") if raw else None
    with db.write() as s:
        m, _ = machines.set_health(
            session=s,
            machine=machine_id,
            health=HEALTH[action],
            reason=reason,
            max_attempts=settings.max_attempts,
        )
        health = m.health
    bus.wake_scheduler("machine")
    sessions.flash(user, f"{machine_id} is now {health}.")
    return RedirectResponse(f"/admin/fleet?machine={machine_id}#machine", status_code=303)


# Partitions -------------------------------------------------------------------------------------------


def _partitions_context(db: DbDep) -> dict[str, Any]:
    with db.read() as s:
        rows = [partition_out(p) for p in fleet.list_partitions(session=s, scope=ALL_TENANTS, limit=100_000)]
        tenants = [(t.id, t.name) for t in usage_service.tenant_totals(session=s, scope=ALL_TENANTS)]
    return {"partitions": rows, "tenants": tenants, "sizes": SIZES, "names": dict(tenants)}


@router.get("/partitions", response_class=HTMLResponse)
def partitions_page(request: Request, db: DbDep, user: AdminUser) -> Response:
    return render(request, "admin_partitions.html", {**_partitions_context(db), "values": {}, "errors": {}})


@router.post("/partitions", response_class=HTMLResponse)
def create_partition(
    request: Request, db: DbDep, settings: SettingsDep, runtime: RuntimeDep, user: AdminUser, form: Form
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    values = forms.values_of(form, ("id", "size", "machine_type", "tenant", "gcds"))
    errors: dict[str, str] = {}
    name = values["id"]
    try:
        PARTITION_NAME.validate_python(name)
    except ValidationError:
        errors["id"] = "Letters, digits, dot, dash and underscore; up to 64; starting with a letter or digit."
    size = forms.optional_int(values["size"], "size", errors, maximum=65536)
    gcds = forms.optional_int(values["gcds"] or "1", "gcds", errors, maximum=65536) or 1
    if size is None and "size" not in errors:
        errors["size"] = "Choose a size."
    machine_type = values["machine_type"] or None
    if machine_type is not None and machine_type not in MACHINE_TYPE_NAMES:
        errors["machine_type"] = f"{', '.join(MACHINE_TYPE_NAMES)} or any."
    if not errors:
        try:
            with db.write() as s:
                part = partitions.create_partition(
                    session=s,
                    name=name,
                    size=int(size or 0),
                    machine_type=machine_type,
                    tenant_id=values["tenant"] or None,
                    gcds=gcds,
                    created_by=user.principal.key_id,
                    policy=settings.placement_policy,
                    allocators=runtime.allocators,
                )
                created = part.name
        except DomainError as exc:
            errors[str(exc.extra.get("field", "form"))] = exc.detail
        else:
            bus.wake_scheduler("partition")
            sessions.flash(user, f"create partition ({created}): success.")
            return RedirectResponse("/admin/partitions", status_code=303)
    context = {**_partitions_context(db), "values": values, "errors": errors}
    return render(request, "admin_partitions.html", context, status_code=422, user=user)


@router.post("/partitions/{name}/{action}")
def partition_action(
    request: Request,
    name: Name,
    action: Annotated[str, Path(pattern="^(remove|reset)$")],
    db: DbDep,
    settings: SettingsDep,
    user: AdminUser,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        if action == "remove":
            partitions.remove_partition(session=s, name=name)
            message = f"remove partition ({name}): success."
        else:
            _, jobs = partitions.reset_partition(session=s, name=name, max_attempts=settings.max_attempts)
            message = f"reset partition ({name}): success." + (
                f" {', '.join(jobs)} go back to the queue." if jobs else ""
            )
    bus.wake_scheduler("partition")
    sessions.flash(user, message)
    return RedirectResponse("/admin/partitions", status_code=303)


# Tenants and plans ------------------------------------------------------------------------------------


def _tenants_context(db: DbDep) -> dict[str, Any]:
    with db.read() as s:
        tenants = [tenant_out(t) for t in usage_service.tenant_totals(session=s, scope=ALL_TENANTS)]
        plans = tenant_service.list_plans(session=s)
        plan_rows = [
            {
                "name": p.name,
                "kind": p.kind,
                "description": p.description,
                "quota_ipu_hours": p.quota_ipu_hours,
                "trial_days": p.trial_days,
                "max_partition_size": p.max_partition_size,
                "max_concurrent_jobs": p.max_concurrent_jobs,
                "max_queued_jobs": p.max_queued_jobs,
            }
            for p in plans
        ]
    return {"tenants": tenants, "plans": plan_rows}


@router.get("/tenants", response_class=HTMLResponse)
def tenants_page(request: Request, db: DbDep, user: AdminUser) -> Response:
    return render(
        request, "admin_tenants.html", {**_tenants_context(db), "values": {"plan": "trial"}, "errors": {}}
    )


@router.post("/tenants", response_class=HTMLResponse)
def create_tenant(
    request: Request, db: DbDep, settings: SettingsDep, user: AdminUser, form: Form
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    values = forms.values_of(form, ("name", "plan", "quota_ipu_hours", "owner_email"))
    errors: dict[str, str] = {}
    try:
        TENANT_NAME.validate_python(values["name"])
    except ValidationError:
        errors["name"] = "Letters, digits, space, dot, dash, underscore; up to 100."
    quota = forms.optional_float(values["quota_ipu_hours"], "quota_ipu_hours", errors)
    for field, adapter, message in (("owner_email", EMAIL, "An e-mail address."), ("plan", PLAN, "A plan.")):
        if values[field]:
            try:
                adapter.validate_python(values[field])
            except ValidationError:
                errors[field] = message
    if not errors:
        try:
            with db.write() as s:
                created = tenant_service.create_tenant(
                    session=s,
                    secret=settings.secret(),
                    name=values["name"],
                    plan=values["plan"] or "trial",
                    quota_ipu_hours=quota,
                    owner_email=values["owner_email"] or None,
                )
                tenant = tenant_out(created.tenant)
                api_key = created.api_key
        except DomainError as exc:
            errors[str(exc.extra.get("field", "form"))] = exc.detail
        else:
            return _key_once(
                request,
                user,
                title=f"Tenant {tenant.name} created",
                tenant=tenant,
                api_key=api_key,
                application=None,
            )
    context = {**_tenants_context(db), "values": values, "errors": errors}
    return render(request, "admin_tenants.html", context, status_code=422, user=user)


def _tenant_context(db: DbDep, tenant_id: str) -> dict[str, Any]:
    with db.read() as s:
        t = tenant_service.get_tenant(session=s, tenant_id=tenant_id)
        tenant = tenant_out(t)
        plans = [p.name for p in tenant_service.list_plans(session=s)]
        keys = [
            {
                "id": k.id,
                "name": k.name,
                "scopes": k.scopes,
                "created_at": k.created_at,
                "expires_at": k.expires_at,
                "revoked_at": k.revoked_at,
            }
            for k in key_service.list_keys(session=s, tenant_id=t.id, limit=500)
        ]
        groups = usage_service.breakdowns(session=s, scope=OneTenant(t.id), limit=20)
    return {"tenant": tenant, "plans": plans, "keys": keys, "by_job": groups["by_job"]}


@router.get("/tenants/{tenant_id}", response_class=HTMLResponse)
def tenant_page(request: Request, tenant_id: Name, db: DbDep, user: AdminUser) -> Response:
    return render(request, "admin_tenant.html", {**_tenant_context(db, tenant_id), "errors": {}})


@router.post("/tenants/{tenant_id}", response_class=HTMLResponse)
def update_tenant(request: Request, tenant_id: Name, db: DbDep, user: AdminUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    values = forms.values_of(form, ("plan", "quota_ipu_hours", "status", "expires_at"))
    errors: dict[str, str] = {}
    changes: dict[str, object] = {}
    if values["plan"]:
        changes["plan"] = values["plan"]
    quota = forms.optional_float(values["quota_ipu_hours"], "quota_ipu_hours", errors)
    if quota is not None:
        changes["quota_ipu_hours"] = quota
    if values["status"] in ("active", "suspended"):
        changes["status"] = values["status"]
    elif values["status"]:
        errors["status"] = "active or suspended."
    expires_at = forms.optional_datetime(values["expires_at"], "expires_at", errors)
    if expires_at is not None:
        changes["expires_at"] = expires_at
    if not errors:
        try:
            with db.write() as s:
                tenant_service.update_tenant(session=s, tenant_id=tenant_id, changes=changes)
        except InvalidRequest as exc:
            errors[str(exc.extra.get("field", "form"))] = exc.detail
        else:
            sessions.flash(user, "Tenant updated.")
            return RedirectResponse(f"/admin/tenants/{tenant_id}", status_code=303)
    context = {**_tenant_context(db, tenant_id), "errors": errors}
    return render(request, "admin_tenant.html", context, status_code=422, user=user)


@router.post("/tenants/{tenant_id}/keys", response_class=HTMLResponse)
def create_tenant_key(
    request: Request,
    tenant_id: Name,
    db: DbDep,
    settings: SettingsDep,
    user: AdminUser,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    raw = form.get("name", "").strip(forms.BLANKS)
    name = forms.valid(KEY_NAME, raw, "name", "one line, 100 characters at most.") if raw else "dashboard key"
    with db.write() as s:
        _, api_key = tenant_service.create_tenant_key(
            session=s,
            secret=settings.secret(),
            tenant_id=tenant_id,
            name=name,
            scopes=None,
            expires_at=None,
            member_id=None,
            created_by=user.principal.key_id,
        )
        tenant = tenant_out(tenant_service.get_tenant(session=s, tenant_id=tenant_id))
    return _key_once(
        request, user, title=f"New key for {tenant.name}", tenant=tenant, api_key=api_key, application=None
    )


@router.post("/tenants/{tenant_id}/keys/{key_id}/revoke")
def revoke_tenant_key(
    request: Request,
    tenant_id: Name,
    key_id: Name,
    db: DbDep,
    user: AdminUser,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        key_service.revoke_key(session=s, key_id=key_id, tenant_id=tenant_id)
    sessions.flash(user, f"Key {key_id} revoked.")
    return RedirectResponse(f"/admin/tenants/{tenant_id}", status_code=303)


@router.post("/plans/{name}")
def update_plan(request: Request, name: Name, db: DbDep, user: AdminUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    errors: dict[str, str] = {}
    changes: dict[str, object] = {}
    quota = forms.optional_float(form.get("quota_ipu_hours", ""), "quota_ipu_hours", errors)
    if quota is not None:
        changes["quota_ipu_hours"] = quota
    for field, maximum in (
        ("trial_days", 3650),
        ("max_partition_size", 65536),
        ("max_concurrent_jobs", 1_000_000),
        ("max_queued_jobs", 10_000_000),
    ):
        value = forms.optional_int(form.get(field, ""), field, errors, maximum=maximum)
        if value is not None:
            changes[field] = value
    if errors:
        raise InvalidRequest("; ".join(f"{k}: {v}" for k, v in errors.items()))
    with db.write() as s:
        tenant_service.update_plan(session=s, name=name, changes=changes)
    sessions.flash(user, f"Plan {name} updated.")
    return RedirectResponse("/admin/tenants#plans", status_code=303)


# Trial applications -----------------------------------------------------------------------------------


@router.get("/trials", response_class=HTMLResponse)
def trials_page(
    request: Request,
    db: DbDep,
    user: AdminUser,
    status: Annotated[str, Query(pattern="^(pending|approved|rejected|all)$")] = "pending",
) -> Response:
    with db.read() as s:
        apps = trials.list_applications(
            session=s, status=None if status == "all" else status, after=None, limit=500
        )
        rows = [
            {
                "id": a.id,
                "name": a.name,
                "email": a.email,
                "organisation": a.organisation,
                "category": a.category,
                "intended_use": a.intended_use,
                "status": a.status,
                "reason": a.reason,
                "tenant_id": a.tenant_id,
                "created_at": a.created_at,
                "decided_at": a.decided_at,
            }
            for a in apps
        ]
        plans = [p.name for p in tenant_service.list_plans(session=s)]
    return render(
        request,
        "admin_trials.html",
        {
            "applications": rows,
            "status": status,
            "plans": plans,
            "default_plans": tenant_service.TRIAL_PLAN_BY_CATEGORY,
        },
        user=user,
    )


@router.post("/trials/{application_id}/approve", response_class=HTMLResponse)
def approve_trial(
    request: Request,
    application_id: Name,
    db: DbDep,
    settings: SettingsDep,
    user: AdminUser,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    hand_over_key = form.get("hand_over_key") == "1"
    with db.write() as s:
        application, created = trials.approve(
            session=s,
            secret=settings.secret(),
            application_id=application_id,
            plan=form.get("plan") or None,
            decided_by=user.principal.key_id,
            link_base=settings.link_base,
            hand_over_key=hand_over_key,
        )
        tenant = tenant_out(created.tenant)
        api_key = created.api_key
        applicant = {"id": application.id, "name": application.name, "email": application.email}
    if api_key is None:
        # The applicant's claim link mints the first key; the admin never sees it.
        sessions.flash(
            user,
            f"Application {application_id} approved: tenant {tenant.name}; "
            "the claim link is mailed to the applicant.",
        )
        return RedirectResponse("/admin/trials?status=approved", status_code=303)
    return _key_once(
        request,
        user,
        title=f"Trial approved: {tenant.name}",
        tenant=tenant,
        api_key=api_key,
        application=applicant,
    )


@router.post("/trials/{application_id}/reject")
def reject_trial(
    request: Request, application_id: Name, db: DbDep, settings: SettingsDep, user: AdminUser, form: Form
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    reason = forms.valid(REASON, form.get("reason", ""), "reason", "visible text, 1000 characters at most.")
    with db.write() as s:
        trials.reject(
            session=s,
            application_id=application_id,
            reason=reason,
            decided_by=user.principal.key_id,
            link_base=settings.link_base,
        )
    sessions.flash(user, f"Application {application_id} rejected.")
    return RedirectResponse("/admin/trials", status_code=303)


# Usage across tenants ---------------------------------------------------------------------------------


@router.get("/usage", response_class=HTMLResponse)
def usage_page(request: Request, db: DbDep, user: AdminUser) -> Response:
    today = datetime.now(UTC).date()
    since = datetime.combine(today - timedelta(days=CHART_DAYS - 1), datetime.min.time(), tzinfo=UTC)
    with db.read() as s:
        tenants = [tenant_out(t) for t in usage_service.tenant_totals(session=s, scope=ALL_TENANTS)]
        recent = usage_service.breakdowns(session=s, scope=ALL_TENANTS, since=since)
        whole = usage_service.breakdowns(session=s, scope=ALL_TENANTS, limit=50)
    series = charts.daily_series(recent["by_day"], days=CHART_DAYS, today=today)
    chart = charts.bar_chart(
        series,
        title=f"IPU-hours per day across tenants, last {CHART_DAYS} days",
        unit="IPU-hours",
        chart_id="all-usage",
    )
    names = {t.id: t.name for t in tenants}
    return render(
        request,
        "admin_usage.html",
        {
            "tenants": tenants,
            "chart": markup(chart),
            "by_workload": whole["by_workload"],
            "by_partition_size": whole["by_partition_size"],
            "by_machine_type": whole["by_machine_type"],
            "by_job": whole["by_job"],
            "names": names,
            "total_used": sum(t.used_ipu_hours for t in tenants),
        },
        user=user,
    )


@router.get("/usage.csv")
def usage_export(db: DbDep, user: AdminUser) -> Response:
    with db.read() as s:
        rows = [
            {
                "tenant_id": t.id,
                "name": t.name,
                "plan": t.plan_name,
                "status": tenant_status(t),
                "quota_ipu_hours": hours(t.quota_ipu_ms),
                "used_ipu_hours": hours(t.used_ipu_ms),
                "reserved_ipu_hours": hours(t.reserved_ipu_ms),
                "remaining_ipu_hours": hours(remaining_ipu_ms(t)),
                "expires_at": t.expires_at.isoformat() if t.expires_at else "",
            }
            for t in usage_service.tenant_totals(session=s, scope=ALL_TENANTS)
        ]
    fields = list(rows[0]) if rows else ["tenant_id"]
    return Response(
        usage_csv(rows, fields),
        media_type="text/csv",
        headers={"Content-Disposition": 'attachment; filename="usage-all-tenants.csv"'},
    )
