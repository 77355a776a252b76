"""Drive attempts in-process through the services a host agent calls, one step at a time.

For tests of the control plane's services: a real agent (workers/agent.py) does the same in its
loop, and the end-to-end and fault tests run that one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from scheduler.clock import UNSCALED, Clock
from scheduler.models import (
    Agent,
    AgentState,
    Attempt,
    AttemptState,
    Checkpoint,
    Job,
    JobState,
    Partition,
    utcnow,
)
from scheduler.services.batch import attempts
from scheduler.services.batch.attempts import Bill, Finish, TakenAttempt, TickResult
from scheduler.services.batch.job_state import finalize_job
from scheduler.services.capacity.agents import AgentLease

__all__ = [
    "AGENT",
    "Bill",
    "Finish",
    "TakenAttempt",
    "TickResult",
    "bill",
    "finish",
    "lease",
    "register",
    "stop_at_time_limit",
    "take",
    "tick",
]

AGENT = "test-agent"
LEASE_S = 60.0
# The lease each agent registered with: its ticks renew it for as long (a short one lapses soon).
_lease_s: dict[str, float] = {}


def lease(db: Any, name: str = AGENT, lease_s: float = LEASE_S) -> AgentLease:
    """The agent's current incarnation, registered on first use (and after the database was emptied)."""
    with db.read() as s:
        row = s.execute(select(Agent).where(Agent.name == name)).scalar_one_or_none()
        if row is not None and row.state == AgentState.ACTIVE:
            return AgentLease(name=row.name, epoch=row.epoch)
    return register(db, name, lease_s)


def register(db: Any, name: str = AGENT, lease_s: float = LEASE_S) -> AgentLease:
    _lease_s[name] = lease_s
    with db.write() as s:
        new, _ = attempts.register_agent(
            session=s, name=name, host="test", pid=0, queues=["ipucloud"], lease_s=lease_s, max_attempts=3
        )
    return new


def take(
    db: Any,
    attempt_id: int,
    epoch: int = 0,
    *,
    agent: AgentLease | None = None,
    lease_s: float | None = None,
    clock: Clock = UNSCALED,
) -> TakenAttempt | None:
    agent = agent or lease(db)
    lease_s = lease_s or _lease_s.get(agent.name, LEASE_S)
    with db.write() as s:
        return attempts.take(
            session=s, agent=agent, attempt_id=attempt_id, epoch=epoch, lease_s=lease_s, clock=clock
        )


def tick(
    db: Any, *, agent: AgentLease | None = None, lease_s: float | None = None, **writes: Any
) -> TickResult:
    agent = agent or lease(db)
    lease_s = lease_s or _lease_s.get(agent.name, LEASE_S)
    with db.write() as s:
        return attempts.record_tick(session=s, agent=agent, lease_s=lease_s, **writes)


def bill(
    db: Any, attempt_id: int, seq: int, cluster_s: float, *, agent: AgentLease | None = None
) -> TickResult:
    return tick(db, agent=agent, bills=[Bill(attempt_id, seq, cluster_s)])


def finish(
    db: Any,
    attempt_id: int,
    outcome: AttemptState,
    cluster_s: float,
    reason: str | None = None,
    *,
    agent: AgentLease | None = None,
) -> bool:
    result = tick(db, agent=agent, finishes=[Finish(attempt_id, outcome, cluster_s, reason)])
    return attempt_id in result.finished


def stop_at_time_limit(db: Any, job_id: str) -> None:
    """Leave queued job `job_id` as an agent leaves a job its time limit stopped: one timed-out
    attempt on a released 4-IPU partition, the job failed, a `time_limit` checkpoint at step 10 of
    20 (what `POST /jobs/{id}/resume` takes)."""
    with db.write() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == JobState.QUEUED
        part = Partition(
            name=f"to-{job_id[-12:]}", kind="job", size=4, machine_type="m2000", tenant_id=job.tenant_id,
            job_id=job_id, ipu_ids=[], released_at=utcnow(),
        )  # fmt: skip
        s.add(part)
        s.flush()
        attempt = Attempt(
            job_id=job_id, tenant_id=job.tenant_id, number=1, state="timed_out", partition_pk=part.pk,
            size=4, machine_type="m2000", timeline={"step_s": 0.01}, ended_at=utcnow(),
        )  # fmt: skip
        s.add(attempt)
        s.flush()
        job.attempts = 1
        finalize_job(session=s, job=job, state=JobState.FAILED, reason="exceeded max_runtime_s")
        s.add(
            Checkpoint(
                job_id=job_id, attempt_id=attempt.id, attempt=1, step=10, steps=20, samples=640,
                executable_key="x", machine_type="m2000", cluster_s=1.0, run_s=1.0, reason="time_limit",
            )
        )  # fmt: skip
