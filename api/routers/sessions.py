"""Sessions: hold a partition, run jobs in it at once, end it (scheduler/services/sessions/)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response

from api.deps import ClockDep, DbDep, Reader, Submitter
from api.schemas import CursorParam, Page, SessionOut, decode_cursor, encode_cursor
from scheduler import bus
from scheduler.clock import Clock
from scheduler.db import retry_conflicts
from scheduler.errors import Forbidden
from scheduler.jobspec import SessionChange, SessionSpec
from scheduler.models import IpuSession
from scheduler.services import sessions as session_service

router = APIRouter(prefix="/api/v1", tags=["sessions"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]


def _out(s: Any, row: IpuSession, clock: Clock) -> SessionOut:
    return SessionOut.model_validate(session_service.session_answer(session=s, row=row, clock=clock))


@router.post("/sessions", status_code=202, response_model=SessionOut, summary="Start a session")
def start_session(
    spec: SessionSpec, principal: Submitter, db: DbDep, clock: ClockDep, response: Response
) -> SessionOut:
    if principal.tenant_id is None:
        raise Forbidden("Admin keys have no tenant; start a session with a tenant's key.")
    with db.write() as s:
        row = session_service.start_session(
            session=s, tenant_id=principal.tenant_id, spec=spec, member_id=principal.member_id
        )
        out = _out(s, row, clock)
    bus.wake_scheduler("session")
    response.headers["Location"] = f"/api/v1/sessions/{out.id}"
    return out


@router.get("/sessions", response_model=Page[SessionOut], summary="List the caller's sessions, newest first")
def list_sessions(
    principal: Reader,
    db: DbDep,
    clock: ClockDep,
    cursor: CursorParam = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    state: Literal["starting", "active", "ended"] | None = None,
) -> Page[SessionOut]:
    after = decode_cursor(cursor)
    with db.read() as s:
        rows = session_service.list_sessions(
            session=s, scope=principal.scope, after=after, limit=limit + 1, state=state
        )
        items = [_out(s, r, clock) for r in rows[:limit]]
    return Page[SessionOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


@router.get("/sessions/{session_id}", response_model=SessionOut, summary="A session, its jobs and time left")
def get_session(session_id: SessionId, principal: Reader, db: DbDep, clock: ClockDep) -> SessionOut:
    with db.read() as s:
        row = session_service.get_session(session=s, session_id=session_id, scope=principal.scope)
        return _out(s, row, clock)


@router.patch(
    "/sessions/{session_id}",
    response_model=SessionOut,
    summary="Give a session more time or another idle timeout",
    description="Both are totals in cluster seconds. The added time is reserved from the grant (403 when it "
    "cannot be); the maximum duration never shrinks (422) nor passes the plan's ceiling (409); an ended "
    "session is 409.",
)
@retry_conflicts
def change_session(
    session_id: SessionId, change: SessionChange, principal: Submitter, db: DbDep, clock: ClockDep
) -> SessionOut:
    with db.write() as s:
        row = session_service.change_session(
            session=s,
            session_id=session_id,
            scope=principal.scope,
            max_duration_s=change.max_duration_s,
            idle_timeout_s=change.idle_timeout_s,
        )
        out = _out(s, row, clock)
    # A queued session's new length moves the scheduler's reservations; an active one's, its sweep.
    bus.wake_scheduler("session")
    return out


@router.delete("/sessions/{session_id}", response_model=SessionOut, summary="End a session")
@retry_conflicts
def end_session(session_id: SessionId, principal: Submitter, db: DbDep, clock: ClockDep) -> SessionOut:
    with db.write() as s:
        row = session_service.end_session(
            session=s, session_id=session_id, scope=principal.scope, clock=clock
        )
        out = _out(s, row, clock)
    bus.wake_scheduler("session")
    return out
