"""A tenant's pages: home (grant, usage chart, running and queued jobs), jobs, submit, a job live."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from api.dashboard import charts, forms, model_pages, sessions
from api.dashboard.web import (
    DashboardRoute,
    Form,
    ReaderUser,
    SubmitterUser,
    TenantReader,
    User,
    markup,
    render,
)
from api.deps import DbDep, RuntimeDep, SettingsDep
from api.schemas import CURSOR_PATTERN, JobOut
from api.streams import LastEventId, Standing, job_event_stream, key_denial
from api.views import days_left, hours, job_out, job_view, tenant_status, usage_csv
from scheduler import bus, emulation
from scheduler.billing import remaining_ipu_ms
from scheduler.db import retry_conflicts
from scheduler.errors import DomainError, Forbidden, InvalidRequest
from scheduler.jobspec import JobSpec
from scheduler.models import FINAL_JOB_STATES, Job
from scheduler.services import sessions as session_service
from scheduler.services.batch import estimates
from scheduler.services.batch import job_views as job_view_service
from scheduler.services.batch import jobs as job_service
from scheduler.services.tenancy import rates as rate_service
from scheduler.services.tenancy import tenants as tenant_service
from scheduler.services.tenancy import usage as usage_service
from scheduler.services.tenancy.scope import OneTenant, Scope
from vipu import emulator
from vipu.emulator.serving import DEFAULT_SERVE_BATCHES
from vipu.machine_types import MachineType

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

JobId = Annotated[str, Path(min_length=1, max_length=64)]
# The token the submit form carries (secrets.token_urlsafe): a resent form is the same job.
IDEMPOTENCY = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHART_DAYS = 30
LOG_TAIL = 300


def _job_views(s: Any, jobs: list[Job], scope: Scope) -> list[JobOut]:
    """Rows of the home and jobs pages: each job with why it waits (no history nor IPU-hours)."""
    return [job_view(r) for r in job_view_service.job_reads(session=s, jobs=jobs, scope=scope, detail=False)]


def _live_facts(s: Any, job: Job, attempt: Any) -> dict[str, Any]:
    """What the job page shows beside the log and moves while the job runs (see job.js)."""
    partition = job_service.attempt_partition(session=s, attempt=attempt)
    return {
        "partition": partition.name if partition is not None else None,
        "machine": partition.machine_type if partition is not None else job.machine_type,
        "attempts": job.attempts,
        "used_ipu_hours": hours(usage_service.job_used_ipu_ms(session=s, job_id=job.id)),
    }


def grant(t: Any, plan: Any) -> dict[str, Any]:
    remaining = remaining_ipu_ms(t)
    return {
        "plan": plan.name,
        "plan_kind": plan.kind,
        "plan_description": plan.description,
        "quota": hours(t.quota_ipu_ms),
        "used": hours(t.used_ipu_ms),
        "reserved": hours(t.reserved_ipu_ms),
        "remaining": hours(remaining),
        "used_share": 0.0 if t.quota_ipu_ms == 0 else min(1.0, t.used_ipu_ms / t.quota_ipu_ms),
        "expires_at": t.expires_at,
        "days_left": days_left(t.expires_at),
        "trial_days": plan.trial_days,
        "max_partition_size": plan.max_partition_size,
        "max_concurrent_jobs": plan.max_concurrent_jobs,
    }


def tenant_home(request: Request, db: DbDep, user: sessions.DashSession) -> Response:
    if user.tenant_id is None:
        return RedirectResponse("/admin/fleet", status_code=303)
    today = datetime.now(UTC).date()
    since = datetime.combine(today - timedelta(days=CHART_DAYS - 1), datetime.min.time(), tzinfo=UTC)
    with db.read() as s:
        t = tenant_service.get_tenant(session=s, tenant_id=user.tenant_id)
        scope = OneTenant(t.id)
        plan = tenant_service.get_plan(session=s, name=t.plan_name)
        groups = usage_service.breakdowns(session=s, scope=scope, since=since)
        running = _job_views(
            s, job_service.list_jobs(session=s, scope=scope, after=None, limit=50, state="running"), scope
        )
        queued = _job_views(
            s, job_service.list_jobs(session=s, scope=scope, after=None, limit=50, state="queued"), scope
        )
        recent = [
            job_out(j)
            for j in job_service.list_jobs(session=s, scope=scope, after=None, limit=20)
            if j.state in FINAL_JOB_STATES
        ][:8]
        tenant = {"id": t.id, "name": t.name, "status": tenant_status(t)}
        info = grant(t, plan)
    series = charts.daily_series(groups["by_day"], days=CHART_DAYS, today=today)
    chart = charts.bar_chart(
        series, title=f"IPU-hours per day, last {CHART_DAYS} days", unit="IPU-hours", chart_id="usage-chart"
    )
    return render(
        request,
        "tenant_home.html",
        {
            "tenant": tenant,
            "grant": info,
            "chart": markup(chart),
            "series": series,
            "running": running,
            "queued": queued,
            "recent": recent,
            "by_workload": groups["by_workload"],
            "by_machine_type": groups["by_machine_type"],
        },
        user=user,
    )


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(
    request: Request,
    db: DbDep,
    user: ReaderUser,
    state: Annotated[str | None, Query(pattern="^(queued|running|succeeded|failed|cancelled)$")] = None,
    after: Annotated[str | None, Query(max_length=100, pattern=CURSOR_PATTERN)] = None,
) -> Response:
    limit = 50
    scope = user.principal.scope
    with db.read() as s:
        rows = job_service.list_jobs(session=s, scope=scope, after=after, limit=limit + 1, state=state)
        items = _job_views(s, rows[:limit], scope)
    more = rows[limit - 1].id if len(rows) > limit else None
    return render(
        request, "jobs.html", {"jobs": items, "state": state, "more": more, "states": _STATES}, user=user
    )


_STATES = ("queued", "running", "succeeded", "failed", "cancelled")


def _catalogue() -> list[dict[str, Any]]:
    return [w.to_dict() for w in emulator.catalogue()]


def _submit_context(
    values: dict[str, str],
    errors: dict[str, str],
    estimate: dict[str, Any] | None,
    own: list[dict[str, Any]] | None = None,
    live_sessions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "values": values,
        "errors": errors,
        "estimate": estimate,
        "catalogue": _catalogue(),
        "own_models": own or [],
        "live_sessions": live_sessions or [],
        "ipu_choices": forms.IPU_CHOICES,
        "idempotency": values.get("idempotency") or secrets.token_urlsafe(16),
    }


DEFAULTS = {"model": "resnet50", "task": "train", "precision": "fp16", "ipus": "auto"}


@router.get("/jobs/new", response_class=HTMLResponse)
def submit_page(
    request: Request,
    db: DbDep,
    user: ReaderUser,
    model: Annotated[str | None, Query(max_length=100)] = None,
    session: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    given = {k: v for k, v in (("model", model), ("session", session)) if v}
    values = forms.job_values(given, DEFAULTS)
    context = _submit_context(values, {}, None, _own(db, user), _live_sessions(db, user))
    return render(request, "submit.html", context, user=user)


def _own(db: DbDep, user: sessions.DashSession) -> list[dict[str, Any]]:
    """The tenant's own models for the form's workload list (an admin has none)."""
    return [] if user.tenant_id is None else model_pages.submit_choices(db, user.tenant_id)


def _live_sessions(db: DbDep, user: sessions.DashSession) -> list[dict[str, Any]]:
    """The tenant's sessions a job can be sent to (starting or active), for the form's session list."""
    if user.tenant_id is None:
        return []
    with db.read() as s:
        rows = session_service.list_sessions(session=s, scope=OneTenant(user.tenant_id), after=None, limit=50)
        return [
            {
                "id": r.id,
                "label": f"{r.name or r.id}: {r.ipus} IPU{'s' if r.ipus != 1 else ''}"
                f"{'' if r.machine == 'any' else f' of {r.machine}'} ({r.state})",
            }
            for r in rows
            if r.state in ("starting", "active")
        ]


def run_estimate(
    db: DbDep, settings: SettingsDep, user: sessions.DashSession, spec: JobSpec
) -> tuple[dict[str, Any], int]:
    """The API's dry run, with what it would leave of the grant and whether the plan allows its
    run time (a tenant's; an admin has neither); a refusal becomes a message."""
    try:
        with db.read() as s:
            # The plan's rates and types, as the API's estimate and admission use them.
            offers = None
            if user.tenant_id is not None:
                plan_name = tenant_service.get_tenant(session=s, tenant_id=user.tenant_id).plan_name
                offers = rate_service.plan_offers(
                    session=s, plan_name=plan_name, preemptible=spec.preemptible
                )
            # A copy, as a plain dict: the page adds what it shows besides the estimate.
            out: dict[str, Any] = dict(
                estimates.estimate(
                    session=s,
                    workload=spec.workload,
                    ipus=spec.ipus,
                    machine=spec.machine,
                    settings=settings,
                    offers=offers,
                    tenant_id=user.tenant_id,
                    serve=list(DEFAULT_SERVE_BATCHES) if spec.workload.task == "infer" else None,
                    prefer=spec.prefer,
                )
            )
            _add_serve_chart(out)
            if user.tenant_id is None:
                return out | {"sram_bytes_per_ipu": _sram_bytes(out, spec)}, 200
            t = tenant_service.get_tenant(session=s, tenant_id=user.tenant_id)
            remaining = hours(remaining_ipu_ms(t))
            if out.get("fits") and out.get("ipus"):
                out["runtime_limit"] = job_service.runtime_limit(
                    session=s,
                    tenant_id=t.id,
                    workload=spec.workload,
                    ipus=int(out["ipus"]),
                    machine=out.get("machine") or spec.machine,
                    max_runtime_s=spec.max_runtime_s,
                )
    except DomainError as exc:
        return {"fits": False, "error": exc.detail}, exc.status
    out["remaining_ipu_hours"] = remaining
    out["sram_bytes_per_ipu"] = _sram_bytes(out, spec)
    return out, 200


def _add_serve_chart(out: dict[str, Any]) -> None:
    """An inference estimate's serving rows as a latency-throughput plot drawn here (charts.py)."""
    rows = [r for r in out.get("serve") or () if r["fits"]]
    served = out.get("serve_plan")
    if not rows or not served:
        return
    ipus = served["ipus"]
    chart = charts.latency_throughput_chart(
        [(r["batch_size"], r["throughput"], r["latency_ms"]) for r in rows],
        title=f"Serving: latency against throughput on a replica of {ipus} IPU{'s' if ipus != 1 else ''}",
        chart_id="serve-chart",
    )
    out["serve_chart"] = markup(chart)


def _sram_bytes(out: dict[str, Any], spec: JobSpec) -> int:
    # The type it was estimated on: the one named, or (for `any`) the one it would finish first on.
    kind = out.get("machine") or (spec.machine if spec.machine not in (None, "any") else None)
    return emulator.MACHINES[MachineType(kind or emulation.DEFAULT_MACHINE)].sram_bytes


@router.post("/jobs/new", response_class=HTMLResponse)
def submit(request: Request, db: DbDep, settings: SettingsDep, user: User, form: Form) -> Response:
    action = form.get("action", "submit")
    if action not in ("preview", "submit"):
        raise InvalidRequest("action must be preview or submit.", field="action")
    # A preview is the API's dry run (POST /estimates, `read`); a submission POST /jobs (`submit`).
    user.principal.require("read" if action == "preview" else "submit")
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    values = forms.job_values(form)
    idempotency = form.get("idempotency", "")
    if idempotency and not IDEMPOTENCY.fullmatch(idempotency):
        raise InvalidRequest("The form's idempotency token is not one this site made; reload the page.")
    values["idempotency"] = idempotency
    parsed, spec = forms.parse_job(values)
    own = _own(db, user)
    live = _live_sessions(db, user)
    if spec is None:
        context = _submit_context(values, parsed.errors, None, own, live)
        return render(request, "submit.html", context, status_code=422)
    if action == "preview":
        est, status = run_estimate(db, settings, user, spec)
        context = _submit_context(values, {}, est, own, live)
        return render(request, "submit.html", context, status_code=status, user=user)
    if user.tenant_id is None:
        raise Forbidden("Admin keys have no tenant; submit with a tenant's key.")
    try:
        job_id = _submit(
            db, str(user.tenant_id), spec, values["idempotency"] or None, user.principal.member_id
        )
    except DomainError as exc:
        context = _submit_context(values, {"form": exc.detail}, None, own, live)
        return render(request, "submit.html", context, status_code=exc.status, user=user)
    bus.wake_scheduler("submit")
    sessions.flash(user, f"Job {spec.name} submitted.")
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


def _submit(
    db: DbDep, tenant_id: str, spec: JobSpec, idempotency_key: str | None, member_id: str | None
) -> str:
    # The form carries a key made when it was shown: a double click or a resent form is one job.
    key = f"dashboard-{idempotency_key}" if idempotency_key else None
    for attempt in range(2):
        try:
            with db.write() as s:
                result = job_service.submit_job(
                    session=s,
                    tenant_id=tenant_id,
                    spec=spec,
                    idempotency_key=key,
                    # The member signed in, as the API records the key's member: its `notify` mail goes
                    # to them.
                    member_id=member_id,
                    render=lambda job: job_out(job).model_dump(mode="json"),
                )
                return result.job.id
        except job_service.IdempotencyRace:
            if attempt:
                raise
    raise AssertionError("unreachable")


@router.post("/jobs/estimate", response_class=HTMLResponse)
def estimate_fragment(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    user: ReaderUser,
    form: Form,
    x_csrf_token: Annotated[str | None, Header(max_length=100)] = None,
) -> Response:
    """The estimate panel alone, for the page's script to swap in as the form changes."""
    sessions.check_csrf(request, x_csrf_token or form.get("csrf"), user.csrf)
    parsed, spec = forms.parse_job(forms.job_values(form))
    if spec is None:
        est: dict[str, Any] = {
            "fits": False,
            "error": "; ".join(f"{k}: {v}" for k, v in parsed.errors.items()),
        }
        status = 422
    else:
        est, status = run_estimate(db, settings, user, spec)
    # A refusal is still the panel the page shows (submit.js swaps in a 422's body too).
    return render(request, "_estimate.html", {"estimate": est}, status_code=status, user=user)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: JobId, db: DbDep, user: ReaderUser) -> Response:
    scope = user.principal.scope
    with db.read() as s:
        view = job_view(job_view_service.get_job_read(session=s, job_id=job_id, scope=scope))
        events = job_service.job_events(session=s, job_id=job_id, after=0, limit=5000)
        tail = [
            {"id": e.id, "at": e.at, "kind": e.kind, "message": e.message, "attempt": e.attempt}
            for e in events[-LOG_TAIL:]
        ]
    last_id = events[-1].id if events else 0
    return render(
        request,
        "job.html",
        {"job": view, "events": tail, "last_id": last_id, "final": view.state in FINAL_JOB_STATES},
        user=user,
    )


