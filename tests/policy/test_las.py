"""Service classes (scheduler.policy.las) and default's preemption by them: attained-service queues,
predicted-service classes, promotion of starved jobs, and the guards that keep preemption sane."""

from __future__ import annotations

import math

from scheduler.policy import QueuedJob, RunningJob, Snapshot, TenantState, decide, get_policy
from scheduler.policy.config import TIRESIAS_THRESHOLDS_IPU_S
from scheduler.policy.las import (
    PREDICTED_LEVELS,
    attained_class,
    combined,
    job_class,
    next_promotion,
    plan_of,
    predicted_class,
    promoted,
    starved_after,
)
from scheduler.policy.preemption import PreemptionCost, worth_preempting
from scheduler.simulator import Simulation, TraceJob
from vipu.allocator import Allocator
from vipu.topology import Fleet

NOW = 100_000.0
HOUR = 3600.0


def test_attained_service_queues_follow_the_thresholds() -> None:
    t = TIRESIAS_THRESHOLDS_IPU_S  # 1 and 10 IPU-hours
    assert attained_class(0.0, t) == 0
    assert attained_class(3599.0, t) == 0
    assert attained_class(3600.0, t) == -1  # a threshold reached demotes
    assert attained_class(35_999.0, t) == -1
    assert attained_class(36_000.0, t) == -2
    assert attained_class(1e12, t) == -2  # the last queue holds the rest
    assert attained_class(1e12, ()) == 0  # no thresholds: one queue


def test_predicted_classes_are_a_doubling_apart_and_unknown_runs_go_last() -> None:
    assert predicted_class(0.5) == 0
    assert predicted_class(2.0) == -1
    assert predicted_class(3.0) == predicted_class(4.0) == -2
    assert predicted_class(5.0) == -3
    # 1 IPU for 10 minutes goes before 64 IPUs for 10 minutes, which goes before 64 IPUs for a day.
    assert predicted_class(600.0) > predicted_class(64 * 600.0) > predicted_class(64 * 86_400.0)
    # Capped: nothing is predicted below the last level.
    assert predicted_class(1e30) == -PREDICTED_LEVELS
    # No prediction: below every predicted class, ordered by attained service (Tiresias' queues).
    unknown_new = predicted_class(math.inf, 0.0, TIRESIAS_THRESHOLDS_IPU_S)
    unknown_old = predicted_class(math.inf, 50_000.0, TIRESIAS_THRESHOLDS_IPU_S)
    assert predicted_class(1e30) > unknown_new > unknown_old


def test_promotion_lifts_one_class_per_period_and_stops_at_the_top() -> None:
    day = 86_400.0
    assert promoted(-5, 0.0, day) == -5
    assert promoted(-5, day - 1, day) == -5
    assert promoted(-5, day, day) == -4
    assert promoted(-5, 3.5 * day, day) == -2
    assert promoted(-5, 100 * day, day) == 0  # never above the top class
    assert promoted(-5, 100 * day, None) == -5  # no promotion configured
    # When the next step comes: one period after queueing, then each period; never once at the top.
    assert next_promotion(-3, 1000.0, 1000.0, day) == 1000.0 + day
    assert next_promotion(-3, 1000.0, 1000.0 + 1.5 * day, day) == 1000.0 + 2 * day
    assert next_promotion(-1, 1000.0, 1000.0 + 1.5 * day, day) == math.inf
    assert next_promotion(-3, 1000.0, 1000.0, None) == math.inf


def test_plan_priority_outranks_every_service_class() -> None:
    config = get_policy("default-classes")
    gold_long = job_class(config, 5, 64, 30 * 86_400.0)
    free_short = job_class(config, 0, 1, 10.0)
    assert gold_long > free_short
    assert plan_of(gold_long) == 5 and plan_of(free_short) == 0
    assert plan_of(combined(-100, -PREDICTED_LEVELS - 3)) == -100
    # A policy without service classes keeps the plan priority as it is.
    assert job_class(get_policy("default"), 5, 64, 10.0) == 5
    # A long wait promotes the job's class, never past its plan.
    waited = job_class(config, 0, 64, 86_400.0, waited_s=10 * 86_400.0)
    assert waited > job_class(config, 0, 64, 86_400.0)
    assert plan_of(waited) == 0


