"""Ending attempts: the control plane stopping live ones (`stop_running`), and every ending's effects
on its job (retry, requeue or finish), its partition and its tenant's holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from scheduler import bus
from scheduler.clock import Clock
from scheduler.models import (
    FINAL_JOB_STATES,
    PLATFORM_FAULT_STATES,
    Attempt,
    AttemptState,
    IpuSession,
    Job,
    JobEvent,
    JobState,
    OutboxMessage,
    utcnow,
)
from scheduler.services.batch import checkpoints
from scheduler.services.batch.attempts.locks import _lock_jobs
from scheduler.services.batch.attempts.progress import derived_cluster_s, progress_dict
from scheduler.services.batch.job_state import finalize_job
from scheduler.services.capacity import fleet
from scheduler.services.clock import db_now
from scheduler.services.tenancy import metering, notifications
from vipu import emulator


def stop_running(
    *,
    session: Session,
    attempt_ids: Sequence[int],
    outcome: AttemptState,
    reason: str,
    max_attempts: int,
) -> list[Attempt]:
    """The control plane ends live attempts itself: a cancel, a preemption, a failed machine, a
    lapsed agent. Each still live (placed or running) is ended now, a running one at the cluster
    time its run has reached; the others were ended meanwhile and are left alone. Returns the
    attempts ended; the agents driving them are told over the bus once this commits, or find out at
    their next look."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return []
    jobs = _lock_jobs(session, ids)
    live = list(
        session.execute(
            select(Attempt)
            .where(Attempt.id.in_(ids), Attempt.state.in_((AttemptState.PLACED, AttemptState.RUNNING)))
            .order_by(Attempt.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalars()
    )
    now = db_now(session)
    for attempt in live:
        if attempt.state == AttemptState.RUNNING and attempt.worker:
            bus.publish_after_commit(session, bus.STOP_CHANNEL, f"{attempt.worker} {attempt.id}")
        if attempt.state == AttemptState.RUNNING and attempt.timeline:
            t = derived_cluster_s(attempt, now)
            attempt.cluster_s = t
            attempt.progress = progress_dict(emulator.Timeline.from_dict(attempt.timeline).progress_at(t), t)
    end_attempts(
        session=session,
        endings=[Ending(a, jobs[a.job_id], outcome, reason) for a in live],
        max_attempts=max_attempts,
    )
    return live


@dataclass(frozen=True)
class Ending:
    """An attempt to end (its row locked by the caller), how, and why."""

    attempt: Attempt
    job: Job
    outcome: AttemptState
    reason: str | None


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
    end_attempts(session=session, endings=[Ending(attempt, job, outcome, reason)], max_attempts=max_attempts)


def end_attempts(*, session: Session, endings: Sequence[Ending], max_attempts: int) -> None:
    """End many attempts in a handful of statements, whatever their number (an agent's tick, a
    lapsed agent, a failed machine): mark them, ack their outbox messages, free their partitions,
    move their jobs on, and settle them.

    The settle comes last: it moves the tenants' counters, and every attempt of a tenant ends
    through that row's lock, so it is held only for the last statements and the commit.
    """
    if not endings:
        return
    now = utcnow()
    for e in endings:
        e.attempt.state = e.outcome
        e.attempt.ended_at = now
        e.attempt.end_reason = e.reason
    ids = [e.attempt.id for e in endings]
    # The attempts' and the jobs' changes are written together, by the settle's flush.
    with session.no_autoflush:
        # Nobody needs the messages any more: the reconciler must not publish them again.
        session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.attempt_id.in_(ids), OutboxMessage.acked_at.is_(None))
            .values(acked_at=now)
            .execution_options(synchronize_session=False)
        )
        fleet.release_job_partitions(session=session, partition_pks=[e.attempt.partition_pk for e in endings])
        lost = _lost_attempts(
            session,
            [e for e in endings if e.outcome == AttemptState.LOST and e.job.state not in FINAL_JOB_STATES],
        )
        events: list[dict[str, Any]] = []
        for e in endings:
            # Only an attempt the reconciler ends for a job that already ended finds the job final:
            # its outcome was decided, and this attempt's end must not rewrite it.
            if e.job.state not in FINAL_JOB_STATES:
                _move_job_on(session, e, lost.get(e.job.id, 0), max_attempts, now, events)
        if events:
            session.execute(insert(JobEvent.__table__), events)
    # A platform fault keeps (and bills) the work up to the attempt's last checkpoint.
    kept = checkpoints.kept_by_attempt(
        session=session, attempt_ids=[e.attempt.id for e in endings if e.outcome in PLATFORM_FAULT_STATES]
    )
    holds = _hold_refunds(session, [e for e in endings if e.outcome in PLATFORM_FAULT_STATES], kept, now)
    # Last, since it moves the tenant's counters (and an ended job gives back what it reserves).
    metering.settle_many(
        session=session,
        items=[
            metering.Settle(
                attempt=e.attempt,
                job=e.job,
                billable=e.outcome not in PLATFORM_FAULT_STATES,
                outcome=str(e.outcome),
                job_ends=e.job.state in FINAL_JOB_STATES,
                kept_s=kept.get(e.attempt.id) if e.outcome in PLATFORM_FAULT_STATES else None,
            )
            for e in endings
        ],
    )
    metering.refund_holds(session=session, refunds=holds)


