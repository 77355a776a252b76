"""An agent tick in one transaction (`record_tick`): the lease, the log lines, the meter ticks due,
and the attempts that ended."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from scheduler.models import (
    AttemptState,
    JobEvent,
    utcnow,
)
from scheduler.services.batch import checkpoints, executables
from scheduler.services.batch.attempts.ending import Ending, end_attempts
from scheduler.services.batch.attempts.locks import _lock_billing, _lock_held, _lock_jobs, _share_jobs
from scheduler.services.batch.attempts.progress import ProgressView
from scheduler.services.capacity import agents
from scheduler.services.capacity.agents import AgentLease
from scheduler.services.tenancy import metering


@dataclass(frozen=True)
class LogLine:
    """A line of a running attempt's log, as its agent saw it happen."""

    job_id: str
    attempt: int
    kind: str
    message: str
    data: dict[str, Any] | None = None
    at: datetime | None = None


@dataclass(frozen=True)
class Bill:
    """Bill attempt `attempt_id` up to `cluster_s`, as its tick number `seq` (1, 2, ...)."""

    attempt_id: int
    seq: int
    cluster_s: float


@dataclass(frozen=True)
class Finish:
    """The agent's last word on an attempt."""

    attempt_id: int
    outcome: AttemptState
    cluster_s: float
    reason: str | None = None
    progress: ProgressView | None = None


@dataclass
class TickResult:
    fenced: bool = False
    # Attempts no longer running under this agent (the control plane ended them): forget them.
    gone: set[int] = field(default_factory=set)
    # Attempts whose tenant's grant ran out: billed what was left; the agent ends them now.
    exhausted: set[int] = field(default_factory=set)
    # Finishes that were written.
    finished: set[int] = field(default_factory=set)


def record_tick(
    *,
    session: Session,
    agent: AgentLease,
    lease_s: float,
    running: int = 0,
    ipus_busy: int = 0,
    logs: Sequence[LogLine] = (),
    bills: Sequence[Bill] = (),
    finishes: Sequence[Finish] = (),
    compiled: Iterable[tuple[str, str, float]] = (),
    max_attempts: int = 3,
    saved: Sequence[checkpoints.CheckpointDue] = (),
) -> TickResult:
    """One agent tick in the caller's transaction: renew the agent's lease (its heartbeat), write the
    log lines, record compiled executables `(tenant_key, machine type, compile_s)`, write the checkpoints
    `saved` of attempts it still holds, end what finished and bill what is due. Nothing is written if
    the lease is gone."""
    if not agents.renew(session=session, lease=agent, lease_s=lease_s, running=running, ipus_busy=ipus_busy):
        return TickResult(fenced=True)
    result = TickResult()
    now = utcnow()
    executables.record_many(session=session, entries=list(compiled))
    if logs:
        session.execute(
            insert(JobEvent.__table__),
            [
                {
                    "job_id": line.job_id,
                    "attempt": line.attempt,
                    "kind": line.kind,
                    "message": line.message[:2000],
                    "data": line.data,
                    "at": line.at or now,
                }
                for line in logs
            ],
        )
    ending = {f.attempt_id: f for f in finishes}
    billing = {b.attempt_id: b for b in bills if b.attempt_id not in ending}
    # Checkpoints of attempts neither ending nor billed this tick lock their attempts with the billed.
    saving = {c.attempt_id for c in saved} - set(ending) - set(billing)
    if not ending and not billing and not saving:
        return result
    # Jobs before attempts, the one order: a cancel locks the job, then waits for its attempt.
    jobs = _lock_jobs(session, ending)
    _share_jobs(session, (set(billing) | saving) - set(ending))
    held = _lock_held(session, agent, ending)
    locked = _lock_billing(session, agent, set(billing) | saving)
    billed = [row for row in locked if row[0].id in billing]
    still = held.keys() | {m.id for m, _, _ in locked}
    result.gone = (set(ending) - held.keys()) | ((set(billing) | saving) - still)
    # Only for attempts still ours: an attempt the control plane ended was settled on the
    # checkpoints it had then, and must not resume past what was billed.
    checkpoints.record(session=session, items=[c for c in saved if c.attempt_id in still])
    endings: list[Ending] = []
    for attempt in held.values():
        f = ending[attempt.id]
        attempt.cluster_s = max(attempt.cluster_s, f.cluster_s)
        attempt.progress = f.progress
        endings.append(Ending(attempt, jobs[attempt.job_id], f.outcome, f.reason))
        result.finished.add(attempt.id)
    ticks = [
        metering.TickDue(m, billing[m.id].seq, billing[m.id].cluster_s, reserved, workload)
        for m, reserved, workload in billed
    ]
    # Both move tenants' counters, each tenant's in one order (metering.settle_many, meter_ticks).
    end_attempts(session=session, endings=endings, max_attempts=max_attempts)
    result.exhausted = metering.meter_ticks(session=session, ticks=ticks)
    return result


def finish(
    *,
    session: Session,
    agent: AgentLease,
    attempt_id: int,
    outcome: AttemptState,
    cluster_s: float,
    lease_s: float,
    reason: str | None = None,
    progress: ProgressView | None = None,
    max_attempts: int = 3,
) -> bool:
    """One attempt's end as its agent reports it (`record_tick` with one finish). False, and nothing
    written, if the agent's lease or its hold on the attempt is gone."""
    result = record_tick(
        session=session,
        agent=agent,
        lease_s=lease_s,
        finishes=[Finish(attempt_id, outcome, cluster_s, reason, progress)],
        max_attempts=max_attempts,
    )
    return attempt_id in result.finished
