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
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

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
    Tenant,
    utcnow,
)
from scheduler.services import fleet, metering
from scheduler.services.clock import db_now
from scheduler.services.job_state import add_event, finalize_job

TASK_NAME = "ipucloud.run_attempt"


def place(
    *,
    session: Session,
    job: Job,
    partition: Partition,
    queue: str,
) -> Attempt:
    """Record attempt N of `job` on `partition` and its outbox message, in the caller's transaction."""
    return place_many(session=session, placements=[(job, partition, queue)])[0]


def place_many(*, session: Session, placements: Sequence[tuple[Job, Partition, str]]) -> list[Attempt]:
    """`place` for many jobs at once: one flush for all the attempts, so a scheduling pass that starts
    a thousand jobs costs a few batched statements rather than a few per job."""
    if not placements:
        return []
    now = utcnow()
    placed = []
    for job, partition, _ in placements:
        job.attempts += 1
        placed.append(
            Attempt(
                job_id=job.id,
                tenant_id=job.tenant_id,
                number=job.attempts,
                state=AttemptState.PLACED,
                epoch=0,
                partition_pk=partition.pk,
                size=partition.size,
                machine_type=partition.machine_type,
                placed_at=now,
            )
        )
    session.add_all(placed)
    session.flush()
    for attempt, (job, partition, queue) in zip(placed, placements, strict=True):
        session.add(
            OutboxMessage(
                attempt_id=attempt.id,
                queue=queue,
                payload={"attempt_id": attempt.id, "epoch": 0, "job_id": job.id},
                created_at=now,
            )
        )
        job.updated_at = now
        add_event(
            session,
            job.id,
            "state",
            f"placed on partition {partition.name} ({partition.size} x {partition.machine_type}: "
            f"{_ipu_range(partition.ipu_ids)})",
            attempt=attempt.number,
            data={"partition": partition.name, "ipus": partition.ipu_ids, "attempt": attempt.number},
            at=now,
        )
    return placed


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
    job_id = session.execute(select(Attempt.job_id).where(Attempt.id == attempt_id)).scalar_one_or_none()
    if job_id is None:
        return None
    # The job's row first, as a cancel takes it (job, then the placed attempt): a take that locked
    # the attempt first and then wrote the job would deadlock with a concurrent cancel. Holding it
    # also makes the "is it still wanted" check below exact.
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update())
    now = db_now(session)
    won = session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id, Attempt.state == AttemptState.PLACED, Attempt.epoch == epoch)
        .values(
            state=AttemptState.RUNNING,
            epoch=epoch + 1,
            worker=worker[:200],
            started_at=now,
            lease_expires_at=now + timedelta(seconds=lease_s),
        )
    ).rowcount
    if won != 1:
        return None
    session.execute(update(OutboxMessage).where(OutboxMessage.attempt_id == attempt_id).values(acked_at=now))
    attempt = session.get(Attempt, attempt_id, populate_existing=True)
    assert attempt is not None
    job = session.get(Job, attempt.job_id, populate_existing=True)
    partition = session.get(Partition, attempt.partition_pk)
    assert job is not None and partition is not None
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


def _fenced(session: Session, attempt_id: int, epoch: int, now: datetime) -> Attempt | None:
    """The attempt, locked, if `epoch` still holds a current lease on it; else None."""
    attempt = session.execute(
        select(Attempt)
        .where(
            Attempt.id == attempt_id,
            Attempt.epoch == epoch,
            Attempt.state == AttemptState.RUNNING,
            Attempt.lease_expires_at >= now,
        )
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    return attempt


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
    attempt = _fenced(session, attempt_id, epoch, now)
    if attempt is None:
        return Directive.FENCED
    job = session.get(Job, attempt.job_id, populate_existing=True)
    assert job is not None
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
    attempt = _fenced(session, attempt_id, epoch, db_now(session))
    if attempt is None:
        return False
    job = session.get(Job, attempt.job_id, populate_existing=True)
    assert job is not None
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
    """Settle, free the partition, and move the job on. The caller has fenced the attempt."""
    now = utcnow()
    attempt.state = outcome
    attempt.ended_at = now
    attempt.end_reason = reason
    attempt.lease_expires_at = None
    billable = outcome not in PLATFORM_FAULT_STATES
    metering.settle(session=session, attempt=attempt, job=job, billable=billable, outcome=str(outcome))
    # Nobody needs the message any more: the reconciler must not publish it again.
    session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.attempt_id == attempt.id, OutboxMessage.acked_at.is_(None))
        .values(acked_at=now)
    )
    partition = session.get(Partition, attempt.partition_pk)
    assert partition is not None
    if partition.kind == "job":
        fleet.release_partition(session=session, partition=partition)
    if job.state in FINAL_JOB_STATES:
        # Only an attempt the reconciler ends for a job that already ended gets here: the job's
        # outcome was decided, and this attempt's end must not rewrite it. A refund above put the
        # refunded ticks back into the job's reservation; an ended job holds none.
        if job.reserved_ipu_ms:
            session.execute(
                update(Tenant)
                .where(Tenant.id == job.tenant_id)
                .values(reserved_ipu_ms=Tenant.reserved_ipu_ms - job.reserved_ipu_ms)
            )
            job.reserved_ipu_ms = 0
        return
    if outcome == AttemptState.SUCCEEDED:
        finalize_job(session=session, job=job, state=JobState.SUCCEEDED, reason=None)
    elif outcome == AttemptState.CANCELLED:
        finalize_job(session=session, job=job, state=JobState.CANCELLED, reason=reason or "cancelled by user")
    elif outcome in (AttemptState.FAILED, AttemptState.TIMED_OUT):
        finalize_job(session=session, job=job, state=JobState.FAILED, reason=reason)
    elif job.cancel_requested:
        finalize_job(session=session, job=job, state=JobState.CANCELLED, reason="cancelled by user")
    elif outcome != AttemptState.LOST or _lost_attempts(session, job.id) < max_attempts:
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
        finalize_job(
            session=session,
            job=job,
            state=JobState.FAILED,
            reason=f"gave up after {max_attempts} lost attempts; last: {reason or outcome}",
        )


def _lost_attempts(session: Session, job_id: str) -> int:
    return session.execute(
        select(func.count())
        .select_from(Attempt)
        .where(Attempt.job_id == job_id, Attempt.state == AttemptState.LOST)
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