@router.get("/jobs/{job_id}/events")
def job_events(
    job_id: JobId,
    runtime: RuntimeDep,
    user: ReaderUser,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
    last_event_id: LastEventId = None,
) -> Response:
    """The job's live events for the page's EventSource (the cookie session, not a bearer key).

    The stream ends within a few seconds once the session is signed out, its key revoked or its
    tenant suspended, as the API's does."""
    scope = user.principal.scope
    db = runtime.db
    with db.read() as s:
        job_service.get_job(session=s, job_id=job_id, scope=scope)
    if last_event_id is not None:
        after = max(after, int(last_event_id))
    stream = job_event_stream(
        runtime, job_id, after, scope=scope, standing=session_standing(db, user), facts=_live_facts
    )
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def session_standing(db: DbDep, user: sessions.DashSession) -> Standing:
    """A stream's reader is still signed in, with a key that still grants what it did."""
    signed_out = {
        "type": "/problems/unauthorized",
        "title": "Signed out",
        "status": 401,
        "detail": "This session was signed out.",
    }

    def denial() -> dict[str, Any] | None:
        if not sessions.exists(user.store, user.token):
            return signed_out
        return key_denial(db, user.principal.key_id)

    async def check() -> dict[str, Any] | None:
        return await to_thread.run_sync(denial)

    return check