def _hold_refunds(
    session: Session, faulted: Sequence[Ending], kept: dict[int, float], now: datetime
) -> list[metering.HoldRefund]:
    """What a platform fault wasted of the sessions whose jobs it hit: a session job pays nothing
    itself (its session is billed for holding the partition), so without this the session paid for
    the IPUs the fault left idle, while a batch job hit by the same fault is billed only up to its
    last checkpoint. Per faulted job: its IPUs, from its last checkpoint (or its start) to the end
    of its attempt (a lost one's: when the reconciler found its agent gone), in cluster seconds."""
    hit = [e for e in faulted if e.job.session_id is not None and e.attempt.gcd >= 0]
    if not hit:
        return []
    holds = {
        row.id: row
        for row in session.execute(
            select(IpuSession).where(IpuSession.id.in_({e.job.session_id for e in hit}))
        ).scalars()
    }
    hold_ids = sorted({h.attempt_id for h in holds.values() if h.attempt_id is not None})
    held = {
        a.id: a
        for a in session.execute(
            select(Attempt).where(Attempt.id.in_(hold_ids)).order_by(Attempt.id).with_for_update()
        ).scalars()
    }
    out = []
    for e in hit:
        row = holds.get(e.job.session_id or "")
        hold = held.get(row.attempt_id or 0) if row is not None else None
        a = e.attempt
        if hold is None or hold.state != AttemptState.RUNNING or a.started_at is None:
            continue  # the hold ended too: its own settle decides what it is billed
        timeline = a.timeline or {}
        clock = Clock(float(timeline.get("scale") or 1.0))  # the one it was taken at
        started = a.started_at if a.started_at.tzinfo is not None else a.started_at.replace(tzinfo=now.tzinfo)
        ran = max(float(a.cluster_s or 0.0), clock.cluster_since(started, now))
        ran = min(ran, float(timeline.get("end_s") or ran))
        wasted = ran - float(kept.get(a.id) or 0.0)
        if wasted > 0:
            out.append(metering.HoldRefund(hold, a.id, a.size, wasted, e.job.model, str(e.outcome)))
    return out


def _move_job_on(
    session: Session,
    e: Ending,
    lost_before: int,
    max_attempts: int,
    now: datetime,
    events: list[dict[str, Any]],
) -> None:
    job, attempt, outcome, reason = e.job, e.attempt, e.outcome, e.reason

    def end(state: JobState, why: str | None) -> None:
        finalize_job(session=session, job=job, state=state, reason=why, release=False, events=events)

    if outcome == AttemptState.SUCCEEDED:
        end(JobState.SUCCEEDED, None)
    elif outcome == AttemptState.CANCELLED:
        end(JobState.CANCELLED, reason or "cancelled by user")
    elif outcome in (AttemptState.FAILED, AttemptState.TIMED_OUT):
        end(JobState.FAILED, reason)
    elif job.cancel_requested:
        end(JobState.CANCELLED, "cancelled by user")
    elif job.task == "session":
        # A session's hold lost to the platform (a failed machine): the session ends (its sweep frees
        # the partition, scheduler/services/sessions/); holding another partition is not what was asked.
        end(JobState.FAILED, f"session's partition lost: {reason or outcome}")
    elif outcome != AttemptState.LOST or lost_before + 1 < max_attempts:
        # Only lost attempts count against the retry limit: a handed-back, preempted or interrupted
        # attempt is the platform making room or failing under it, not a sign that the job crashes
        # its host agent.
        job.state = JobState.QUEUED
        job.updated_at = now
        if outcome == AttemptState.PREEMPTED:
            # Why and for whom, as the job's history says it (another tenant's job is never named:
            # scheduling.preemption_reason).
            notifications.job_event(
                session,
                job,
                "job.preempted",
                key=f"{job.id}:{attempt.number}",
                attempt=attempt.number,
                reason=reason,
            )
        events.append(
            {
                "job_id": job.id,
                "attempt": attempt.number,
                "kind": "state",
                "message": (
                    f"requeued: attempt {attempt.number} {outcome}" + (f" ({reason})" if reason else "")
                )[:2000],
                "data": {"state": "queued", "requeued": True, "reason": reason},
                "at": now,
            }
        )
    else:
        end(JobState.FAILED, f"gave up after {max_attempts} lost attempts; last: {reason or outcome}")


def _lost_attempts(session: Session, endings: list[Ending]) -> dict[str, int]:
    """Each job's earlier lost attempts (these endings' new states are not written yet)."""
    if not endings:
        return {}
    return {
        job_id: int(n)
        for job_id, n in session.execute(
            select(Attempt.job_id, func.count())
            .where(
                Attempt.job_id.in_({e.job.id for e in endings}),
                Attempt.id.not_in([e.attempt.id for e in endings]),
                Attempt.state == AttemptState.LOST,
            )
            .group_by(Attempt.job_id)
        ).tuples()
    }
