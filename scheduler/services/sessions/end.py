"""Ending sessions: by their owner or the sweep, stopping their jobs, settling the hold and freeing
the partition; and why a session ended."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler.clock import Clock
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    IpuSession,
    Job,
    JobState,
    Partition,
    SessionState,
)
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.capacity import fleet
from scheduler.services.sessions.views import lock_unended
from scheduler.services.tenancy import notifications
from scheduler.services.tenancy.scope import Scope

# Why a session ended (`ended_reason`).
OWNER = "owner"
MAX_DURATION = "max_duration"
IDLE_TIMEOUT = "idle_timeout"
QUOTA = "quota"
FAULT = "fault"


def end_session(*, session: Session, session_id: str, scope: Scope, clock: Clock) -> IpuSession:
    """The owner ends a session: its running jobs are stopped, its hold billed up to now."""
    row = lock_unended(session, session_id, scope)
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
            .with_for_update(key_share=True)
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
        _settle_hold(session, row, job, detail, now, clock)
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


def _settle_hold(
    session: Session, row: IpuSession, job: Job, detail: str, now: datetime, clock: Clock
) -> None:
    """End the session's holding attempt, billed up to ``now``, which frees the partition; a session
    that never held one (or lost it) has its partition released and its holder job cancelled."""
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
            .with_for_update(key_share=True)
        ).scalars()
    )
    for job in waiting:
        job.cancel_requested = True
        finalize_job(
            session=session, job=job, state=JobState.CANCELLED, reason=f"session {row.id} ended: {detail}"
        )
