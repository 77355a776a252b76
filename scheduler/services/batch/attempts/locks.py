"""The row locks of a batch of attempts, taken in the one global order: jobs (by id), then attempts
(by id), then tenants (by id), so batches of many attempts never deadlock."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models import (
    Attempt,
    AttemptState,
    Job,
)
from scheduler.services.capacity.agents import AgentLease
from scheduler.services.tenancy import metering


def _lock_jobs(session: Session, attempt_ids: Iterable[int]) -> dict[str, Job]:
    """The jobs of these attempts, locked in id order (jobs before attempts, always).

    FOR NO KEY UPDATE (`key_share=True`), not FOR UPDATE: a row inserted with a foreign key to the job
    (a job event, an agent tick's meter event) takes a KEY SHARE lock on it, which FOR UPDATE blocks.
    A job's own changes (a cancel, a session's end) lock it so too: none changes its key, and an agent
    tick's checkpoint or meter event of an attempt of it must not wait for them behind the attempt's
    lock, which they wait for in turn (a deadlock, answered 503 before)."""
    ids = sorted(attempt_ids)
    if not ids:
        return {}
    return {
        j.id: j
        for j in session.execute(
            select(Job)
            .where(Job.id.in_(select(Attempt.job_id).where(Attempt.id.in_(ids))))
            .order_by(Job.id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        ).scalars()
    }


def _share_jobs(session: Session, attempt_ids: Iterable[int]) -> None:
    """The jobs of these attempts held FOR KEY SHARE, in id order, before the attempts are locked.

    The lock a checkpoint's or a meter event's foreign key takes on its job anyway, taken first, as
    the one order (jobs, then attempts) wants: taken by the insert, after the attempt's lock, it
    waited for a job locked FOR UPDATE by one that waited for that attempt. It waits for no job lock
    but FOR UPDATE (a key's change, a delete), so attempts only billed or checkpointed do not queue
    behind their jobs' cancels and ends, which lock FOR NO KEY UPDATE."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return
    session.execute(
        select(Job.id)
        .where(Job.id.in_(select(Attempt.job_id).where(Attempt.id.in_(ids))))
        .order_by(Job.id)
        .with_for_update(read=True, key_share=True)
    ).all()


def _lock_held(session: Session, agent: AgentLease, attempt_ids: Iterable[int]) -> dict[int, Attempt]:
    """The attempts among these still running under this agent's incarnation, locked."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return {}
    return {
        a.id: a
        for a in session.execute(
            select(Attempt)
            .where(
                Attempt.id.in_(ids),
                Attempt.state == AttemptState.RUNNING,
                Attempt.worker == agent.name,
                Attempt.agent_epoch == agent.epoch,
            )
            .order_by(Attempt.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalars()
    }


def _lock_billing(
    session: Session, agent: AgentLease, attempt_ids: Iterable[int]
) -> list[tuple[metering.Metered, int, str]]:
    """The attempts among these still running under this agent's incarnation, locked, as what
    billing them needs (no ORM objects), each with its job's reservation and workload. Their jobs
    are held already (`_share_jobs`): read, not changed, as neither changes while an attempt runs."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return []
    rows = session.execute(
        select(
            Attempt.id,
            Attempt.tenant_id,
            Attempt.job_id,
            Attempt.size,
            Attempt.metered_ipu_ms,
            Attempt.reservation_used_ipu_ms,
            Attempt.cluster_s,
            Attempt.ticks,
            Job.reserved_ipu_ms,
            Job.model,
            Attempt.machine_type,
            Attempt.rate,
            Attempt.unbilled_s,
        )
        .join(Job, Job.id == Attempt.job_id)
        .where(
            Attempt.id.in_(ids),
            Attempt.state == AttemptState.RUNNING,
            Attempt.worker == agent.name,
            Attempt.agent_epoch == agent.epoch,
        )
        .order_by(Attempt.id)
        .with_for_update(of=Attempt)
    ).tuples()
    out = []
    for row in rows:
        aid, tenant, job, size, metered, used, cluster_s, ticks, reserved, model, kind, rate, unbilled = row
        out.append(
            (
                metering.Metered(
                    aid, tenant, job, size, metered, used, cluster_s, ticks, kind, rate, unbilled or 0.0
                ),
                int(reserved),
                model,
            )
        )
    return out
