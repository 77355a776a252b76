"""The live loop and the simulator run the same policy code: on the same small workload they start the
same jobs at the same moments on the same IPUs.

The live side is the real SchedulerLoop on the test database with a fake Celery; its clock is moved
by hand, and workers are played by the attempts service (take, heartbeat, finish), so every job runs
exactly as long as predicted. The simulator replays the same jobs with perfect estimates.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from scheduler import loop as loop_module
from scheduler.jobspec import JobSpec
from scheduler.loop import SchedulerLoop
from scheduler.models import Attempt, AttemptState, Job, Partition, utcnow
from scheduler.policy import get_policy
from scheduler.services.batch import jobs
from scheduler.services.tenancy import tenants
from scheduler.settings import get_settings
from scheduler.simulator import Simulation, TraceJob
from tests.scheduler.test_lifecycle import FakeCelery
from tests.support import agentkit

# (tenant, IPUs, cluster seconds): a 128-IPU job that must wait, work that backfills around it,
# work that must not, and two tenants whose fair-share standing changes as their jobs run.
WORK = [
    ("alpha", 64, 500.0),
    ("beta", 32, 300.0),
    ("alpha", 128, 400.0),
    ("beta", 16, 50.0),
    ("alpha", 32, 1000.0),
    ("beta", 8, 100.0),
    ("alpha", 1, 20.0),
    ("beta", 2, 30.0),
    ("beta", 16, 250.0),
    ("alpha", 4, 60.0),
    ("alpha", 8, 700.0),
    ("beta", 64, 90.0),
]


def simulated() -> list[tuple[float, frozenset[str]]]:
    trace = [
        TraceJob(f"j{i:02d}", 0.0, seconds, size, tenant, size)
        for i, (tenant, size, seconds) in enumerate(WORK)
    ]
    sim = Simulation(
        trace, get_policy("default"), [j.duration_s for j in trace], pods=2, record_placements=True
    )
    result = sim.run()
    return [(o.start_s, frozenset(o.ipus)) for o in result.outcomes]


def live(db: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, frozenset[str]]]:
    settings = get_settings()
    with db.write() as s:
        ids = {
            name: tenants.create_tenant(
                session=s, secret=settings.secret(), name=name, plan="standard", quota_ipu_hours=10_000
            ).tenant.id
            for name in ("alpha", "beta")
        }
    base = utcnow().replace(microsecond=0) + timedelta(days=1)
    order: list[str] = []
    for i, (tenant, size, seconds) in enumerate(WORK):
        spec = JobSpec.model_validate(
            {
                "name": f"w{i}",
                "workload": {"model": "resnet50", "task": "train", "batch_size": 1024, "steps": 10},
                "ipus": size,
            }
        )
        with db.write() as s:
            job_id = jobs.submit_job(session=s, tenant_id=ids[tenant], spec=spec).job.id
            # The workload's own prediction does not matter here: the test sets the run time, and
            # submission times 1 ms apart keep the simulator's order (all submitted at 0, by index).
            s.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(predicted_runtime_s=seconds, created_at=base - timedelta(milliseconds=len(WORK) - i))
            )
        order.append(job_id)

    clock = {"t": 0.0}
    monkeypatch.setattr(loop_module, "db_now", lambda session: base + timedelta(seconds=clock["t"]))
    scheduler = SchedulerLoop(settings=settings, db=db, celery=FakeCelery())  # type: ignore[arg-type]
    assert scheduler.lead()
    started: dict[str, tuple[float, frozenset[str]]] = {}
    running: dict[str, tuple[int, int, float, float]] = {}  # job -> (attempt, epoch, start, seconds)
    seconds_of = {job_id: WORK[i][2] for i, job_id in enumerate(order)}
    seq = 0
    while len(started) < len(WORK) or running:
        scheduler.schedule_pass()
        with db.read() as s:
            placed = s.execute(
                select(Attempt.id, Attempt.job_id, Partition.ipu_ids)
                .join(Partition, Partition.pk == Attempt.partition_pk)
                .where(Attempt.state == AttemptState.PLACED)
            ).all()
        for attempt_id, job_id, ipus in placed:
            taken = agentkit.take(db, attempt_id, lease_s=3600)
            with db.write() as s:
                # The agent starts it now on the test's clock (take() stamps the real one).
                s.execute(
                    update(Attempt)
                    .where(Attempt.id == attempt_id)
                    .values(started_at=base + timedelta(seconds=clock["t"]))
                )
            assert taken is not None
            started[job_id] = (clock["t"], frozenset(ipus))
            running[job_id] = (attempt_id, taken.epoch, clock["t"], seconds_of[job_id])
        if not running:
            break
        # Time moves to the next completion; every running job reports the cluster time it has run.
        clock["t"] = min(start + length for _, _, start, length in running.values())
        seq += 1
        for job_id, (attempt_id, _epoch, start, length) in list(running.items()):
            ran = clock["t"] - start
            if ran >= length:
                assert agentkit.finish(db, attempt_id, AttemptState.SUCCEEDED, length)
                del running[job_id]
            else:
                agentkit.bill(db, attempt_id, seq, ran)
    return [started[job_id] for job_id in order]


def test_live_loop_and_simulator_start_the_same_jobs_at_the_same_times_on_the_same_ipus(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = simulated()
    got = live(db, monkeypatch)
    assert [start for start, _ in got] == [start for start, _ in expected]
    assert got == expected
    # The workload exercises backfill: something starts before the 128-IPU job that was ahead of it.
    assert any(start < expected[2][0] for start, _ in expected[3:])
