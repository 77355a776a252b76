"""The scheduler's sweep of active sessions (the leader's fenced transaction): it bills the holds,
warns ahead of an idle timeout or the maximum duration, and ends the sessions whose time is up or
whose grant ran out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.clock import Clock
from scheduler.models import (
    Attempt,
    AttemptState,
    IpuSession,
    Job,
    SessionState,
)
from scheduler.services.batch.job_state import add_event
from scheduler.services.sessions.end import FAULT, IDLE_TIMEOUT, MAX_DURATION, QUOTA, end_many
from scheduler.services.sessions.start import SESSION_TASK
from scheduler.services.sessions.views import activity_by_partition
from scheduler.services.tenancy import metering, notifications


@dataclass
class SweepResult:
    warned: list[str]
    ended: list[tuple[str, str]]
    billed: int


def sweep(
    *,
    session: Session,
    now: datetime,
    clock: Clock,
    warning_s: float,
    meter_interval_s: float,
) -> SweepResult:
    """Bill, warn and end the active sessions (the scheduler leader's transaction)."""
    result = SweepResult([], [], 0)
    rows = list(
        session.execute(
            select(IpuSession)
            .where(IpuSession.state == SessionState.ACTIVE)
            .order_by(IpuSession.id)
            .with_for_update()
        ).scalars()
    )
    if not rows:
        return result
    activity = activity_by_partition(session, rows)
    holding = {
        a.id: a
        for a in session.execute(
            select(Attempt)
            .where(Attempt.id.in_([r.attempt_id for r in rows if r.attempt_id is not None]))
            .order_by(Attempt.id)
            .with_for_update()
        ).scalars()
    }
    reserved = dict(
        session.execute(select(Job.id, Job.reserved_ipu_ms).where(Job.id.in_([r.job_id for r in rows])))
        .tuples()
        .all()
    )
    ends: list[tuple[IpuSession, str, str]] = []
    ticks: list[metering.TickDue] = []
    by_attempt: dict[int, IpuSession] = {}
    for row in rows:
        assert row.started_at is not None and row.partition_pk is not None
        hold = holding.get(row.attempt_id or 0)
        if hold is None or hold.state != AttemptState.RUNNING:
            # The platform ended the hold (a machine under it failed): nothing is left to hold.
            ends.append((row, FAULT, f"its partition was lost ({hold.end_reason if hold else 'no hold'})"))
            continue
        deadline, reason = _deadline(row, activity, clock)
        if now >= deadline and reason == IDLE_TIMEOUT and warning_s > 0 and row.warned_for != deadline:
            # Its warning window passed with no sweep to announce it (the scheduler was down or had
            # no leader): culling now would end the owner's session unannounced. Move the floor of
            # its idle countdown so it ends `warning_s` from now, and warn as for any deadline.
            grace_end = now + clock.wall_delta(warning_s)
            row.idle_since = grace_end - clock.wall_delta(row.idle_timeout_s)
            activity[row.partition_pk] = (0, row.idle_since)
            deadline, reason = _deadline(row, activity, clock)
        if now >= deadline:
            what = (
                f"idle for {row.idle_timeout_s} s with no job"
                if reason == IDLE_TIMEOUT
                else f"reached its maximum duration of {row.max_duration_s} s"
            )
            ends.append((row, reason, what))
            continue
        if now >= deadline - clock.wall_delta(warning_s) and row.warned_for != deadline:
            _warn(session, row, deadline, reason, now, clock)
            result.warned.append(row.id)
        elapsed = (now - row.started_at).total_seconds()
        seq = int(elapsed // meter_interval_s)
        if seq > hold.ticks:
            held = min(float(row.max_duration_s), clock.to_cluster(elapsed))
            ticks.append(metering.TickDue(hold, seq, held, int(reserved.get(row.job_id, 0)), SESSION_TASK))
            by_attempt[hold.id] = row
    if ticks:
        exhausted = metering.meter_ticks(session=session, ticks=ticks)
        result.billed = len(ticks)
        for attempt_id in sorted(exhausted):
            ends.append((by_attempt[attempt_id], QUOTA, "the tenant's grant ran out"))
    if ends:
        end_many(session=session, ends=ends, now=now, clock=clock)
        result.ended = [(r.id, reason) for r, reason, _ in ends]
    return result


def _warn(
    session: Session, row: IpuSession, deadline: datetime, reason: str, now: datetime, clock: Clock
) -> None:
    """Tell the owner the session ends at ``deadline`` (for ``reason``): in its history and as a
    `session.ending_soon` event, once per deadline."""
    row.warned_for = deadline
    left = clock.cluster_since(now, deadline)
    why = "idle timeout" if reason == IDLE_TIMEOUT else "maximum duration"
    add_event(
        session,
        row.job_id,
        "warning",
        f"session ends in {left:.0f} s of {clock.name} ({why})"
        + ("; submit a job to keep it" if reason == IDLE_TIMEOUT else ""),
        data={"warning": reason, "ends_in_s": round(left, 3), "ends_at": deadline.isoformat()},
        at=now,
    )
    notifications.emit(
        session,
        tenant_id=row.tenant_id,
        type_="session.ending_soon",
        key=f"{row.id}:{deadline.isoformat()}",
        data={
            "id": row.id,
            "reason": reason,
            "ends_at": deadline.isoformat(),
            "ends_in_s": round(left, 3),
            "url": f"/api/v1/sessions/{row.id}",
        },
        at=now,
    )


def _deadline(
    row: IpuSession, activity: dict[int, tuple[int, datetime]], clock: Clock
) -> tuple[datetime, str]:
    """When an active session ends if nothing changes (wall clock), and why: its maximum duration, or
    its idle timeout while no job of it runs."""
    assert row.started_at is not None and row.partition_pk is not None
    deadline = clock.wall_after(row.started_at, row.max_duration_s)
    reason = MAX_DURATION
    busy, idle_since = activity.get(row.partition_pk, (0, row.started_at))
    if not busy:
        idle_end = clock.wall_after(idle_since, row.idle_timeout_s)
        if idle_end < deadline:
            deadline, reason = idle_end, IDLE_TIMEOUT
    return deadline, reason


def has_due(
    *, session: Session, now: datetime, clock: Clock, warning_s: float, meter_interval_s: float
) -> bool:
    """Whether `sweep` has anything to do now (read without locks): a meter tick, a warning or an end
    due. The scheduler asks this first, so that on SQLite its loop does not take the database's one
    write lock on every iteration while sessions merely run."""
    rows = list(session.execute(select(IpuSession).where(IpuSession.state == SessionState.ACTIVE)).scalars())
    if not rows:
        return False
    activity = activity_by_partition(session, rows)
    holds = {
        aid: (state, ticks)
        for aid, state, ticks in session.execute(
            select(Attempt.id, Attempt.state, Attempt.ticks).where(
                Attempt.id.in_([r.attempt_id for r in rows if r.attempt_id is not None])
            )
        ).tuples()
    }
    for row in rows:
        state, ticks = holds.get(row.attempt_id or 0, (None, 0))
        if state != AttemptState.RUNNING or row.started_at is None:
            return True
        deadline, _ = _deadline(row, activity, clock)
        if now >= deadline - clock.wall_delta(warning_s) and row.warned_for != deadline:
            return True
        if now >= deadline or int((now - row.started_at).total_seconds() // meter_interval_s) > ticks:
            return True
    return False
