"""Backfill never delays the first job in line, checked against an independent oracle on many random
fleets: the oracle replays the predicted ends on a clone of the real allocator, release by release."""

from __future__ import annotations

import math
import random

from scheduler.policy import QueuedJob, RunningJob, Snapshot, TenantState, TimeTable, decide
from vipu.allocator import Allocator
from vipu.topology import Fleet

NOW = 10_000.0


def earliest_by_replay(alloc: Allocator, ends: list[tuple[float, str]], size: int) -> float:
    """When ``size`` first fits if the partitions free up at ``ends``: the slow, obvious way."""
    if alloc.find(size) is not None:
        return NOW
    twin = alloc.clone()
    for end, name in sorted(ends):
        twin.release(name)
        if twin.find(size) is not None:
            return end
    return math.inf


def busy_fleet(rng: random.Random, pods: int, policy: str) -> tuple[Allocator, list[RunningJob]]:
    alloc = Allocator(Fleet.uniform(pods), policy)
    running: list[RunningJob] = []
    target = rng.uniform(0.6, 0.97) * alloc.fleet.ipus
    n = 0
    while alloc.fleet.ipus - alloc.free_ipus() < target:
        size = rng.choice((1, 1, 1, 2, 4, 8, 16, 32))
        name = f"r{n}"
        n += 1
        if alloc.allocate(name, size) is None:
            if size == 1:
                break
            continue
        running.append(RunningJob(name, f"t{n % 3}", size, name, NOW - 50, NOW + rng.uniform(5, 3_000)))
    return alloc, running


def test_backfilled_jobs_never_push_back_the_reserved_start() -> None:
    checked = 0
    for seed in range(120):
        rng = random.Random(seed)
        pods = rng.choice((1, 2))
        alloc, running = busy_fleet(rng, pods, rng.choice(("default", "first-fit", "best-fit")))
        sizes = (1, 2, 4, 8, 16, 32, 64) + ((128,) if pods == 2 else ())
        queue = [
            QueuedJob(f"q{i}", f"t{rng.randrange(3)}", rng.choice(sizes), float(i), rng.uniform(1, 4_000))
            for i in range(25)
        ]
        tenants = {f"t{i}": TenantState(f"t{i}", usage_ipu_s=rng.uniform(0, 1e5)) for i in range(3)}
        snap = Snapshot.build(now=NOW, queued=queue, running=running, tenants=tenants, allocator=alloc)
        decision = decide(snap, "default")
        reservation = decision.reservation
        if reservation is None or not reservation.timed:
            continue
        head = next(job for job in queue if job.id == reservation.job_id)
        ends = [(r.expected_end, r.partition) for r in running]
        ends += [(NOW + job.predicted_runtime_s, place.partition_id) for job, place in decision.starts]
        # Everything the pass started runs as predicted, and the head still fits at its reserved start.
        assert earliest_by_replay(alloc, ends, head.size) <= reservation.start, f"seed {seed}"
        # ... on the very IPUs reserved for it.
        twin = alloc.clone()
        for end, name in ends:
            if end <= reservation.start:
                twin.release(name)
        twin.occupy("head", sorted(reservation.ipu_ids))
        checked += 1
    assert checked > 60  # most random fleets exercise a reservation


def test_reservation_is_the_earliest_start_the_allocator_allows() -> None:
    for seed in range(150):
        rng = random.Random(1000 + seed)
        pods = rng.choice((1, 2, 3))
        alloc, running = busy_fleet(rng, pods, rng.choice(("default", "first-fit")))
        size = rng.choice((1, 2, 4, 8, 16, 32, 64) + ((128,) if pods >= 2 else ()))
        ends = [(r.expected_end, r.partition) for r in running]
        expected = earliest_by_replay(alloc, ends, size)
        table = TimeTable.from_allocator(alloc, running)
        found = table.earliest(size, None, NOW, allocator_free=alloc.free_ipus())
        got = math.inf if found is None else found[0]
        assert got == expected, f"seed {seed}: size {size}"
        if found is not None:
            twin = alloc.clone()
            for end, name in ends:
                if end <= got:
                    twin.release(name)
            twin.occupy("check", sorted(found[1]))  # a valid, free partition at that time