def _scene(*, victim_ran_s: float = 2 * HOUR, **victim: object) -> Snapshot:
    """Tenant A's long job holds the whole POD64; tenant B's short job arrives."""
    alloc = Allocator(Fleet.uniform(1))
    assert alloc.allocate("long", 64) is not None
    config = get_policy("default-classes")
    long_left = 20 * HOUR
    held = RunningJob(
        "long",
        "A",
        64,
        "long",
        NOW - victim_ran_s,
        NOW + long_left,
        job_class(config, 0, 64, long_left),
        **victim,  # type: ignore[arg-type]
    )
    short = QueuedJob("short", "B", 8, NOW, 600.0, priority=job_class(config, 0, 8, 600.0))
    tenants = {"A": TenantState("A"), "B": TenantState("B", usage_ipu_s=1e9)}  # B: the heavier
    return Snapshot.build(now=NOW, queued=[short], running=[held], tenants=tenants, allocator=alloc)


def test_a_short_job_preempts_a_long_one_of_another_tenant_whatever_their_standing() -> None:
    decision = decide(_scene(), "default-classes")
    assert [v.id for v in decision.preempt] == ["long"]
    wait = decision.waits["short"]
    assert wait.reason == "preempting" and wait.estimated_start == NOW
    # Without service classes (the default before), it waits for the long job to end.
    before = decide(_scene(), "default")
    assert before.preempt == [] and before.waits["short"].reason == "reserved"


def test_preemption_guards_opt_out_minimum_run_and_bound() -> None:
    # An opted-out job is never preempted.
    assert decide(_scene(never_preempt=True), "default-classes").preempt == []
    # A job that started again less than the minimum run ago is left to run.
    assert decide(_scene(victim_ran_s=60.0), "default-classes").preempt == []
    # A job preempted as often as the bound allows is not preempted again.
    limit = get_policy("default-classes").preempt_max
    assert limit is not None
    assert decide(_scene(preemptions=limit), "default-classes").preempt == []
    assert [v.id for v in decide(_scene(preemptions=limit - 1), "default-classes").preempt] == ["long"]


def test_preemption_only_when_the_predicted_gain_exceeds_its_cost() -> None:
    cost = PreemptionCost()
    job = QueuedJob("short", "B", 8, NOW, 600.0)

    def victim(left_s: float, size: int = 64) -> RunningJob:
        return RunningJob("v", "A", size, "v", NOW - HOUR, NOW + left_s, 0)

    kw = {"cost": cost, "min_run_s": 600.0, "max_preemptions": 4, "gain": 2.0}
    assert worth_preempting(job, victim(20 * HOUR), NOW, **kw)
    # 64 IPUs x 100 s left is less than twice 8 x 600 s plus what the stop costs: it is let finish.
    assert not worth_preempting(job, victim(100.0), NOW, **kw)
    # The cost counts: a victim with just enough left to pay the gain but not the stop is kept.
    bare = 2.0 * 8 * 600.0 / 64
    assert worth_preempting(job, victim(bare + 1000.0), NOW, **{**kw, "cost": PreemptionCost(0, 0, 0, 0)})
    assert not worth_preempting(job, victim(bare + 30.0), NOW, **kw)
    assert cost.victim_s() == cost.warning_s + cost.load_s + cost.write_s
    assert cost.restart_s(same_type=False) == cost.restart_s() + cost.compile_s


def test_the_stop_cost_counts_the_warning_the_cloud_gives() -> None:
    """The guard weighs the warning a victim is given (IPUCLOUD_PREEMPTION_WARNING_S live), not a fixed
    30 s: the job it makes room for waits that long, and the victim holds its IPUs meanwhile."""
    config = get_policy("default-classes")
    assert [v.id for v in decide(_scene(), config).preempt] == ["long"]
    # 20 h of 64 IPUs left to run: with a 30 h warning the short job is better off waiting.
    assert decide(_scene(), config.with_options(preempt_warning_s=30 * HOUR)).preempt == []
    from scheduler.services.batch.scheduling import live_policy
    from scheduler.settings import Settings

    assert live_policy(Settings(preemption_warning_s=120.0)).preempt_warning_s == 120.0


