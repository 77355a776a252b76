"""In-process helpers for the lease and reconciler tests: a tenant, jobs, a scheduler loop, agents."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

from sqlalchemy import select

from scheduler.jobspec import JobSpec
from scheduler.loop import SchedulerLoop
from scheduler.models import Attempt
from scheduler.services.batch import jobs
from scheduler.services.batch.attempts import TakenAttempt
from scheduler.services.capacity.agents import AgentLease
from scheduler.services.tenancy import tenants
from scheduler.settings import get_settings
from tests.support import agentkit


class RecordingCelery:
    """Stands in for the broker in the in-process tests: records what the dispatcher publishes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []

    def producer_or_acquire(self) -> Any:
        return nullcontext(None)

    def send_task(self, name: str, args: list[Any], queue: str, producer: Any = None) -> None:
        self.sent.append((name, args, queue))


def make_tenant(db: Any, name: str = "acme", hours: float = 1000, plan: str = "standard") -> str:
    with db.write() as s:
        created = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name=name, plan=plan, quota_ipu_hours=hours
        )
        return created.tenant.id


def submit(db: Any, tenant: str, name: str = "job", steps: int = 50, ipus: int = 4, **over: Any) -> str:
    body: dict[str, Any] = {
        "name": name,
        "workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": steps},
        "ipus": ipus,
        **over,
    }
    with db.write() as s:
        return jobs.submit_job(session=s, tenant_id=tenant, spec=JobSpec.model_validate(body)).job.id


def leader_loop(db: Any, holder: str = "sched-a") -> SchedulerLoop:
    loop = SchedulerLoop(settings=get_settings(), db=db, celery=RecordingCelery(), holder=holder)  # type: ignore[arg-type]
    assert loop.lead(), "the test's scheduler could not take the leader lease"
    return loop


def place(db: Any, loop: SchedulerLoop, job_id: str) -> Attempt:
    """Run scheduling passes until `job_id` has a placed attempt; return that attempt."""
    for _ in range(20):
        loop.schedule_pass()
        with db.read() as s:
            placed = s.execute(
                select(Attempt).where(Attempt.job_id == job_id, Attempt.state == "placed")
            ).scalar_one_or_none()
        if placed is not None:
            return placed
        time.sleep(0.05)
    raise AssertionError(f"{job_id} was never placed")


def agent(db: Any, name: str = "w", lease_s: float = 30) -> AgentLease:
    """A host agent's incarnation, newly registered with this lease."""
    return agentkit.register(db, name, lease_s)


def take(
    db: Any, attempt: Attempt, lease_s: float = 30, worker: str = "w"
) -> tuple[AgentLease, TakenAttempt]:
    """Take the attempt as a newly registered agent `worker` with a lease of `lease_s`."""
    lease = agent(db, worker, lease_s)
    taken = agentkit.take(db, attempt.id, attempt.epoch, agent=lease)
    assert taken is not None
    return lease, taken


def attempt_of(db: Any, attempt_id: int) -> Attempt:
    with db.read() as s:
        a = s.get(Attempt, attempt_id)
        assert a is not None
        return a
