"""The policy pipeline on hand-built snapshots: order, admission, backfill, reserved partitions,
preemption and the count-only planner, each checked on what a user of the cloud would notice."""

from __future__ import annotations

import math

from scheduler.policy import (
    QueuedJob,
    ReservedPartition,
    RunningJob,
    Snapshot,
    TenantState,
    decide,
    get_policy,
)
from vipu.allocator import Allocator
from vipu.topology import Fleet

NOW = 1_000.0


def queued(
    job_id: str, tenant: str = "a", size: int = 1, *, at: float = 0.0, runtime: float = 100.0, **kw
) -> QueuedJob:
    return QueuedJob(job_id, tenant, size, at, runtime, **kw)


def run(
    alloc: Allocator,
    job_id: str,
    size: int,
    *,
    ends: float,
    tenant: str = "x",
    priority: int = 0,
    started: float = NOW - 10,
) -> RunningJob:
    placement = alloc.allocate(job_id, size)
    assert placement is not None
    return RunningJob(job_id, tenant, size, job_id, started, ends, priority)


def started(decision) -> list[str]:
    return [job.id for job, _ in decision.starts]


def test_fair_share_starts_the_lighter_tenant_first_whatever_the_submission_order() -> None:
    alloc = Allocator(Fleet.uniform(1))
    busy = [run(alloc, f"r{i}", 16, ends=NOW + 500) for i in range(3)]  # 16 IPUs left
    heavy = [queued(f"h{i}", "heavy", 8, at=i) for i in range(3)]  # submitted first
    light = [queued(f"l{i}", "light", 8, at=10 + i) for i in range(3)]
    tenants = {
        "heavy": TenantState("heavy", usage_ipu_s=50_000.0),
        "light": TenantState("light", usage_ipu_s=1_000.0),
    }
    snap = Snapshot.build(now=NOW, queued=heavy + light, running=busy, tenants=tenants, allocator=alloc)
    decision = decide(snap, "default")
    assert started(decision) == ["l0", "l1"]
    # FIFO ignores usage: the heavy tenant's earlier jobs go first.
    alloc2 = Allocator(Fleet.uniform(1))
    busy2 = [run(alloc2, f"r{i}", 16, ends=NOW + 500) for i in range(3)]
    snap2 = Snapshot.build(now=NOW, queued=heavy + light, running=busy2, tenants=tenants, allocator=alloc2)
    assert started(decide(snap2, "fifo-firstfit")) == ["h0", "h1"]


def test_weights_scale_usage_and_a_pass_charges_what_it_starts() -> None:
    # Tenant "big" used twice as much but has twice the weight: level with "small". In one pass each
    # start charges its predicted IPU-seconds divided by the weight, so "big" gets two starts for
    # every one of "small" rather than either taking the whole fleet.
    alloc = Allocator(Fleet.uniform(1))
    jobs = [queued(f"s{i}", "small", 16, at=i) for i in range(4)] + [
        queued(f"b{i}", "big", 16, at=0.5 + i) for i in range(4)
    ]
    tenants = {
        "small": TenantState("small", usage_ipu_s=10_000.0, weight=1.0),
        "big": TenantState("big", usage_ipu_s=20_000.0, weight=2.0),
    }
    decision = decide(Snapshot.build(now=NOW, queued=jobs, tenants=tenants, allocator=alloc), "default")
    assert started(decision) == ["s0", "b0", "b1", "s1"]


def test_committed_work_counts_against_a_tenant_at_once() -> None:
    # Equal history, but "busy" has 100,000 IPU-seconds still to run: "idle" goes first.
    alloc = Allocator(Fleet.uniform(1))
    jobs = [queued("busy1", "busy", 64, at=0), queued("idle1", "idle", 64, at=5)]
    tenants = {
        "busy": TenantState("busy", usage_ipu_s=100.0, committed_ipu_s=100_000.0),
        "idle": TenantState("idle", usage_ipu_s=100.0),
    }
    decision = decide(Snapshot.build(now=NOW, queued=jobs, tenants=tenants, allocator=alloc), "default")
    assert started(decision) == ["idle1"]
    assert decision.waits["busy1"].reason == "reserved"


