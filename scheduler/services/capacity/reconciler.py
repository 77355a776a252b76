"""The reconciler: what the scheduler's leader repairs on every pass, and the record of it.

Workers, brokers and networks fail; the database stays the truth, and this pass makes the rest of
the world agree with it again:

- a host agent whose lease ran out loses every attempt it ran: each is ended as lost (never
  billed), its partition freed, and its job queued again, up to `max_attempts` lost attempts
  (services.attempts.lapse_agents); so is a running attempt no live agent holds;
- an outbox message published but not taken in time is published again, with a backoff so a
  queue that is merely deep is not flooded with copies;
- a job partition with no live attempt is freed, and so is any IPU still assigned to a released
  partition;
- a live attempt of a job that has already ended is ended, and a queued job whose cancel raced
  an attempt's end is cancelled.

Every repair is logged and written to `reconciler_actions` in the leader's fenced transaction, so
the counts in the API's `/metrics` are exact and survive restarts of any process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from scheduler.db import changed
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    Agent,
    AgentState,
    Attempt,
    AttemptState,
    IpuAssignment,
    Job,
    JobState,
    LeaderLease,
    OutboxMessage,
    Partition,
    ReconcilerAction,
)
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.capacity import agents, fleet
from scheduler.services.clock import db_now

log = logging.getLogger("ipucloud.reconciler")

LEASE_EXPIRED = "lease_expired"
OUTBOX_REPUBLISHED = "outbox_republished"
ORPHAN_PARTITION_FREED = "orphan_partition_freed"
ATTEMPT_OF_ENDED_JOB_ENDED = "attempt_of_ended_job_ended"
CANCEL_COMPLETED = "cancel_completed"
JOB_REQUEUED = "job_requeued"
ACTIONS = (
    LEASE_EXPIRED,
    OUTBOX_REPUBLISHED,
    ORPHAN_PARTITION_FREED,
    ATTEMPT_OF_ENDED_JOB_ENDED,
    CANCEL_COMPLETED,
    JOB_REQUEUED,
)

# Seconds between the reconciler's sweeps across all running work (reconcile(sweep=True)).
SWEEP_S = 5.0
# A partition is created in the same transaction as its first attempt, so one without a live
# attempt is orphaned at once; the grace only keeps the sweep away from rows being written.
ORPHAN_GRACE_S = 5.0
# The n-th republish of one message waits outbox_retry_s * 2^(n-1), at most this many times.
MAX_BACKOFF_FACTOR = 8


@dataclass
class Repairs:
    """What one pass did, by action (each entry describes one repaired object)."""

    done: dict[str, list[str]] = field(default_factory=lambda: {a: [] for a in ACTIONS})

    def count(self, action: str) -> int:
        return len(self.done[action])

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.done.values())


def _record(
    session: Session,
    repairs: Repairs,
    action: str,
    *,
    epoch: int,
    at: datetime,
    detail: str,
    job_id: str | None = None,
    attempt_id: int | None = None,
    partition_pk: int | None = None,
) -> None:
    log.warning("reconciler: %s: %s", action.replace("_", " "), detail)
    repairs.done[action].append(detail)
    session.add(
        ReconcilerAction(
            at=at,
            action=action,
            job_id=job_id,
            attempt_id=attempt_id,
            partition_pk=partition_pk,
            leader_epoch=epoch,
            detail=detail[:500],
        )
    )


def reconcile(
    *,
    session: Session,
    leader_epoch: int,
    max_attempts: int,
    outbox_retry_s: float,
    limit: int = 500,
    queue_depth: Callable[[str], int | None] = lambda _queue: None,
    sweep: bool = True,
) -> Repairs:
    """One reconciliation pass in the caller's (fenced) transaction.

    `queue_depth(queue)` says how many messages wait in a broker queue (None: unknown); the caller
    asks the broker, this module only reads the database.

    Lapsed agents and untaken messages are looked at on every pass: both are indexed probes that find
    nothing on a healthy cloud. The `sweep`s look across every running job for states only a race
    or a bug leaves behind, which costs a scan of the running work; the loop runs them every
    few seconds (`SWEEP_S`), not on every pass.
    """
    now = db_now(session)
    repairs = Repairs()
    _expire_leases(session, repairs, now, leader_epoch, max_attempts, limit, sweep)
    if sweep:
        _end_attempts_of_ended_jobs(session, repairs, now, leader_epoch, limit)
        _complete_cancels(session, repairs, now, leader_epoch, limit)
    _republish_outbox(session, repairs, now, leader_epoch, outbox_retry_s, limit, queue_depth)
    if sweep:
        _free_orphans(session, repairs, now, leader_epoch, limit)
    return repairs


def _expire_leases(
    session: Session, repairs: Repairs, now: datetime, epoch: int, max_attempts: int, limit: int, sweep: bool
) -> None:
    ended = [
        (a, f"attempt {a.number} of {a.job_id} lost with host agent {lapse.name} (epoch {lapse.epoch})")
        for lapse in attempts.lapse_agents(session=session, max_attempts=max_attempts, now=now)
        for a in lapse.ended
    ]
    unheld = agents.unheld_running_attempts(session=session, limit=limit) if sweep else []
    ended += [
        (a, f"attempt {a.number} of {a.job_id} lost: no live host agent held it (last {a.worker})")
        for a in attempts.stop_running(
            session=session,
            attempt_ids=unheld,
            outcome=AttemptState.LOST,
            reason="no live host agent held it",
            max_attempts=max_attempts,
        )
    ]
    for a, what in ended:
        job = session.get(Job, a.job_id)
        assert job is not None
        then = f"job failed ({job.reason})" if job.state == JobState.FAILED else f"job {job.state}"
        _record(
            session,
            repairs,
            LEASE_EXPIRED,
            epoch=epoch,
            at=now,
            job_id=a.job_id,
            attempt_id=a.id,
            partition_pk=a.partition_pk,
            detail=f"{what}; {then}",
        )


def _end_attempts_of_ended_jobs(
    session: Session, repairs: Repairs, now: datetime, epoch: int, limit: int
) -> None:
    # Only a cancel that raced a placement leaves one: the job ended while its attempt was written.
    rows = list(
        session.execute(
            select(Attempt)
            .join(Job, Job.id == Attempt.job_id)
            .where(Attempt.state.in_(LIVE_ATTEMPT_STATES), Job.state.in_(FINAL_JOB_STATES))
            .order_by(Attempt.id)
            .limit(limit)
            # Both rows, skipping any a worker or a cancel holds: this pass never waits, so it
            # cannot deadlock with a take (which locks the job, then the attempt).
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    for attempt in rows:
        job = session.get(Job, attempt.job_id, populate_existing=True)
        assert job is not None
        attempts.end_attempt(
            session=session,
            attempt=attempt,
            job=job,
            outcome=AttemptState.CANCELLED,
            reason=f"job already {job.state}",
            max_attempts=1,
        )
        _record(
            session,
            repairs,
            ATTEMPT_OF_ENDED_JOB_ENDED,
            epoch=epoch,
            at=now,
            job_id=job.id,
            attempt_id=attempt.id,
            partition_pk=attempt.partition_pk,
            detail=f"attempt {attempt.number} of {job.id} ended: the job is already {job.state}",
        )


def _complete_cancels(session: Session, repairs: Repairs, now: datetime, epoch: int, limit: int) -> None:
    # A cancel that arrives while the lease is expiring sees a running attempt (so leaves the stop
    # to the worker), and the expiry sees no cancel (so requeues): the job would wait forever,
    # since a job with a cancel requested is never placed again. Likewise a job marked running
    # needs a live attempt to ever end.
    live = select(Attempt.id).where(Attempt.job_id == Job.id, Attempt.state.in_(LIVE_ATTEMPT_STATES)).exists()
    stuck = list(
        session.execute(
            select(Job)
            .where(
                ~live,
                (Job.state == JobState.RUNNING)
                | ((Job.state == JobState.QUEUED) & Job.cancel_requested.is_(True)),
            )
            .order_by(Job.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).scalars()
    )
    for job in stuck:
        # Look again now that the row is ours: the scan's snapshot may predate a take or an end.
        session.refresh(job)
        still_live = session.execute(
            select(Attempt.id).where(Attempt.job_id == job.id, Attempt.state.in_(LIVE_ATTEMPT_STATES))
        ).first()
        if still_live is not None or job.state in FINAL_JOB_STATES:
            continue
        if job.state == JobState.QUEUED and not job.cancel_requested:
            continue
        if job.cancel_requested:
            finalize_job(session=session, job=job, state=JobState.CANCELLED, reason="cancelled by user")
            _record(
                session,
                repairs,
                CANCEL_COMPLETED,
                epoch=epoch,
                at=now,
                job_id=job.id,
                detail=f"{job.id} cancelled: its cancel arrived as its attempt ended",
            )
        else:
            job.state = JobState.QUEUED
            job.updated_at = now
            add_event(
                session,
                job.id,
                "state",
                "requeued: no attempt was running it",
                data={"state": "queued", "requeued": True},
                at=now,
            )
            _record(
                session,
                repairs,
                JOB_REQUEUED,
                epoch=epoch,
                at=now,
                job_id=job.id,
                detail=f"{job.id} was marked running with no live attempt; queued again",
            )


def _republish_outbox(
    session: Session,
    repairs: Repairs,
    now: datetime,
    epoch: int,
    retry_s: float,
    limit: int,
    queue_depth: Callable[[str], int | None],
) -> None:
    rows = session.execute(
        select(
            OutboxMessage.id,
            OutboxMessage.attempt_id,
            OutboxMessage.queue,
            OutboxMessage.published_at,
            OutboxMessage.publish_count,
            Attempt.job_id,
        )
        .join(Attempt, Attempt.id == OutboxMessage.attempt_id)
        .where(
            OutboxMessage.acked_at.is_(None),
            OutboxMessage.published_at < now - timedelta(seconds=retry_s),
            Attempt.state == AttemptState.PLACED,
        )
        .order_by(OutboxMessage.id)
        .limit(limit)
    ).all()
    moving: set[str] | None = None
    depths: dict[str, int | None] = {}
    for oid, attempt_id, queue, published_at, count, job_id in rows:
        factor = min(2 ** max(count - 1, 0), MAX_BACKOFF_FACTOR)
        if published_at > now - timedelta(seconds=retry_s * factor):
            continue
        if published_at > now - timedelta(seconds=retry_s * MAX_BACKOFF_FACTOR):
            if moving is None:
                moving = _queues_taken_from(session, {q for _, _, q, _, _, _ in rows}, now, retry_s)
            if queue in moving:
                if queue not in depths:
                    depths[queue] = queue_depth(queue)
                if depths[queue]:
                    # Workers are taking from that queue and messages still wait in it: this one
                    # is most likely among them, behind a backlog taken in turn, and a copy would
                    # only wait behind it. It goes again once the queue is empty or stops moving
                    # without it having been taken, or after the longest backoff all the same.
                    continue
        reset = changed(
            session,
            update(OutboxMessage)
            .where(OutboxMessage.id == oid, OutboxMessage.published_at == published_at)
            .values(published_at=None),
        )
        if reset != 1:
            continue
        _record(
            session,
            repairs,
            OUTBOX_REPUBLISHED,
            epoch=epoch,
            at=now,
            job_id=job_id,
            attempt_id=attempt_id,
            detail=f"attempt {attempt_id} of {job_id} not taken from {queue} after {count} publish(es)",
        )


def _queues_taken_from(session: Session, queues: set[str], now: datetime, retry_s: float) -> set[str]:
    """The queues from which a worker took an attempt within the last `retry_s`."""
    rows = session.execute(
        select(OutboxMessage.queue)
        .join(Attempt, Attempt.id == OutboxMessage.attempt_id)
        .where(
            OutboxMessage.acked_at > now - timedelta(seconds=retry_s),
            OutboxMessage.queue.in_(sorted(queues)),
            Attempt.started_at.is_not(None),  # taken by a worker, not ended unstarted (a cancel)
        )
        .distinct()
    ).scalars()
    return set(rows)


def _free_orphans(session: Session, repairs: Repairs, now: datetime, epoch: int, limit: int) -> None:
    live = (
        select(Attempt.id)
        .where(Attempt.partition_pk == Partition.pk, Attempt.state.in_(LIVE_ATTEMPT_STATES))
        .exists()
    )
    orphans = list(
        session.execute(
            select(Partition)
            .where(
                Partition.kind == "job",
                Partition.released_at.is_(None),
                ~live,
                Partition.created_at < now - timedelta(seconds=ORPHAN_GRACE_S),
            )
            .order_by(Partition.pk)
            .limit(limit)
        ).scalars()
    )
    for p in orphans:
        if fleet.release_partition(session=session, partition=p):
            _record(
                session,
                repairs,
                ORPHAN_PARTITION_FREED,
                epoch=epoch,
                at=now,
                job_id=p.job_id,
                partition_pk=p.pk,
                detail=f"partition {p.name} ({p.size} IPUs) freed: job {p.job_id} has no live attempt",
            )
    stray = session.execute(
        select(IpuAssignment.partition_pk, func.count())
        .join(Partition, Partition.pk == IpuAssignment.partition_pk)
        .where(Partition.released_at.is_not(None))
        .group_by(IpuAssignment.partition_pk)
    ).all()
    for pk, n in stray:
        session.execute(delete(IpuAssignment).where(IpuAssignment.partition_pk == pk))
        _record(
            session,
            repairs,
            ORPHAN_PARTITION_FREED,
            epoch=epoch,
            at=now,
            partition_pk=pk,
            detail=f"{n} IPU(s) still assigned to released partition {pk} freed",
        )


def action_counts(session: Session) -> dict[str, int]:
    """Every repair ever made, by action (zero for those never needed)."""
    counts = dict.fromkeys(ACTIONS, 0)
    for action, n in session.execute(
        select(ReconcilerAction.action, func.count()).group_by(ReconcilerAction.action)
    ).tuples():
        counts[action] = int(n)
    return counts


@dataclass(frozen=True)
class ClusterState:
    """Reliability figures of the whole cluster, read from the database (for `/metrics`)."""

    jobs: dict[str, int]
    attempts_ended: dict[str, int]
    attempts_live: dict[str, int]
    leases_overdue: int
    agents: dict[str, int]
    outbox_unacked: int
    outbox_publishes: int
    partitions_live: int
    ipus_assigned: int
    leader_epoch: int
    leader_lease_remaining_s: float
    repairs: dict[str, int]


def cluster_state(session: Session) -> ClusterState:
    now = db_now(session)
    jobs = dict.fromkeys((str(s) for s in JobState), 0)
    for state, n in session.execute(select(Job.state, func.count()).group_by(Job.state)).tuples():
        jobs[state] = int(n)
    ended = {str(s): 0 for s in AttemptState if s not in LIVE_ATTEMPT_STATES}
    live = {str(s): 0 for s in LIVE_ATTEMPT_STATES}
    for state, n in session.execute(select(Attempt.state, func.count()).group_by(Attempt.state)).tuples():
        (live if state in live else ended)[state] = int(n)
    overdue = session.execute(
        select(func.count())
        .select_from(Agent)
        .where(Agent.state == AgentState.ACTIVE, Agent.lease_expires_at < now)
    ).scalar_one()
    agent_states = {str(s): 0 for s in AgentState}
    for state, n in session.execute(select(Agent.state, func.count()).group_by(Agent.state)).tuples():
        agent_states[state] = int(n)
    unacked, publishes = session.execute(
        select(
            func.count().filter(OutboxMessage.acked_at.is_(None)),
            func.coalesce(func.sum(OutboxMessage.publish_count), 0),
        )
    ).one()
    partitions_live = session.execute(
        select(func.count()).select_from(Partition).where(Partition.released_at.is_(None))
    ).scalar_one()
    ipus = session.execute(select(func.count()).select_from(IpuAssignment)).scalar_one()
    lease = session.execute(select(LeaderLease).order_by(LeaderLease.name).limit(1)).scalar_one_or_none()
    return ClusterState(
        jobs=jobs,
        attempts_ended=ended,
        attempts_live=live,
        leases_overdue=int(overdue),
        agents=agent_states,
        outbox_unacked=int(unacked),
        outbox_publishes=int(publishes),
        partitions_live=int(partitions_live),
        ipus_assigned=int(ipus),
        leader_epoch=lease.epoch if lease else 0,
        leader_lease_remaining_s=max(0.0, (lease.expires_at - now).total_seconds()) if lease else 0.0,
        repairs=action_counts(session),
    )
