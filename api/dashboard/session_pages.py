"""A tenant's sessions in the dashboard: the list with a form to start one, a session's page (its
partition, jobs, time left and idle countdown), extending it and ending it. The countdowns are drawn
on the server in cluster seconds; `static/session.js` counts them down between reloads at the cloud's
time scale."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from api.dashboard import forms, sessions
from api.dashboard.web import DashboardRoute, Form, ReaderUser, SubmitterUser, TenantSubmitter, render
from api.deps import ClockDep, DbDep
from api.views import job_view
from scheduler import bus
from scheduler.clock import Clock
from scheduler.errors import DomainError, Forbidden, NotFound, Unauthorized
from scheduler.jobspec import SessionChange, SessionSpec
from scheduler.services import sessions as session_service
from scheduler.services.batch import job_views as job_view_service
from scheduler.services.clock import db_now
from vipu.machine_types import MACHINE_TYPE_NAMES

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

SessionRef = Annotated[str, Path(min_length=1, max_length=64)]
START_FIELDS = ("ipus", "machine", "max_duration_s", "idle_timeout_s", "gcds", "name")


def _list(
    request: Request,
    db: DbDep,
    user: sessions.DashSession,
    clock: Clock,
    *,
    values: dict[str, str] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    scope = user.principal.scope
    with db.read() as s:
        now = db_now(s)
        rows = session_service.list_sessions(session=s, scope=scope, after=None, limit=100)
        views = [
            session_service.session_json(session_service.view(session=s, row=r, clock=clock, now=now))
            for r in rows
        ]
    context = {
        "sessions": views,
        "values": values or {},
        "error": error,
        "machines": MACHINE_TYPE_NAMES,
        "clock": clock,
    }
    return render(request, "sessions.html", context, status_code=status_code, user=user)


@router.get("/sessions", response_class=HTMLResponse)
def sessions_page(request: Request, db: DbDep, clock: ClockDep, user: ReaderUser) -> Response:
    return _list(request, db, user, clock)


def _spec(form: dict[str, str]) -> SessionSpec:
    body: dict[str, Any] = {}
    for name in START_FIELDS:
        raw = (form.get(name) or "").strip(forms.BLANKS)
        if not raw or (name == "machine" and raw == "any"):
            continue
        # ASCII digits only, as the API reads them (forms.whole_number): `str.isdigit` takes `²`, `①`
        # (a 500 from `int`) and Arabic-Indic digits; a value that is not a number stays text for the
        # strict model to refuse.
        number = None if name in ("machine", "name") else forms.whole_number(raw)
        body[name] = raw if number is None else number
    return SessionSpec.model_validate(body)


@router.post("/sessions", response_class=HTMLResponse)
def start(request: Request, db: DbDep, clock: ClockDep, user: TenantSubmitter, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    values = {k: form.get(k, "") for k in START_FIELDS}
    try:
        spec = _spec(form)
        with db.write() as s:
            row = session_service.start_session(
                session=s, tenant_id=str(user.tenant_id), spec=spec, member_id=user.principal.member_id
            )
            sid = row.id
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'session'}: {e['msg']}" for e in exc.errors())
        return _list(request, db, user, clock, values=values, error=detail, status_code=422)
    except DomainError as exc:
        if isinstance(exc, Unauthorized | Forbidden):
            raise
        return _list(request, db, user, clock, values=values, error=exc.detail, status_code=exc.status)
    bus.wake_scheduler("session")
    sessions.flash(user, f"Session {sid} started: it holds its IPUs as soon as the scheduler places it.")
    return RedirectResponse(f"/sessions/{sid}", status_code=303)


def _page(
    request: Request,
    db: DbDep,
    user: sessions.DashSession,
    session_id: str,
    clock: Clock,
    *,
    error: str | None = None,
    add_s: str = "3600",
    status_code: int = 200,
) -> Response:
    scope = user.principal.scope
    with db.read() as s:
        row = session_service.get_session(session=s, session_id=session_id, scope=scope)
        view = session_service.view(session=s, row=row, clock=clock, now=db_now(s))
        jobs = [job_view(r) for r in job_view_service.job_reads(session=s, jobs=view.jobs, scope=scope)]
        out = session_service.session_json(view)
    context = {"s": out, "jobs": jobs, "clock": clock, "error": error, "add_s": add_s}
    return render(request, "session.html", context, status_code=status_code, user=user)


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
def session_page(
    request: Request, session_id: SessionRef, db: DbDep, clock: ClockDep, user: ReaderUser
) -> Response:
    return _page(request, db, user, session_id, clock)


@router.post("/sessions/{session_id}/extend", response_class=HTMLResponse)
def extend(
    request: Request,
    session_id: SessionRef,
    db: DbDep,
    clock: ClockDep,
    user: SubmitterUser,
    form: Form,
) -> Response:
    """`PATCH /api/v1/sessions/{id}` with the maximum duration `add_s` cluster seconds longer."""
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    raw = (form.get("add_s") or "").strip(forms.BLANKS)
    scope = user.principal.scope
    error: tuple[str, int] | None = None
    try:
        add = forms.whole_number(raw)
        if add is None or add < 1:
            raise ValueError(raw)
        with db.write() as s:
            row = session_service.get_session(session=s, session_id=session_id, scope=scope)
            change = SessionChange.model_validate({"max_duration_s": row.max_duration_s + add})
            session_service.change_session(
                session=s, session_id=session_id, scope=scope, max_duration_s=change.max_duration_s
            )
    except ValidationError as exc:
        error = ("; ".join(e["msg"] for e in exc.errors()), 422)
    except ValueError:  # not a whole number of seconds
        error = ("the time to add is a whole number of cluster seconds, 1 or more", 422)
    except DomainError as exc:
        if isinstance(exc, Unauthorized | Forbidden | NotFound):
            raise
        error = (exc.detail, exc.status)
    if error is not None:
        detail, status = error
        return _page(
            request,
            db,
            user,
            session_id,
            clock,
            error=detail,
            add_s=raw[:20],
            status_code=status,
        )
    bus.wake_scheduler("session")
    sessions.flash(user, f"Session {session_id} may now hold its IPUs {raw} s longer.")
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)


@router.post("/sessions/{session_id}/end", response_class=HTMLResponse)
def end(
    request: Request,
    session_id: SessionRef,
    db: DbDep,
    clock: ClockDep,
    user: SubmitterUser,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        session_service.end_session(
            session=s,
            session_id=session_id,
            scope=user.principal.scope,
            clock=clock,
        )
    bus.wake_scheduler("session")
    sessions.flash(user, f"Session {session_id} ended.")
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)
