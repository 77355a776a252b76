"""An attempt's life: placed (partition held, outbox row), taken by a worker, heartbeats, end.

Workers change an attempt only through `take`, `heartbeat` and `finish`, each a compare-and-set
on (attempt id, state, epoch): `take` moves `placed` to `running` and bumps the epoch, and every
later write must carry that epoch and arrive while the lease is still current. A duplicate
delivery, a worker that was paused past its lease, or a second report of the same finish
therefore changes nothing.

Leases are measured on the database's clock (services.clock), never on the worker's: a lease is
written by one host and judged by another. A lease that ran out is over even before the reconciler
has noticed: a late heartbeat cannot revive it, so "expired" means the same thing to the worker,
the reconciler and the tests.

On PostgreSQL (READ COMMITTED) every worker write and the reconciler lock the attempt row first
(`SELECT ... FOR UPDATE`, re-evaluated after a lock wait), so take, heartbeat, finish, cancel and
expiry of one attempt are serialised and each sees the others' result. On SQLite every write
transaction holds the database lock from BEGIN, which serialises them all.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from scheduler.db import insert_returning_keys
from scheduler.models import (
    FINAL_JOB_STATES,
    PLATFORM_FAULT_STATES,
    Attempt,
    AttemptState,
    Job,
    JobEvent,
    JobState,
    OutboxMessage,
    Partition,
    utcnow,
)
from scheduler.services import fleet, metering, rates
from scheduler.services.clock import db_now
from scheduler.services.job_state import add_event, finalize_job

TASK_NAME = "ipucloud.run_attempt"


class PlacedPartition(Protocol):
    """What placing an attempt reads of its partition (a Partition, or one just inserted)."""

    @property
    def pk(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def machine_type(self) -> str: ...
    @property
    def ipu_ids(self) -> list[str]: ...


def place(
    *,
    session: Session,
    job: Job,
    partition: PlacedPartition,
    queue: str,
) -> int:
    """Record attempt N of `job` on `partition` and its outbox message, in the caller's transaction;
    returns the attempt's id."""
    return place_many(session=session, placements=[(job, partition, queue)])[0]


def place_many(*, session: Session, placements: Sequence[tuple[Job, PlacedPartition, str]]) -> list[int]:
    """`place` for many jobs at once: the attempts, their outbox messages and their events each in
    one batched statement, so a scheduling pass that starts a thousand jobs costs a few statements
    rather than a few per job. Returns the attempts' ids, in order."""
    if not placements:
        return []
    now = utcnow()
    rows = []
    for job, partition, _ in placements:
        job.attempts += 1
        job.updated_at = now
        rows.append(
            {
                "job_id": job.id,
                "tenant_id": job.tenant_id,
                "number": job.attempts,
                "state": AttemptState.PLACED,
                "epoch": 0,
                "partition_pk": partition.pk,
                "size": partition.size,
                "machine_type": partition.machine_type,
                "placed_at": now,
                # The type's rate for this job, and the wait (rates.py); an `any` job takes on
                # the size and run time of the type it was placed on.
                **rates.attempt_fields(job, partition.machine_type, now),
            }
        )
    ids = insert_returning_keys(session, Attempt.__table__, rows)
    session.execute(
        insert(OutboxMessage.__table__),
        [
            {
                "attempt_id": attempt_id,
                "queue": queue,
                "payload": {"attempt_id": attempt_id, "epoch": 0, "job_id": job.id},
                "created_at": now,
                "publish_count": 0,
            }
            for attempt_id, (job, _, queue) in zip(ids, placements, strict=True)
        ],
    )
    session.execute(
        insert(JobEvent.__table__),
        [
            {
                "job_id": job.id,
                "attempt": job.attempts,
                "kind": "state",
                "message": (
                    f"placed on partition {partition.name} ({partition.size} x {partition.machine_type}: "
                    f"{_ipu_range(partition.ipu_ids)})"
                ),
                "data": {"partition": partition.name, "ipus": partition.ipu_ids, "attempt": job.attempts},
                "at": now,
            }
            for job, partition, _ in placements
        ],
    )
    return ids