def test_quota_refusal_holds_the_job_and_says_why_while_others_run() -> None:
    alloc = Allocator(Fleet.uniform(1))
    jobs = [
        queued("poor1", "poor", 4, cost_ipu_ms=5_000_000),
        queued("rich1", "rich", 4, at=1, cost_ipu_ms=5_000_000),
    ]
    tenants = {
        "poor": TenantState("poor", quota_left_ipu_ms=3_600_000),
        "rich": TenantState("rich", quota_left_ipu_ms=10**12),
    }
    decision = decide(Snapshot.build(now=NOW, queued=jobs, tenants=tenants, allocator=alloc), "default")
    assert started(decision) == ["rich1"]
    wait = decision.waits["poor1"]
    assert wait.reason == "quota"
    assert "1.00 of the tenant's grant" in wait.detail


def test_quota_budget_is_shared_by_a_tenants_queued_jobs_in_order() -> None:
    alloc = Allocator(Fleet.uniform(1))
    jobs = [queued(f"q{i}", "t", 1, at=i, cost_ipu_ms=1_000_000) for i in range(3)]
    tenants = {"t": TenantState("t", quota_left_ipu_ms=2_500_000)}
    decision = decide(Snapshot.build(now=NOW, queued=jobs, tenants=tenants, allocator=alloc), "default")
    assert started(decision) == ["q0", "q1"]
    assert decision.waits["q2"].reason == "quota"


def test_tenant_limits_and_state_hold_jobs_with_reasons() -> None:
    alloc = Allocator(Fleet.uniform(1))
    jobs = [
        queued("c1", "capped", 1, at=0),
        queued("c2", "capped", 1, at=1),
        queued("big", "small-plan", 32, at=2),
        queued("q1", "few", 1, at=3),
        queued("q2", "few", 1, at=4),
        queued("gone", "suspended", 1, at=5),
        queued("late", "expired", 1, at=6),
    ]
    tenants = {
        "capped": TenantState("capped", max_concurrent_jobs=2, running_jobs=1),
        "small-plan": TenantState("small-plan", max_partition_size=16),
        "few": TenantState("few", max_queued_jobs=1),
        "suspended": TenantState("suspended", active=False),
        "expired": TenantState("expired", expires_at=NOW - 1),
    }
    decision = decide(Snapshot.build(now=NOW, queued=jobs, tenants=tenants, allocator=alloc), "default")
    assert started(decision) == ["c1", "q1"]
    reasons = {job_id: wait.reason for job_id, wait in decision.waits.items()}
    assert reasons == {
        "c2": "limit",
        "big": "limit",
        "q2": "limit",
        "gone": "tenant-inactive",
        "late": "tenant-inactive",
    }
    assert "at most 2 jobs at once" in decision.waits["c2"].detail
    assert "at most 16 IPUs" in decision.waits["big"].detail


def test_backfill_starts_what_ends_before_the_reservation_and_holds_what_would_delay_it() -> None:
    alloc = Allocator(Fleet.uniform(1))
    running = [run(alloc, "r-long", 32, ends=NOW + 1_000), run(alloc, "r-short", 16, ends=NOW + 200)]
    # 16 IPUs free now; the head needs 48, which it gets when r-short ends (at NOW + 200).
    jobs = [
        queued("head", "a", 32, at=0, runtime=5_000),
        queued("quick", "a", 16, at=1, runtime=150),  # ends at NOW + 150: before the reservation
        queued("slow", "a", 16, at=2, runtime=900),  # would hold IPUs the head needs past NOW + 200
    ]
    decision = decide(Snapshot.build(now=NOW, queued=jobs, running=running, allocator=alloc), "default")
    assert started(decision) == ["quick"]
    assert decision.reservation is not None and decision.reservation.start == NOW + 200
    head_wait = decision.waits["head"]
    assert head_wait.reason == "reserved" and head_wait.estimated_start == NOW + 200
    slow = decision.waits["slow"]
    assert slow.reason in ("behind", "no-room") and slow.behind == ("head",)


def test_strict_fifo_never_starts_a_job_behind_a_blocked_one() -> None:
    alloc = Allocator(Fleet.uniform(1))
    running = [run(alloc, "r1", 32, ends=NOW + 100), run(alloc, "r2", 16, ends=NOW + 100)]
    jobs = [queued("head", size=32, at=0), queued("small", size=1, at=1, runtime=1)]
    decision = decide(Snapshot.build(now=NOW, queued=jobs, running=running, allocator=alloc), "fifo-firstfit")
    assert started(decision) == []
    assert decision.waits["small"].reason == "behind"
    assert decision.waits["small"].behind == ("head",)