def test_a_starved_long_job_is_promoted_in_the_simulator() -> None:
    """A stream of short jobs of one tenant would keep another's long job waiting for ever on a
    full fleet; promotion lifts it over them after `promote_after_s` per class."""
    promote = 1800.0
    # Preempted once at most, so what is measured is when it gets its IPUs back.
    config = get_policy("default-classes").with_options(promote_after_s=promote, preempt_max=1)
    trace = [TraceJob("long", 0.0, 4 * HOUR, 64, "A", 64)]
    # 64-IPU one-minute jobs, one a minute for 12 h: the fleet (one POD64) never idles, and none of
    # them waits long enough to be promoted itself.
    trace += [TraceJob(f"s{i:04d}", 10.0 + 60.0 * i, 60.0, 64, "B", 64) for i in range(720)]
    trace.sort(key=lambda j: j.submit_s)
    estimates = [j.duration_s for j in trace]
    never = Simulation(trace, config.with_options(promote_after_s=None), estimates, pods=1).run()
    lifted = Simulation(trace, config, estimates, pods=1).run()
    first = next(i for i, j in enumerate(trace) if j.id == "long")
    # Started at 0 (alone), it is preempted by the first short job after its minimum run...
    assert never.outcomes[first].preempted >= 1
    # ... and without promotion it resumes only once the stream has dried up (12 h); with it, after
    # eight promotions (4 h) it ranks with the short jobs, its tenant the lighter, and runs.
    assert never.outcomes[first].start_s > 12 * HOUR
    assert 4 * HOUR < lifted.outcomes[first].start_s < 4.5 * HOUR
    assert lifted.outcomes[first].end_s < 9 * HOUR
    assert lifted.outcomes[first].preempted == never.outcomes[first].preempted == 1