def _ipu_range(ipus: list[str]) -> str:
    return ipus[0] if len(ipus) == 1 else f"{ipus[0]} .. {ipus[-1]}"


@dataclass(frozen=True)
class TakenAttempt:
    attempt_id: int
    epoch: int
    number: int
    job_id: str
    tenant_id: str
    spec: dict[str, Any]
    partition: str
    partition_ipus: list[str]
    partition_size: int
    partition_gcds: int
    machine_type: str
    max_runtime_s: float | None
    cluster_s: float


def take(
    *, session: Session, attempt_id: int, epoch: int, worker: str, lease_s: float
) -> TakenAttempt | None:
    """Compare-and-set `placed` -> `running`. None if someone else has it or it is no longer wanted."""
    # The job's row first, as a cancel takes it (job, then the placed attempt): a take that locked
    # the attempt first and then wrote the job would deadlock with a concurrent cancel. Holding it
    # also makes the "is it still wanted" check below exact.
    job = session.execute(
        select(Job)
        .where(Job.id == select(Attempt.job_id).where(Attempt.id == attempt_id).scalar_subquery())
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if job is None:
        return None
    now = db_now(session)
    attempt = session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id, Attempt.state == AttemptState.PLACED, Attempt.epoch == epoch)
        .values(
            state=AttemptState.RUNNING,
            epoch=epoch + 1,
            worker=worker[:200],
            started_at=now,
            lease_expires_at=now + timedelta(seconds=lease_s),
        )
        .returning(Attempt)
        .execution_options(populate_existing=True, synchronize_session=False)
    ).scalar_one_or_none()
    if attempt is None:
        return None
    with session.no_autoflush:
        session.execute(
            update(OutboxMessage).where(OutboxMessage.attempt_id == attempt_id).values(acked_at=now)
        )
        partition = session.get(Partition, attempt.partition_pk)
    assert partition is not None
    if job.state in FINAL_JOB_STATES or job.cancel_requested:
        # A cancel that raced the placement (or the take itself): do not start what nobody wants.
        end_attempt(
            session=session,
            attempt=attempt,
            job=job,
            outcome=AttemptState.CANCELLED,
            reason="cancelled before it started" if job.cancel_requested else f"job already {job.state}",
            max_attempts=1,
        )
        return None
    job.state = JobState.RUNNING
    job.started_at = job.started_at or now
    job.updated_at = now
    add_event(
        session,
        job.id,
        "state",
        f"running on {worker} (attempt {attempt.number})",
        attempt=attempt.number,
        data={"state": "running", "worker": worker},
        at=now,
    )
    return TakenAttempt(
        attempt_id=attempt.id,
        epoch=attempt.epoch,
        number=attempt.number,
        job_id=job.id,
        tenant_id=job.tenant_id,
        spec=job.spec,
        partition=partition.name,
        partition_ipus=list(partition.ipu_ids),
        partition_size=partition.size,
        partition_gcds=partition.gcds,
        machine_type=partition.machine_type,
        max_runtime_s=job.max_runtime_s,
        cluster_s=attempt.cluster_s,
    )


class Directive(enum.StrEnum):
    CONTINUE = "continue"
    CANCEL = "cancel"  # the user cancelled
    TIMEOUT = "timeout"  # max_runtime_s reached
    QUOTA = "quota"  # the tenant's grant is used up
    FENCED = "fenced"  # the lease is gone: stop and write nothing more


@dataclass(frozen=True)
class LogLine:
    kind: str
    message: str
    data: dict[str, Any] | None = None
    at: datetime | None = None