@router.post("/jobs/{job_id}/cancel")
@retry_conflicts
def cancel(request: Request, job_id: JobId, db: DbDep, user: SubmitterUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        job = job_service.request_cancel(session=s, job_id=job_id, scope=user.principal.scope)
        state = job.state
    bus.publish(bus.job_channel(job_id), "cancel")
    bus.wake_scheduler("cancel")
    sessions.flash(
        user, "Job cancelled." if state == "cancelled" else "Cancel requested; the job stops shortly."
    )
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/resume")
def resume(request: Request, job_id: JobId, db: DbDep, user: SubmitterUser, form: Form) -> Response:
    """Resume a job its time limit stopped, from its last checkpoint (POST /api/v1/jobs/{id}/resume)."""
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        job_service.resume_job(session=s, job_id=job_id, scope=user.principal.scope)
    bus.wake_scheduler("resume")
    sessions.flash(user, "Job resumed from its last checkpoint; it is queued.")
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


@router.get("/usage.csv")
def usage_export(db: DbDep, user: TenantReader) -> Response:
    with db.read() as s:
        groups = usage_service.breakdowns(session=s, scope=user.principal.scope)
    rows = [dict(r, tenant_id=user.tenant_id) for r in groups["by_job"]]
    body = usage_csv(rows, ["tenant_id", "job_id", "name", "workload", "partition_size", "ipu_hours"])
    return Response(
        body, media_type="text/csv", headers={"Content-Disposition": 'attachment; filename="usage.csv"'}
    )
