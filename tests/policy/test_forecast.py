"""The forecast (scheduler/policy/forecast.py) on a snapshot built in memory: what it leaves alone,
and that it stops when its time is up."""

from __future__ import annotations

from scheduler.policy import JobQueue, QueuedJob, RunningJob, Snapshot
from scheduler.policy.forecast import forecast
from vipu.allocator import Allocator
from vipu.topology import Fleet, MachineType


def full_fleet() -> Snapshot:
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    placed = alloc.allocate("p_a", 64)
    assert placed is not None
    running = [RunningJob("job_a", "t", 64, "p_a", 0.0, 1000.0)]
    queued = [QueuedJob(f"job_{i}", "t", 64, float(i), 500.0) for i in range(3)]
    return Snapshot(now=10.0, queue=JobQueue(queued), running=running, tenants={}, allocator=alloc)


def test_queued_jobs_start_one_after_another_and_the_snapshot_is_untouched() -> None:
    snapshot = full_fleet()
    starts = forecast(snapshot)
    assert starts == {"job_0": 1000.0, "job_1": 1500.0, "job_2": 2000.0}
    assert set(snapshot.allocator.partitions()) == {"p_a"} and len(snapshot.queue) == 3


def test_a_forecast_out_of_time_says_nothing_rather_than_guess() -> None:
    assert forecast(full_fleet(), budget_s=0.0) == {}
    assert forecast(full_fleet(), max_passes=1) == {}  # the first pass starts nothing
