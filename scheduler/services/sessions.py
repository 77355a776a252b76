"""Sessions: a partition held for one tenant, on which its jobs start at once (docs/sessions.md).

A session queues like a job because it is one: its *holder job* (task `session`, hidden from the
job list) goes through admission (its whole `max_duration_s` reserved from the grant at the plan's
rate, as a job's predicted cost is) and the same scheduling passes, fair share and limits as any job.
When the scheduler places it (`activate_many`, in the pass's transaction), no host agent is asked to
run anything: the partition becomes kind `session`, and a *holding attempt* on graph compile
domain -1 is written `running`. That attempt is metered like any other (`att:<id>:tick:<n>`, then
one settle), so the session is billed per held IPU-second, busy or idle, with the ledger's exactness.

The session's own jobs (`"session": id`) are admitted at the session's GCD size with rate 0 (the
session pays for the partition) and placed in the submission's own transaction on a free GCD
(0 .. gcds-1), so they never wait for a scheduling pass or behind anyone's queue; a job that finds
every GCD busy waits for one like a job in a reserved partition (same partition name), and only
behind the session's own jobs.

`sweep` runs in every scheduler iteration (the leader's, fenced): it bills the holding attempts,
warns `warning_s` cluster seconds before an idle timeout or the maximum duration, and ends sessions
whose time is up. Ending stops the session's running jobs, settles the holding attempt and frees the
partition. All durations are cluster seconds, converted to the wall clock by the caller's `Clock`
(`scheduler/clock.py`).

Locks are taken in the order sessions, jobs, attempts, tenants. The scheduling pass alone comes to a
session with its holder job already locked; it skips a session row another transaction holds
(`activate_many`) rather than wait for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from scheduler import billing, dispatch_now
from scheduler.clock import Clock
from scheduler.errors import Conflict, InvalidRequest, LimitExceeded, NotFound, QuotaExceeded, TenantInactive
from scheduler.ids import new_id
from scheduler.jobspec import SessionSpec
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    IpuSession,
    Job,
    JobEvent,
    JobState,
    OutboxMessage,
    Partition,
    Plan,
    SessionState,
    Tenant,
    utcnow,
)
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.capacity import fleet
from scheduler.services.clock import db_now
from scheduler.services.tenancy import metering, notifications, rates
from scheduler.services.tenancy.scope import Scope, restrict, sees

SESSION_TASK = "session"  # the holder job's task: not a workload, never handed to an agent
HOLD_GCD = -1  # the holding attempt's GCD: beside the session's jobs' 0.., under the same unique index

# Why a session ended (`ended_reason`).
OWNER = "owner"
MAX_DURATION = "max_duration"
IDLE_TIMEOUT = "idle_timeout"
QUOTA = "quota"
FAULT = "fault"


# Starting ------------------------------------------------------------------------------------------


def start_session(
    *, session: Session, tenant_id: str, spec: SessionSpec, member_id: str | None = None
) -> IpuSession:
    """Admit a session: its holder job queued with its whole duration reserved, and its row."""
    plan, tenant = session.execute(
        select(Plan, Tenant).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == tenant_id)
    ).one()
    max_duration = spec.max_duration_s or int(plan.max_session_s)
    if max_duration > plan.max_session_s:
        raise LimitExceeded(
            f"The {plan.name} plan holds a session for at most {plan.max_session_s} s; "
            f"this one asks for {max_duration} s.",
            limit="max_session_s",
        )
    idle = spec.idle_timeout_s or int(plan.idle_timeout_s)
    pods = fleet.pods_by_type(session=session, max_age_s=fleet.PODS_CACHE_S)
    offered = rates.offers(plan=plan, machine=spec.machine, present=pods, what="sessions")
    offered.check_size(None, spec.ipus, "this session asks for")
    options: dict[str, dict[str, float]] = {}
    refusals: list[str] = []
    for kind in offered.kinds:
        try:
            fleet.check_fleet_can_ever_host(session=session, size=spec.ipus, machine_type=kind, pods=pods)
        except Exception as exc:  # a DomainError saying why this type cannot
            refusals.append(f"{kind}: {getattr(exc, 'detail', exc)}")
            continue
        options[kind] = offered.option(kind, spec.ipus, float(max_duration))
    if not options:
        raise InvalidRequest(
            "No partition of this size can ever be held: " + "; ".join(refusals), field="ipus"
        )
    reserve = max(billing.option_cost_ipu_ms(o) for o in options.values())
    now = utcnow()
    # The tenant's row first, so the reservation is judged on exact figures (as job admission does).
    locked = session.execute(
        select(Tenant)
        .where(Tenant.id == tenant_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    if locked.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {locked.status}.")
    if locked.expires_at is not None and locked.expires_at <= now:
        raise TenantInactive(f"The trial of {tenant.name} ended on {locked.expires_at:%Y-%m-%d}.")
    left = billing.left_ipu_ms(locked)
    if reserve > left:
        raise QuotaExceeded(
            f"Holding {spec.ipus} IPUs for {max_duration} s costs up to {billing.ipu_hours(reserve):.3f} "
            f"IPU-hours but only {billing.ipu_hours(max(0, left)):.3f} of the grant are left; ask for a "
            "shorter max_duration_s.",
            cost_ipu_hours=billing.ipu_hours(reserve),
            remaining_ipu_hours=billing.ipu_hours(max(0, left)),
        )
    locked.reserved_ipu_ms += reserve
    sid = new_id("ses")
    fastest = next(iter(options))
    job = Job(
        id=new_id("job"),
        tenant_id=tenant_id,
        name=f"session {sid}",
        submitted_by=member_id,  # whom its mail goes to
        spec={"session": sid, "ipus": spec.ipus, "machine": spec.machine or "any"},
        model=SESSION_TASK,
        task=SESSION_TASK,
        ipus=spec.ipus,
        ipus_requested=str(spec.ipus),
        machine_type=spec.machine if spec.machine not in (None, "any") else None,
        options=options,
        prefer="time",
        partition_name=None,
        priority=0,
        max_runtime_s=max_duration,
        predicted_runtime_s=options[fastest]["predicted_runtime_s"],
        reserved_ipu_ms=reserve,
        state=JobState.QUEUED,
        attempts=0,
        cancel_requested=False,
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    session.flush()
    row = IpuSession(
        id=sid,
        tenant_id=tenant_id,
        name=spec.name or "",
        state=SessionState.STARTING,
        ipus=spec.ipus,
        machine=spec.machine or "any",
        gcds=spec.gcds,
        max_duration_s=max_duration,
        idle_timeout_s=idle,
        job_id=job.id,
        created_at=now,
    )
    session.add(row)
    add_event(
        session,
        job.id,
        "state",
        f"session starting: waiting for {spec.ipus} IPUs ({spec.machine or 'any'}); up to {max_duration} s, "
        f"ends after {idle} s idle; {billing.ipu_hours(reserve):.4f} IPU-hours reserved",
        data={"state": SessionState.STARTING},
        at=now,
    )
    session.flush()
    return row


def activate_many(
    *, session: Session, starts: Sequence[tuple[Job, attempts.PlacedPartition]], now: datetime
) -> list[str]:
    """The scheduler placed these holder jobs: hold their partitions. Called in the pass's
    transaction with the jobs locked; returns the sessions made active."""
    if not starts:
        return []
    # The pass locked the holder jobs first, against this module's order (sessions, then jobs) that
    # changing or ending a session follows: a session row locked by one of those is skipped, not
    # waited for, so the two can never deadlock. Its job stays queued for the next pass, which
    # frees the partition made for it (scheduler/loop.py).
    by_job = {
        s.job_id: s
        for s in session.execute(
            select(IpuSession)
            .where(IpuSession.job_id.in_([j.id for j, _ in starts]))
            .order_by(IpuSession.id)
            .with_for_update(skip_locked=True)
        ).scalars()
    }
    active: list[str] = []
    for job, partition in starts:
        row = by_job.get(job.id)
        if row is None or row.state != SessionState.STARTING:
            continue
        # A session partition is not a job's (released by the session's end, not its jobs' ends),
        # nor an orphan, and runs one job per GCD.
        session.execute(
            update(Partition).where(Partition.pk == partition.pk).values(kind="session", gcds=row.gcds)
        )
        job.attempts += 1
        job.state = JobState.RUNNING
        job.started_at = now
        job.updated_at = now
        job.wait = None
        fields = rates.attempt_fields(job, partition.machine_type, now)
        attempt = Attempt(
            job_id=job.id,
            tenant_id=job.tenant_id,
            number=job.attempts,
            state=AttemptState.RUNNING,
            epoch=1,
            partition_pk=partition.pk,
            gcd=HOLD_GCD,
            size=partition.size,
            machine_type=partition.machine_type,
            placed_at=now,
            started_at=now,
            worker=None,
            **fields,
        )
        session.add(attempt)
        session.flush()
        row.state = SessionState.ACTIVE
        row.started_at = now
        row.idle_since = now
        row.partition_pk = partition.pk
        row.attempt_id = attempt.id
        add_event(
            session,
            job.id,
            "state",
            f"session active on partition {partition.name} ({partition.size} x {partition.machine_type}"
            + (f", {row.gcds} graph compile domains" if row.gcds > 1 else "")
            + ")",
            attempt=attempt.number,
            data={"state": SessionState.ACTIVE, "partition": partition.name, "ipus": list(partition.ipu_ids)},
            at=now,
        )
        active.append(row.id)
    return active


# Reading -------------------------------------------------------------------------------------------


def _lock_unended(session: Session, session_id: str, scope: Scope) -> IpuSession:
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
    busy, idle_since = _activity(session, [row]).get(row.partition_pk or 0, (0, row.started_at))
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


def _activity(session: Session, rows: Sequence[IpuSession]) -> dict[int, tuple[int, datetime]]:
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


# Changing ----------------------------------------------------------------------------------------------


def change_session(
    *,
    session: Session,
    session_id: str,
    scope: Scope,
    max_duration_s: int | None = None,
    idle_timeout_s: int | None = None,
) -> IpuSession:
    """Give a starting or active session a longer maximum duration, or another idle timeout.

    The added time is reserved from the grant as the start reserved the rest (at the rate of the
    type it holds, or of its dearest option while it queues), so a session never holds more than its
    grant can pay for. A duration is never shortened: the part of the reservation already billed is
    not the part that would be given back, and ending the session is the way to stop sooner. The
    sweep's warnings follow the new deadline by themselves (`warned_for` names the old one)."""
    row = _lock_unended(session, session_id, scope)
    job = session.execute(
        select(Job).where(Job.id == row.job_id).with_for_update().execution_options(populate_existing=True)
    ).scalar_one()
    plan, tenant = session.execute(
        select(Plan, Tenant).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == row.tenant_id)
    ).one()
    changes: list[str] = []
    extra = 0
    new_max = max_duration_s if max_duration_s is not None else row.max_duration_s
    if new_max < row.max_duration_s:
        raise InvalidRequest(
            f"Session {session_id} may hold its partition for {row.max_duration_s} s; a maximum duration "
            "can only grow. End the session to stop sooner.",
            field="max_duration_s",
        )
    # Only a longer duration is held to the ceiling: an admin may have lowered it since the start.
    if new_max > row.max_duration_s and new_max > plan.max_session_s:
        raise LimitExceeded(
            f"The {plan.name} plan holds a session for at most {plan.max_session_s} s; "
            f"this change asks for {new_max} s.",
            limit="max_session_s",
        )
    if new_max > row.max_duration_s:
        added = new_max - row.max_duration_s
        options = {kind: dict(o) for kind, o in (job.options or {}).items()}
        hold = session.get(Attempt, row.attempt_id) if row.attempt_id is not None else None
        if hold is not None:
            # Holding: the added seconds cost the rate of the type it holds.
            extra = billing.charged_ipu_ms(row.ipus, float(new_max), hold.rate) - billing.charged_ipu_ms(
                row.ipus, float(row.max_duration_s), hold.rate
            )
            for option in options.values():
                option["predicted_runtime_s"] = float(new_max)
        else:
            # Queued: what the whole new duration costs on its dearest option, less what is reserved.
            for option in options.values():
                option["predicted_runtime_s"] = float(new_max)
            full = max((billing.option_cost_ipu_ms(o) for o in options.values()), default=0)
            extra = max(0, full - int(job.reserved_ipu_ms))
        locked = session.execute(
            select(Tenant)
            .where(Tenant.id == row.tenant_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalar_one()
        if locked.status != "active":
            raise TenantInactive(f"Tenant {tenant.name} is {locked.status}.")
        left = billing.left_ipu_ms(locked)
        if extra > left:
            raise QuotaExceeded(
                f"Holding {row.ipus} IPUs {added} s longer costs up to {billing.ipu_hours(extra):.3f} "
                f"IPU-hours but only {billing.ipu_hours(max(0, left)):.3f} of the grant are left.",
                cost_ipu_hours=billing.ipu_hours(extra),
                remaining_ipu_hours=billing.ipu_hours(max(0, left)),
            )
        locked.reserved_ipu_ms += extra
        job.reserved_ipu_ms += extra
        job.options = options
        # The scheduler plans the rest of the fleet around the holder's predicted end.
        job.max_runtime_s = new_max
        job.predicted_runtime_s = float(new_max)
        job.updated_at = utcnow()
        row.max_duration_s = new_max
        changes.append(
            f"maximum duration {new_max} s (+{added} s, {billing.ipu_hours(extra):.4f} IPU-hours reserved)"
        )
    if idle_timeout_s is not None and idle_timeout_s != row.idle_timeout_s:
        row.idle_timeout_s = idle_timeout_s
        changes.append(f"idle timeout {idle_timeout_s} s")
    if changes:
        add_event(
            session,
            row.job_id,
            "log",
            "session changed: " + "; ".join(changes),
            data={
                "max_duration_s": row.max_duration_s,
                "idle_timeout_s": row.idle_timeout_s,
                "reserved_ipu_hours": billing.ipu_hours(extra),
            },
        )
    session.flush()
    return row


# Jobs in a session -------------------------------------------------------------------------------------


def session_for_job(*, session: Session, tenant_id: str, session_id: str) -> tuple[IpuSession, Partition]:
    """The active session a job names and its partition, the session's row locked until commit (its
    jobs take its GCDs one at a time). Another tenant's session is not found."""
    row = session.execute(
        select(IpuSession)
        .where(IpuSession.id == session_id, IpuSession.tenant_id == tenant_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"No session {session_id}.")
    if row.state != SessionState.ACTIVE or row.partition_pk is None:
        raise Conflict(
            f"Session {session_id} is {row.state}"
            + (f" ({row.ended_reason})" if row.ended_reason else "")
            + ": jobs run only in an active session.",
            state=row.state,
        )
    partition = session.get(Partition, row.partition_pk)
    assert partition is not None
    return row, partition


def place_session_jobs(*, session: Session, jobs: Sequence[Job]) -> list[int]:
    """Place admitted session jobs on free GCDs of their sessions' partitions at once (the
    submission's transaction); a job that finds none free stays queued for the next. Returns the
    attempts placed."""
    by_partition: dict[str, list[Job]] = {}
    for job in jobs:
        if job.partition_name is not None:
            by_partition.setdefault(job.partition_name, []).append(job)
    placements: list[tuple[Job, attempts.PlacedPartition, str]] = []
    for name, waiting in by_partition.items():
        partition = fleet.get_live_partition(session=session, name=name)
        if partition is None or partition.kind != "session":
            continue
        free = attempts.free_gcds(session=session, partition_pk=partition.pk, gcds=partition.gcds)
        queue = dispatch_now.queue_for(partition.machine_type, partition.ipu_ids)
        placements.extend((job, partition, queue) for job in waiting[: len(free)])
    if not placements:
        return []
    ids = attempts.place_many(session=session, placements=placements)
    table = Job.__table__
    session.execute(
        update(table)
        .where(table.c.id.in_([j.id for j, _, _ in placements]))
        .values(attempts=table.c.attempts + 1)
    )
    # Sent by this process as it commits, not by the scheduler's next iteration: written published.
    session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.attempt_id.in_(ids))
        .values(published_at=utcnow(), publish_count=1)
        .execution_options(synchronize_session=False)
    )
    dispatch_now.publish_after_commit(
        session, [(attempt_id, 0, q) for attempt_id, (_, _, q) in zip(ids, placements, strict=True)]
    )
    return ids


# Ending ------------------------------------------------------------------------------------------------


def end_session(*, session: Session, session_id: str, scope: Scope, clock: Clock) -> IpuSession:
    """The owner ends a session: its running jobs are stopped, its hold billed up to now."""
    row = _lock_unended(session, session_id, scope)
    end_many(session=session, ends=[(row, OWNER, "ended by its owner")], now=clock.wall_now(), clock=clock)
    return row


def end_many(
    *, session: Session, ends: Sequence[tuple[IpuSession, str, str]], now: datetime, clock: Clock
) -> None:
    """End sessions (rows locked by the caller): `(session, reason, detail)` each."""
    for row, reason, detail in ends:
        job = session.execute(
            select(Job)
            .where(Job.id == row.job_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalar_one()
        if row.partition_pk is not None:
            # Its jobs first: stopped like a cancel, billed nothing (their rate is 0; the hold pays).
            live = list(
                session.execute(
                    select(Attempt.id).where(
                        Attempt.partition_pk == row.partition_pk,
                        Attempt.gcd >= 0,
                        Attempt.state.in_(LIVE_ATTEMPT_STATES),
                    )
                ).scalars()
            )
            attempts.stop_running(
                session=session,
                attempt_ids=live,
                outcome=AttemptState.CANCELLED,
                reason=f"session {row.id} ended: {detail}",
                max_attempts=1,
            )
            _fail_waiting_jobs(session, row, detail)
        holding = None
        if row.attempt_id is not None:
            holding = session.execute(
                select(Attempt)
                .where(Attempt.id == row.attempt_id)
                .with_for_update()
                .execution_options(populate_existing=True)
            ).scalar_one()
        if holding is not None and holding.state == AttemptState.RUNNING:
            assert row.started_at is not None
            held = min(float(row.max_duration_s), clock.cluster_since(row.started_at, now))
            holding.cluster_s = max(holding.cluster_s, held)
            # Back to a job partition for the moment of the end, so the attempt's end frees it as usual.
            session.execute(update(Partition).where(Partition.pk == row.partition_pk).values(kind="job"))
            attempts.end_attempts(
                session=session,
                endings=[attempts.Ending(holding, job, AttemptState.SUCCEEDED, f"session ended: {detail}")],
                max_attempts=1,
            )
        else:
            if row.partition_pk is not None:
                partition = session.get(Partition, row.partition_pk)
                if partition is not None:
                    fleet.release_partition(session=session, partition=partition)
            if job.state not in FINAL_JOB_STATES:
                job.cancel_requested = True
                finalize_job(
                    session=session, job=job, state=JobState.CANCELLED, reason=f"session ended: {detail}"
                )
        row.state = SessionState.ENDED
        row.ended_reason = reason
        row.ended_detail = detail[:1000]
        row.ended_at = now
        notifications.emit(
            session,
            tenant_id=row.tenant_id,
            type_="session.ended",
            key=row.id,
            data={
                "id": row.id,
                "reason": reason,
                "detail": detail[:1000],
                "url": f"/api/v1/sessions/{row.id}",
            },
            at=now,
        )
        add_event(
            session,
            row.job_id,
            "state",
            f"session ended: {detail}",
            data={"state": "ended", "reason": reason},
        )


def _fail_waiting_jobs(session: Session, row: IpuSession, detail: str) -> None:
    """Session jobs still queued for one of its GCDs will never run: cancel them."""
    partition = session.get(Partition, row.partition_pk)
    if partition is None:
        return
    waiting = list(
        session.execute(
            select(Job)
            .where(
                Job.partition_name == partition.name,
                Job.state == JobState.QUEUED,
                Job.tenant_id == row.tenant_id,
            )
            .with_for_update()
        ).scalars()
    )
    for job in waiting:
        job.cancel_requested = True
        finalize_job(
            session=session, job=job, state=JobState.CANCELLED, reason=f"session {row.id} ended: {detail}"
        )


# The scheduler's sweep ------------------------------------------------------------------------------------


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
    activity = _activity(session, rows)
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
            row.warned_for = deadline
            left = clock.cluster_since(now, deadline)
            why = "idle timeout" if reason == IDLE_TIMEOUT else "maximum duration"
            add_event(
                session,
                row.job_id,
                "warning",
                f"session ends in {left:.0f} s ({why})"
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
    activity = _activity(session, rows)
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
