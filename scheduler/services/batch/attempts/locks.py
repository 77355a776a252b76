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
    billing them needs (no ORM objects), each with its job's reservation and workload. The caller
    has locked their jobs already (`_lock_jobs`): jobs before attempts."""
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
