"""Reading sessions: by id or page, with the clocks and bill `GET /sessions/{id}` shows
(`SessionView`), and the answer every route gives (`session_answer`, `SessionJson`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.clock import Clock
from scheduler.errors import Conflict, NotFound
from scheduler.models import (
    LIVE_ATTEMPT_STATES,
    Attempt,
    IpuSession,
    Job,
    JobEvent,
    Partition,
    SessionState,
)
from scheduler.services.clock import db_now
from scheduler.services.sessions.start import SESSION_TASK
from scheduler.services.tenancy.scope import Scope, restrict, sees


def lock_unended(session: Session, session_id: str, scope: Scope) -> IpuSession:
    """The scope's session, locked until commit; 404 before any lock, 409 once it has ended."""
    get_session(session=session, session_id=session_id, scope=scope)
    row = session.execute(
        select(IpuSession)
        .where(IpuSession.id == session_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    if row.state == SessionState.ENDED:
        raise Conflict(f"Session {session_id} already ended ({row.ended_reason}).", state=row.state)
    return row


def get_session(*, session: Session, session_id: str, scope: Scope) -> IpuSession:
    """A session by id; another tenant's is indistinguishable from a missing one."""
    row = session.get(IpuSession, session_id)
    if row is None or not sees(scope, row.tenant_id):
        raise NotFound(f"No session {session_id}.")
    return row


def list_sessions(
    *, session: Session, scope: Scope, after: str | None, limit: int, state: str | None = None
) -> list[IpuSession]:
    """The scope's sessions, newest first; `after` is the id of the last one of the previous page."""
    stmt = restrict(
        select(IpuSession).order_by(IpuSession.id.desc()).limit(limit), IpuSession.tenant_id, scope
    )
    if state is not None:
        stmt = stmt.where(IpuSession.state == state)
    if after is not None:
        stmt = stmt.where(IpuSession.id < after)
    return list(session.execute(stmt).scalars())


@dataclass(frozen=True)
class SessionView:
    """What `GET /sessions/{id}` shows beyond the row: all cluster seconds, as of `now`."""

    row: IpuSession
    partition: Partition | None
    held_s: float  # cluster seconds held so far
    time_left_s: float | None  # until the maximum duration
    idle_s: float | None  # cluster seconds with no job (None: a job runs)
    idle_left_s: float | None  # until the idle timeout (None: a job runs)
    ends_at: datetime | None  # wall clock of the earliest end, if nothing changes
    busy_gcds: int
    billed_ipu_ms: int
    jobs: list[Job]
    events: list[JobEvent]


def view(*, session: Session, row: IpuSession, clock: Clock, now: datetime, jobs: int = 50) -> SessionView:
    partition = session.get(Partition, row.partition_pk) if row.partition_pk is not None else None
    holding = session.get(Attempt, row.attempt_id) if row.attempt_id is not None else None
    session_jobs = list(
        session.execute(
            select(Job)
            .where(
                Job.session_id == row.id,
                Job.tenant_id == row.tenant_id,
                Job.task != SESSION_TASK,
            )
            .order_by(Job.id.desc())
            .limit(jobs)
        ).scalars()
    )
    events = list(
        session.execute(
            select(JobEvent).where(JobEvent.job_id == row.job_id).order_by(JobEvent.id).limit(200)
        ).scalars()
    )
    billed = int(holding.metered_ipu_ms) if holding is not None else 0
    if row.state != SessionState.ACTIVE or row.started_at is None:
        held = holding.cluster_s if holding is not None else 0.0
        return SessionView(row, partition, held, None, None, None, None, 0, billed, session_jobs, events)
    busy, idle_since = activity_by_partition(session, [row]).get(row.partition_pk or 0, (0, row.started_at))
    held = min(float(row.max_duration_s), clock.cluster_since(row.started_at, now))
    left = max(0.0, row.max_duration_s - held)
    max_end = clock.wall_after(row.started_at, row.max_duration_s)
    if busy:
        return SessionView(
            row, partition, held, left, None, None, max_end, busy, billed, session_jobs, events
        )
    idle = max(0.0, clock.cluster_since(idle_since, now))
    idle_end = clock.wall_after(idle_since, row.idle_timeout_s)
    return SessionView(
        row,
        partition,
        held,
        left,
        idle,
        max(0.0, row.idle_timeout_s - idle),
        min(max_end, idle_end),
        0,
        billed,
        session_jobs,
        events,
    )


def activity_by_partition(session: Session, rows: Sequence[IpuSession]) -> dict[int, tuple[int, datetime]]:
    """Per session partition: its live jobs' attempts, and since when it has had none (its start,
    or its last job's end)."""
    pks = [r.partition_pk for r in rows if r.partition_pk is not None]
    if not pks:
        return {}
    live = dict(
        session.execute(
            select(Attempt.partition_pk, func.count())
            .where(Attempt.partition_pk.in_(pks), Attempt.gcd >= 0, Attempt.state.in_(LIVE_ATTEMPT_STATES))
            .group_by(Attempt.partition_pk)
        )
        .tuples()
        .all()
    )
    last_end = dict(
        session.execute(
            select(Attempt.partition_pk, func.max(Attempt.ended_at))
            .where(Attempt.partition_pk.in_(pks), Attempt.gcd >= 0, Attempt.ended_at.is_not(None))
            .group_by(Attempt.partition_pk)
        )
        .tuples()
        .all()
    )
    out: dict[int, tuple[int, datetime]] = {}
    for r in rows:
        if r.partition_pk is None or r.started_at is None:
            continue
        # `idle_since` is a floor: the start, or later when a missed warning was given its time (sweep).
        floor = max(r.started_at, r.idle_since or r.started_at)
        since = max(floor, last_end.get(r.partition_pk) or floor)
        out[r.partition_pk] = (int(live.get(r.partition_pk, 0)), since)
    return out


class SessionPartitionView(TypedDict):
    """The partition a session holds."""

    id: str
    size: int
    ipus: list[str]
    tenant: str | None
    machine: str


class SessionJobView(TypedDict):
    """A job run in a session."""

    id: str
    name: str
    state: str
    ipus: int


class SessionEventView(TypedDict):
    """A line of a session's history."""

    at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None


class SessionJson(TypedDict):
    """A session as the API shows it (`SessionOut`): its row, partition, clocks, bill, jobs and events."""

    id: str
    name: str | None
    state: str
    ended_reason: str | None
    ended_detail: str | None
    ipus: int
    machine: str
    gcds: int
    max_duration_s: int
    idle_timeout_s: int
    partition: SessionPartitionView | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    held_s: float
    time_left_s: float | None
    idle_s: float | None
    idle_left_s: float | None
    ends_at: datetime | None
    busy_gcds: int
    billed_ipu_hours: float
    jobs: list[SessionJobView]
    events: list[SessionEventView]


def session_answer(*, session: Session, row: IpuSession, clock: Clock) -> SessionJson:
    """A session as every reader is answered it (start, list, show, change, end), as of the
    database's clock."""
    return session_json(view(session=session, row=row, clock=clock, now=db_now(session)))


def session_json(v: SessionView) -> SessionJson:
    """A session as the API shows it."""
    r, p = v.row, v.partition
    return {
        "id": r.id,
        "name": r.name or None,
        "state": r.state,
        "ended_reason": r.ended_reason,
        "ended_detail": r.ended_detail,
        "ipus": r.ipus,
        "machine": r.machine,
        "gcds": r.gcds,
        "max_duration_s": r.max_duration_s,
        "idle_timeout_s": r.idle_timeout_s,
        "partition": None
        if p is None
        else {
            "id": p.name,
            "size": p.size,
            "ipus": list(p.ipu_ids),
            "tenant": p.tenant_id,
            "machine": p.machine_type,
        },
        "created_at": r.created_at,
        "started_at": r.started_at,
        "ended_at": r.ended_at,
        "held_s": round(v.held_s, 3),
        "time_left_s": None if v.time_left_s is None else round(v.time_left_s, 3),
        "idle_s": None if v.idle_s is None else round(v.idle_s, 3),
        "idle_left_s": None if v.idle_left_s is None else round(v.idle_left_s, 3),
        "ends_at": v.ends_at,
        "busy_gcds": v.busy_gcds,
        "billed_ipu_hours": billing.ipu_hours(v.billed_ipu_ms),
        "jobs": [{"id": j.id, "name": j.name, "state": j.state, "ipus": j.ipus} for j in v.jobs],
        "events": [{"at": e.at, "kind": e.kind, "message": e.message, "data": e.data} for e in v.events],
    }