def test_reserved_partition_serves_only_its_tenant_one_job_at_a_time() -> None:
    alloc = Allocator(Fleet.uniform(1))
    reserved_placement = alloc.allocate("team-p", 16)
    assert reserved_placement is not None
    reserved = {"team-p": ReservedPartition("team-p", "team", 16)}
    jobs = [
        queued("t1", "team", 16, at=0, partition="team-p"),
        queued("t2", "team", 16, at=1, partition="team-p"),
        queued("intruder", "other", 16, at=2, partition="team-p"),
        queued("shared", "other", 32, at=3),
    ]
    decision = decide(Snapshot.build(now=NOW, queued=jobs, allocator=alloc, reserved=reserved), "default")
    where = {job.id: place for job, place in decision.starts}
    assert where["t1"] == "team-p"
    assert decision.waits["t2"].reason == "partition-busy" and decision.waits["t2"].behind == ("t1",)
    assert decision.waits["intruder"].reason == "partition-missing"
    # The shared pool never hands out the reserved partition's IPUs.
    shared = where["shared"]
    assert not isinstance(shared, str)
    assert not set(shared.ipu_ids) & set(reserved_placement.ipu_ids)


def test_preemption_when_off_stops_nothing_and_when_on_only_lower_priority_work() -> None:
    def scene(ran: float = 3600.0) -> Snapshot:
        alloc = Allocator(Fleet.uniform(1))
        running = [
            run(alloc, "low-old", 32, ends=NOW + 10_000, priority=0, started=NOW - ran),
            run(alloc, "high-run", 32, ends=NOW + 10_000, priority=5, started=NOW - ran),
        ]
        jobs = [queued("urgent", "a", 32, at=0, priority=5)]
        return Snapshot.build(now=NOW, queued=jobs, running=running, allocator=alloc)

    off = decide(scene(), get_policy("default").with_options(preemption=False))
    assert off.preempt == [] and off.waits["urgent"].reason == "reserved"
    # Work that started again less than default's minimum run ago is left to run.
    assert decide(scene(ran=10.0), "default").preempt == []
    on = decide(scene(), get_policy("default").with_options(preemption=True))
    assert [r.id for r in on.preempt] == ["low-old"]
    assert on.waits["urgent"].reason == "preempting"
    # Equal priority is never preempted.
    same = scene()
    same.queue.remove("urgent")
    same.queue.add(queued("peer", "a", 32, at=0, priority=0))
    assert decide(same, get_policy("default").with_options(preemption=True)).preempt == []


def test_a_sessions_hold_is_never_preempted() -> None:
    """Whatever its priority or the operator's switch: its owner is working in the partition."""
    alloc = Allocator(Fleet.uniform(1))
    hold = run(alloc, "session-hold", 64, ends=NOW + 10_000, priority=-100, started=NOW - 3600)
    held = RunningJob(hold.id, hold.tenant_id, hold.size, hold.partition, hold.started_at, hold.expected_end,
                      hold.priority, session=True)  # fmt: skip
    jobs = [queued("urgent", "a", 32, at=0, priority=5)]
    snapshot = Snapshot.build(now=NOW, queued=jobs, running=[held], allocator=alloc)
    on = decide(snapshot, get_policy("default").with_options(preemption=True))
    assert on.preempt == [] and started(on) == []
    # The same work not held by a session is stopped.
    again = Allocator(Fleet.uniform(1))
    plain = run(again, "batch", 64, ends=NOW + 10_000, priority=-100, started=NOW - 3600)
    snapshot = Snapshot.build(now=NOW, queued=jobs, running=[plain], allocator=again)
    assert [r.id for r in decide(snapshot, get_policy("default").with_options(preemption=True)).preempt] == [
        "batch"
    ]


def test_count_only_planner_launches_into_fragments_and_fails() -> None:
    # 8 free IPUs, but as 8 single IPUs on 8 machines: enough by count, no partition of 8.
    alloc = Allocator(Fleet.uniform(1), "first-fit")
    running = [run(alloc, f"r{i}", 1, ends=NOW + 100 + i) for i in range(64)]
    for machine in range(8):  # one IPU ends early on each of machines 0..7
        alloc.release(f"r{4 * machine}")
    running = [r for r in running if r.id not in {f"r{4 * m}" for m in range(8)}]
    assert alloc.free_ipus() == 8
    jobs = [queued("eight", size=8)]
    slurm = decide(Snapshot.build(now=NOW, queued=jobs, running=running, allocator=alloc), "slurm-backfill")
    assert started(slurm) == [] and slurm.stats.launch_failures == 1
    assert slurm.stats.head_refused_with_room
    assert "8 IPUs are free but no 8 of them form a partition" in slurm.waits["eight"].detail


