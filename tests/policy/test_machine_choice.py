"""Heterogeneity-aware placement: a job that may run on any machine type goes where it is predicted to
finish first (or costs least, when asked), and the type-blind baseline takes the first type with room."""

from __future__ import annotations

from scheduler.policy import MachineOption, QueuedJob, RunningJob, Snapshot, decide
from vipu.allocator import Allocator
from vipu.topology import Fleet, MachineType, Unit

NOW = 1_000.0


def mixed() -> Allocator:
    """One Bow POD16 and one C2 server: 16 fast IPUs and 16 first-generation ones."""
    return Allocator(Fleet([Unit(MachineType.BOW, "pod16", 0), Unit(MachineType.C2, "server", 1)]))


def any_job(job_id: str, *, bow_s: float, c2_s: float, size: int = 8, prefer: str = "time", at: float = 0.0):
    options = (
        MachineOption("bow", size, bow_s, 1.4),
        MachineOption("c2", size, c2_s, 0.5),
    )
    return QueuedJob(job_id, "t", size, at, min(bow_s, c2_s), options=options, prefer=prefer)


def hold_bow(alloc: Allocator, *, until: float) -> RunningJob:
    placement = alloc.allocate("busy", 16, machine_type="bow")
    assert placement is not None
    return RunningJob("busy", "x", 16, "busy", NOW - 10, until)


def placed(decision) -> dict[str, str]:
    return {job.id: placement.machine_type.value for job, placement in decision.starts}


def test_with_both_free_it_runs_where_it_is_faster() -> None:
    alloc = mixed()
    snap = Snapshot.build(now=NOW, queued=[any_job("j", bow_s=100, c2_s=300)], allocator=alloc)
    assert placed(decide(snap, "default")) == {"j": "bow"}


def test_it_waits_for_the_fast_type_when_that_still_finishes_first() -> None:
    alloc = mixed()
    running = [hold_bow(alloc, until=NOW + 50)]
    job = any_job("j", bow_s=100, c2_s=300)  # Bow: starts in 50, ends at 150; C2: ends at 300
    decision = decide(Snapshot.build(now=NOW, queued=[job], running=running, allocator=alloc), "default")
    assert decision.starts == []
    assert decision.waits["j"].reason == "reserved" and decision.waits["j"].estimated_start == NOW + 50
    assert decision.reservation is not None and all(i.startswith("pod") for i in decision.reservation.ipu_ids)


def test_it_takes_the_slow_type_now_when_waiting_would_cost_more() -> None:
    alloc = mixed()
    running = [hold_bow(alloc, until=NOW + 500)]
    job = any_job("j", bow_s=100, c2_s=300)  # Bow: ends at 600; C2: ends at 300
    decision = decide(Snapshot.build(now=NOW, queued=[job], running=running, allocator=alloc), "default")
    assert placed(decision) == {"j": "c2"}
    assert all(i.startswith("srv0001-") for i in decision.starts[0][1].ipu_ids)


def test_cost_first_goes_where_it_spends_least_of_the_grant() -> None:
    alloc = mixed()
    # Bow: 1.4 x 8 x 100 = 1,120; C2: 0.5 x 8 x 200 = 800 IPU-seconds of grant.
    job = any_job("j", bow_s=100, c2_s=200, prefer="cost")
    assert placed(decide(Snapshot.build(now=NOW, queued=[job], allocator=alloc), "default")) == {"j": "c2"}
    fast = any_job("k", bow_s=100, c2_s=200)
    assert placed(decide(Snapshot.build(now=NOW, queued=[fast], allocator=mixed()), "default")) == {
        "k": "bow"
    }


def test_the_type_blind_baseline_takes_the_first_type_with_room() -> None:
    alloc = mixed()
    running = [hold_bow(alloc, until=NOW + 50)]
    job = any_job("j", bow_s=100, c2_s=300)
    decision = decide(Snapshot.build(now=NOW, queued=[job], running=running, allocator=alloc), "type-blind")
    assert placed(decision) == {"j": "c2"}  # room now on C2; it never asks how long it runs there


def test_a_job_is_only_placed_on_a_type_it_lists() -> None:
    alloc = mixed()
    only_c2 = QueuedJob("j", "t", 4, 0.0, 50.0, options=(MachineOption("c2", 4, 50.0, 0.5),))
    big = QueuedJob("b", "t", 16, 0.0, 50.0, machine_type="bow")
    decision = decide(Snapshot.build(now=NOW, queued=[big, only_c2], allocator=alloc), "default")
    assert placed(decision) == {"b": "bow", "j": "c2"}


def test_sizes_may_differ_per_type() -> None:
    """`auto` resolves per type: a model that fits one Bow IPU may need four 304 MB GC2 IPUs."""
    alloc = mixed()
    running = [hold_bow(alloc, until=NOW + 10_000)]
    job = QueuedJob(
        "j",
        "t",
        1,
        0.0,
        100.0,
        options=(MachineOption("bow", 1, 100.0, 1.4), MachineOption("c2", 4, 150.0, 0.5)),
    )
    decision = decide(Snapshot.build(now=NOW, queued=[job], running=running, allocator=alloc), "default")
    ((started, placement),) = decision.starts
    assert placement.machine_type is MachineType.C2 and placement.size == 4 and started.size == 4
