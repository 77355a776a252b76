"""Dashboard pages anyone may see: the landing page, sign in and out, the trial application."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.dashboard import (
    admin_pages,
    array_pages,
    endpoint_pages,
    forms,
    mail_pages,
    model_pages,
    session_pages,
    sessions,
    tenant_pages,
    webhook_pages,
)
from api.dashboard.web import DashboardRoute, Form, OptionalUser, User, render, safe_next
from api.deps import DbDep, SettingsDep, rate_limits
from api.ratelimit import check_rate
from scheduler.errors import Conflict, InvalidRequest, RateLimited, TenantInactive, Unauthorized
from scheduler.services.capacity import fleet
from scheduler.services.tenancy import keys, trials
from vipu.machine_types import LAYOUTS
from vipu.topology import Fleet

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

LOGIN_RATE = "30/minute"


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


@router.get("/", response_class=HTMLResponse)
def home(request: Request, db: DbDep, user: OptionalUser) -> Response:
    if user is not None:
        if user.is_admin:
            return RedirectResponse("/admin/fleet", status_code=303)
        user.principal.require("read")  # the tenant's home is its usage and jobs: GET /usage, /jobs
        return tenant_pages.tenant_home(request, db, user)
    with db.read() as s:
        shape = fleet.fleet_shape(session=s)
    return render(
        request,
        "home.html",
        {
            "units": units_phrase(shape),
            "ipus": shape.ipus,
            "types": sorted({str(t) for t in shape.machine_types}),
        },
    )


def units_phrase(shape: Fleet) -> str:
    """The fleet's units counted by kind, largest kind first: "4 IPU-POD64s, 1 IPU-POD16 and 2 IPU
    servers" (a POD16 or a server is no POD64 rack, and `pods` counts every unit)."""
    counts: dict[str, int] = {}
    for unit in shape.units:
        if unit is not None:
            counts[unit.layout] = counts.get(unit.layout, 0) + 1
    order = sorted(counts, key=lambda name: -LAYOUTS[name].ipus)
    parts = [f"{counts[name]:,} {LAYOUTS[name].label}{'' if counts[name] == 1 else 's'}" for name in order]
    if not parts:
        return "no IPUs yet"
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _anonymous_form(
    request: Request, template: str, context: dict[str, object], *, status_code: int = 200
) -> Response:
    token, new = sessions.form_token(request)
    response = render(request, template, {**context, "form_token": token}, status_code=status_code)
    if new:
        sessions.set_form_cookie(response, request, token)
    response.headers["Cache-Control"] = "no-store"
    return response


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, user: OptionalUser, next: str | None = None) -> Response:
    if user is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return _anonymous_form(request, "login.html", {"next": safe_next(next), "error": None})


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, db: DbDep, settings: SettingsDep, form: Form) -> Response:
    sessions.check_csrf(request, form.get("form_token"), request.cookies.get(sessions.FORM_COOKIE, ""))
    next_path = safe_next(form.get("next"))
    key = form.get("api_key", "").strip()
    try:
        check_rate(rate_limits(request), f"dashboard-login:{_client(request)}", LOGIN_RATE)
        if not key:
            raise Unauthorized("Paste your API key (it starts with ipuc_).")
        with db.read() as s:
            principal = keys.authenticate(session=s, secret=settings.secret(), key=key)
        keys.check_standing(principal)
    except (Unauthorized, RateLimited, TenantInactive) as exc:
        return _anonymous_form(
            request, "login.html", {"next": next_path, "error": exc.detail}, status_code=exc.status
        )
    # The session keeps who signed in (the key's id), never the key itself.
    token, _ = sessions.create(sessions.store_of(request), principal)
    response = RedirectResponse(next_path, status_code=303)
    sessions.set_session_cookie(response, request, token)
    return response


@router.post("/logout")
def logout(request: Request, user: User, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    sessions.destroy(user.store, user.token)
    response = RedirectResponse("/login", status_code=303)
    sessions.clear_session_cookie(response, request)
    return response


@router.get("/trial", response_class=HTMLResponse)
def trial_page(request: Request) -> Response:
    return _anonymous_form(
        request, "trial.html", {"values": {"category": "individual"}, "errors": {}, "done": None}
    )


@router.post("/trial", response_class=HTMLResponse)
def trial_apply(request: Request, db: DbDep, settings: SettingsDep, form: Form) -> Response:
    sessions.check_csrf(request, form.get("form_token"), request.cookies.get(sessions.FORM_COOKIE, ""))
    parsed, trial = forms.parse_trial(form)
    if trial is None:
        return _anonymous_form(
            request,
            "trial.html",
            {"values": parsed.values, "errors": parsed.errors, "done": None},
            status_code=422,
        )
    try:
        check_rate(rate_limits(request), f"trial:{_client(request)}", settings.trial_rate_limit)
        with db.write() as s:
            application = trials.submit_application(
                session=s,
                name=trial.name,
                email=str(trial.email),
                organisation=trial.organisation,
                category=trial.category,
                intended_use=trial.intended_use,
            )
            done = {"id": application.id, "email": application.email}
    except (InvalidRequest, Conflict, RateLimited) as exc:
        errors = {str(exc.extra.get("field", "form")): exc.detail}
        return _anonymous_form(
            request,
            "trial.html",
            {"values": parsed.values, "errors": errors, "done": None},
            status_code=exc.status,
        )
    return _anonymous_form(request, "trial.html", {"values": {}, "errors": {}, "done": done})


router.include_router(tenant_pages.router)
router.include_router(model_pages.router)
router.include_router(session_pages.router)
router.include_router(array_pages.router)
router.include_router(endpoint_pages.router)
router.include_router(admin_pages.router)
router.include_router(mail_pages.router)
router.include_router(webhook_pages.router)