def test_explanations_cover_every_queued_job() -> None:
    alloc = Allocator(Fleet.uniform(1))
    running = [run(alloc, "r1", 32, ends=NOW + 100), run(alloc, "r2", 16, ends=NOW + 200)]
    jobs = [queued(f"j{i}", "t", 4 if i % 2 else 2, at=i, runtime=1_000) for i in range(20)]
    decision = decide(Snapshot.build(now=NOW, queued=jobs, running=running, allocator=alloc), "default")
    assert set(decision.waits) | set(started(decision)) == {j.id for j in jobs}
    assert all(w.reason in {"reserved", "behind", "no-room"} for w in decision.waits.values())
    assert math.isfinite(decision.reservation.start)


def test_preemptible_work_is_preempted_for_any_tenant_least_loss_first_and_never_jumps_the_queue() -> None:
    def scene() -> tuple[Allocator, list[RunningJob]]:
        alloc = Allocator(Fleet.uniform(1))
        running = []
        for job_id, started_at in (("spot-a", NOW - 590), ("spot-b", NOW - 610)):
            alloc.allocate(job_id, 32)
            # spot-a has 590 s since its last checkpoint (none yet), spot-b only 10 (one at 600 s).
            running.append(
                RunningJob(job_id, "x", 32, job_id, started_at, NOW + 10_000, 5, False, True, 600.0)
            )
        return alloc, running

    alloc, running = scene()
    jobs = [queued("urgent", "trial", 32, at=0, priority=0)]
    # The switch is off and the waiting job is of a lower class: preemptible work yields all the same.
    decision = decide(Snapshot.build(now=NOW, queued=jobs, running=running, allocator=alloc), "default")
    assert [r.id for r in decision.preempt] == ["spot-b"], "the one that loses least"
    assert decision.waits["urgent"].reason == "preempting"
    # Preemptible work never preempts.
    alloc, running = scene()
    jobs = [queued("also-spot", "trial", 32, at=0, preemptible=True)]
    assert (
        decide(Snapshot.build(now=NOW, queued=jobs, running=running, allocator=alloc), "default").preempt
        == []
    )
    # Once spot-b has stopped and is queued again (older than urgent), urgent takes its IPUs first:
    # spot-b started ahead of it would be preempted again at once, for ever.
    alloc, running = scene()
    alloc.release("spot-b")
    jobs = [
        queued("spot-b", "x", 32, at=-100, priority=5, preemptible=True),
        queued("urgent", "trial", 32, at=0, priority=0),
    ]
    decision = decide(Snapshot.build(now=NOW, queued=jobs, running=running[:1], allocator=alloc), "default")
    assert started(decision) == ["urgent"]


def test_an_owners_priority_orders_its_own_jobs_across_sizes_and_never_other_tenants() -> None:
    from scheduler.policy.model import JobQueue
    from scheduler.policy.ordering import Order

    jobs = [
        queued("a-old-1", "a", 1, at=0),
        queued("b-mid-2", "b", 2, at=5),
        queued("a-new-4", "a", 4, at=10, user_priority=50),
        queued("a-newer-1", "a", 1, at=20, user_priority=50),
        queued("b-new-1", "b", 1, at=30, user_priority=-100),
    ]
    tenants = {"a": TenantState("a", usage_ipu_s=1e9), "b": TenantState("b")}
    order = [j.id for j in Order(JobQueue(jobs), tenants, "fair", now=NOW, aging_s=3 * 86_400)]
    # b is lighter: all its jobs go first, in its own order; then a's, its priority-50 ones first
    # whatever their size, oldest first among equals.
    assert order == ["b-mid-2", "b-new-1", "a-new-4", "a-newer-1", "a-old-1"]
    # Without priorities, a tenant's jobs go oldest first, across sizes.
    plain = [queued(j.id, j.tenant_id, j.size, at=j.submitted_at) for j in jobs]
    assert [j.id for j in Order(JobQueue(plain), tenants, "fair", now=NOW, aging_s=3 * 86_400)] == [
        "b-mid-2",
        "b-new-1",
        "a-old-1",
        "a-new-4",
        "a-newer-1",
    ]