def _fenced(session: Session, attempt_id: int, epoch: int, now: datetime) -> tuple[Attempt, Job] | None:
    """The attempt (locked) and its job, if `epoch` still holds a current lease on it; else None."""
    row = session.execute(
        select(Attempt, Job)
        .join(Job, Job.id == Attempt.job_id)
        .where(
            Attempt.id == attempt_id,
            Attempt.epoch == epoch,
            Attempt.state == AttemptState.RUNNING,
            Attempt.lease_expires_at >= now,
        )
        .with_for_update(of=Attempt)
        .execution_options(populate_existing=True)
    ).first()
    return None if row is None else (row[0], row[1])


def heartbeat(
    *,
    session: Session,
    attempt_id: int,
    epoch: int,
    seq: int,
    cluster_s: float,
    lease_s: float,
    progress: dict[str, Any] | None = None,
    logs: list[LogLine] | None = None,
) -> Directive:
    """Extend the lease, bill the time run so far, record progress; say whether to go on."""
    now = db_now(session)
    fenced = _fenced(session, attempt_id, epoch, now)
    if fenced is None:
        return Directive.FENCED
    attempt, job = fenced
    attempt.lease_expires_at = now + timedelta(seconds=lease_s)
    attempt.cluster_s = max(attempt.cluster_s, cluster_s)
    if progress is not None:
        attempt.progress = progress
    for line in logs or ():
        session.add(
            JobEvent(
                job_id=job.id,
                attempt=attempt.number,
                kind=line.kind,
                message=line.message[:2000],
                data=line.data,
                at=line.at or now,
            )
        )
    tick = metering.meter_tick(
        session=session, attempt=attempt, job=job, seq=seq, cluster_s=attempt.cluster_s
    )
    if job.cancel_requested:
        return Directive.CANCEL
    if tick.quota_exhausted:
        return Directive.QUOTA
    if job.max_runtime_s is not None and attempt.cluster_s >= job.max_runtime_s:
        return Directive.TIMEOUT
    return Directive.CONTINUE


def finish(
    *,
    session: Session,
    attempt_id: int,
    epoch: int,
    outcome: AttemptState,
    cluster_s: float,
    reason: str | None = None,
    progress: dict[str, Any] | None = None,
    logs: list[LogLine] | None = None,
    max_attempts: int = 3,
) -> bool:
    """The worker's last word on an attempt. False (and nothing written) if its lease is gone."""
    fenced = _fenced(session, attempt_id, epoch, db_now(session))
    if fenced is None:
        return False
    attempt, job = fenced
    attempt.cluster_s = max(attempt.cluster_s, cluster_s)
    if progress is not None:
        attempt.progress = progress
    for line in logs or ():
        session.add(
            JobEvent(
                job_id=job.id,
                attempt=attempt.number,
                kind=line.kind,
                message=line.message[:2000],
                data=line.data,
                at=line.at or utcnow(),
            )
        )
    end_attempt(
        session=session, attempt=attempt, job=job, outcome=outcome, reason=reason, max_attempts=max_attempts
    )
    return True


def end_attempt(
    *,
    session: Session,
    attempt: Attempt,
    job: Job,
    outcome: AttemptState,
    reason: str | None,
    max_attempts: int,
) -> None:
    """Settle, free the partition, and move the job on. The caller has fenced the attempt.

    The settle comes last: it moves the tenant's counters, and every attempt of a tenant ends
    through that row's lock, so it is held only for the last statement and the commit.
    """
    now = utcnow()
    attempt.state = outcome
    attempt.ended_at = now
    attempt.end_reason = reason
    attempt.lease_expires_at = None
    billable = outcome not in PLATFORM_FAULT_STATES
    # The attempt's and the job's changes are written together, by the settle's flush.
    with session.no_autoflush:
        # Nobody needs the message any more: the reconciler must not publish it again.
        session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.attempt_id == attempt.id, OutboxMessage.acked_at.is_(None))
            .values(acked_at=now)
        )
        fleet.release_job_partition(session=session, partition_pk=attempt.partition_pk)
        # Only an attempt the reconciler ends for a job that already ended finds the job final:
        # its outcome was decided, and this attempt's end must not rewrite it.
        if job.state not in FINAL_JOB_STATES:
            _move_job_on(session, job, attempt, outcome, reason, max_attempts, now)
    # Last, since it moves the tenant's counters (and an ended job gives back what it reserves).
    metering.settle(
        session=session,
        attempt=attempt,
        job=job,
        billable=billable,
        outcome=str(outcome),
        job_ends=job.state in FINAL_JOB_STATES,
    )