def test_no_preemption_search_when_every_victim_together_frees_too_few_ipus(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The search clones the allocator and releases victims one by one (the simulator's hot path):
    when the waiting job needs more IPUs than are free plus every eligible victim's, it is skipped,
    and the answer (nothing to preempt) is the same."""
    from scheduler.policy.preemption import choose_victims

    alloc = Allocator(Fleet.uniform(1))
    assert alloc.allocate("big", 32) is not None  # tenant B's, of a higher class: no victim
    assert alloc.allocate("small", 16) is not None  # tenant A's long job: the only victim
    running = [
        RunningJob("big", "B", 32, "big", NOW - HOUR, NOW + HOUR, 0),
        RunningJob("small", "A", 16, "small", NOW - HOUR, NOW + 20 * HOUR, -20),
    ]
    wanted = QueuedJob("want", "C", 64, NOW, 600.0, priority=-5)

    def no_clone(self: Allocator) -> Allocator:
        raise AssertionError("the search cloned the allocator")

    monkeypatch.setattr(Allocator, "clone", no_clone)
    assert choose_victims(wanted, running, alloc, now=NOW) is None
    # 16 free + 16 of the victim's is enough for 32 IPUs: then it searches (and finds it).
    monkeypatch.undo()
    found = choose_victims(QueuedJob("want", "C", 32, NOW, 600.0, priority=-5), running, alloc, now=NOW)
    assert found is not None and [v.id for v in found[0]] == ["small"]


def test_a_job_starved_for_its_size_goes_to_the_top_class_once_and_for_all() -> None:
    """#31: a job that has waited `starve_slowdown` times its predicted run (at least
    `starve_min_s`) is lifted to the top class of its plan, whatever its IPU-seconds."""
    config = get_policy("default-classes")
    assert config.starve_slowdown is not None
    starve = starved_after(config, 240.0)  # a 4-minute job
    assert starve == max(config.starve_min_s, config.starve_slowdown * 240.0)
    assert starved_after(config, 1.0) == config.starve_min_s  # never before the minimum
    assert starved_after(config, math.inf) == math.inf  # no prediction, no starvation by it
    assert starved_after(get_policy("default"), 240.0) == math.inf
    wide = predicted_class(64 * 240.0)
    week = config.promote_after_s
    assert promoted(wide, starve - 1, week, starve) == wide
    assert promoted(wide, starve, week, starve) == 0
    assert next_promotion(wide, 1000.0, 1000.0, week, starve) == 1000.0 + starve
    assert next_promotion(wide, 1000.0, 1000.0 + starve, week, starve) == math.inf
    # Queued and live, through job_class; a running job by the run it was queued with.
    assert plan_of(job_class(config, 3, 64, 240.0, waited_s=starve)) == 3
    assert job_class(config, 3, 64, 240.0, waited_s=starve) == combined(3, 0)
    assert job_class(config, 3, 64, 60.0, waited_s=starve, run_s=240.0) == combined(3, 0)
    assert job_class(config, 3, 64, 60.0, waited_s=starve - 1, run_s=240.0) < combined(3, 0)


def _wide_behind_small(waited_s: float) -> Snapshot:
    """One POD64 held by 64 one-IPU jobs of days; a 64-IPU job of 4 minutes has waited
    ``waited_s``, and a 1-IPU job of 10 minutes has just arrived."""
    config = get_policy("default-classes")
    alloc = Allocator(Fleet.uniform(1))
    running = []
    for n in range(64):
        assert alloc.allocate(f"r{n}", 1) is not None
        left = 100 * HOUR
        running.append(
            RunningJob(f"r{n}", "A", 1, f"r{n}", NOW - HOUR, NOW + left, job_class(config, 0, 1, left))
        )
    wide = QueuedJob(
        "wide", "u64", 64, NOW - waited_s, 240.0, priority=job_class(config, 0, 64, 240.0, waited_s=waited_s)
    )
    small = QueuedJob("small", "B", 1, NOW, 600.0, priority=job_class(config, 0, 1, 600.0))
    tenants = {t: TenantState(t) for t in ("A", "B", "u64")}
    return Snapshot.build(now=NOW, queued=[wide, small], running=running, tenants=tenants, allocator=alloc)


def test_a_starved_wide_job_leads_the_line_is_reserved_for_and_preempts_where_small_work_did() -> None:
    """Gaia's `u64` (docs/scheduling.md): under class order a wide short job ranks behind every
    narrower job of less IPU-seconds, so a small job that cannot start holds the pass's reservation
    while the wide one waits. Starved, it leads, holds the reservation and makes room."""
    starve = starved_after(get_policy("default-classes"), 240.0)
    fresh = decide(_wide_behind_small(60.0), "default-classes")
    assert fresh.reservation is not None and fresh.reservation.job_id == "small"
    starved = decide(_wide_behind_small(starve), "default-classes")
    assert starved.reservation is not None and starved.reservation.job_id == "wide"
    assert starved.reservation.size == 64 and len(starved.preempt) == 64
    assert starved.waits["wide"].reason == "preempting"


def test_a_replay_gives_a_starved_wide_job_its_turn_under_a_steady_flow_of_small_jobs() -> None:
    """The same in the simulator: 64 one-IPU jobs of 100 hours fill a POD64, a 64-IPU job of
    4 minutes arrives, and a 1-IPU job of 10 minutes comes every 5 minutes for 60 hours. The wide job
    starts once starved (plus the victims' warning), not after the long jobs end."""
    config = get_policy("default-classes")
    jobs = [TraceJob(f"long{n}", 0.0, 100 * HOUR, 1, "A", 1) for n in range(64)]
    jobs.append(TraceJob("wide", 10.0, 240.0, 64, "u64", 64))
    jobs += [TraceJob(f"s{n:04d}", 20.0 + 300.0 * n, 600.0, 1, "B", 1) for n in range(720)]
    result = Simulation(jobs, config, [j.duration_s for j in jobs], pods=1).run()
    wide = next(o for j, o in zip(jobs, result.outcomes, strict=True) if j.id == "wide")
    starve = starved_after(config, 240.0)
    assert wide.first_start_s - 10.0 <= starve + 600.0, wide.first_start_s / HOUR