def _move_job_on(
    session: Session,
    job: Job,
    attempt: Attempt,
    outcome: AttemptState,
    reason: str | None,
    max_attempts: int,
    now: datetime,
) -> None:
    def end(state: JobState, why: str | None) -> None:
        finalize_job(session=session, job=job, state=state, reason=why, release=False)

    if outcome == AttemptState.SUCCEEDED:
        end(JobState.SUCCEEDED, None)
    elif outcome == AttemptState.CANCELLED:
        end(JobState.CANCELLED, reason or "cancelled by user")
    elif outcome in (AttemptState.FAILED, AttemptState.TIMED_OUT):
        end(JobState.FAILED, reason)
    elif job.cancel_requested:
        end(JobState.CANCELLED, "cancelled by user")
    elif outcome != AttemptState.LOST or _lost_attempts(session, job.id, this=attempt.id) + 1 < max_attempts:
        # Only lost attempts count against the retry limit: a handed-back or preempted attempt
        # is the platform making room, not a sign that the job crashes its worker.
        job.state = JobState.QUEUED
        job.updated_at = now
        add_event(
            session,
            job.id,
            "state",
            f"requeued: attempt {attempt.number} {outcome}" + (f" ({reason})" if reason else ""),
            attempt=attempt.number,
            data={"state": "queued", "requeued": True, "reason": reason},
            at=now,
        )
    else:
        end(JobState.FAILED, f"gave up after {max_attempts} lost attempts; last: {reason or outcome}")


def _lost_attempts(session: Session, job_id: str, this: int) -> int:
    """The job's earlier lost attempts (this one's new state is not written yet)."""
    return session.execute(
        select(func.count())
        .select_from(Attempt)
        .where(Attempt.job_id == job_id, Attempt.id != this, Attempt.state == AttemptState.LOST)
    ).scalar_one()


def cancel_placed(*, session: Session, attempt: Attempt, job: Job) -> bool:
    """Cancel an attempt no worker has taken yet (a CAS on `placed`, so it races safely with take)."""
    locked = session.execute(
        select(Attempt)
        .where(Attempt.id == attempt.id, Attempt.state == AttemptState.PLACED)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if locked is None:
        return False
    end_attempt(
        session=session,
        attempt=locked,
        job=job,
        outcome=AttemptState.CANCELLED,
        reason="cancelled by user before it started",
        max_attempts=1,
    )
    return True


def expire_leases(
    *, session: Session, max_attempts: int, now: datetime | None = None, limit: int = 500
) -> list[Attempt]:
    """Reconciler: running attempts whose lease ran out are lost (never billed); jobs go again.

    SKIP LOCKED: an attempt whose row a worker holds right now is heartbeating or finishing, and
    is looked at again on the next pass rather than waited for.
    """
    now = now or db_now(session)
    stale = list(
        session.execute(
            select(Attempt)
            .where(Attempt.state == AttemptState.RUNNING, Attempt.lease_expires_at < now)
            .order_by(Attempt.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    for attempt in stale:
        job = session.get(Job, attempt.job_id, populate_existing=True)
        assert job is not None
        end_attempt(
            session=session,
            attempt=attempt,
            job=job,
            outcome=AttemptState.LOST,
            reason=f"lease expired on {attempt.worker}",
            max_attempts=max_attempts,
        )
    return stale
