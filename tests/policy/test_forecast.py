"""The forecast (scheduler/policy/forecast.py) on a snapshot built in memory: what it leaves alone,
and that it stops when its time is up."""

from __future__ import annotations

import dataclasses
import math

from scheduler.policy import HeldArray, JobQueue, QueuedJob, RunningJob, Snapshot
from scheduler.policy.config import get_policy
from scheduler.policy.forecast import forecast
from scheduler.policy.las import job_class, starved_after
from scheduler.policy.running import end_by_progress
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


def test_an_arrays_held_elements_start_no_faster_than_its_max_running() -> None:
    """One element runs and one is shown; four more are held by max_running 2 (Snapshot.held). The
    fleet has room for all, yet at most 2 are forecast to run at any instant."""
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    assert alloc.allocate("p_0", 4) is not None
    running = [RunningJob("el_0", "t", 4, "p_0", 0.0, 100.0)]
    shown = [QueuedJob("el_1", "t", 4, 0.0, 100.0)]
    waiting = tuple(QueuedJob(f"el_{i}", "t", 4, 0.0, 100.0) for i in range(2, 6))
    snapshot = Snapshot(
        now=10.0,
        queue=JobQueue(shown),
        running=running,
        tenants={},
        allocator=alloc,
        held={"arr_x": HeldArray(cap=2, members=frozenset({"el_0", "el_1"}), waiting=waiting)},
    )
    starts = forecast(snapshot)
    assert starts == {"el_1": 10.0, "el_2": 100.0, "el_3": 110.0, "el_4": 200.0, "el_5": 210.0}
    spans = [(0.0, 100.0)] + [(t, t + 100.0) for t in starts.values()]
    assert max(sum(1 for a, b in spans if a <= t < b) for t in starts.values()) == 2
    assert len(snapshot.queue) == 1, "the snapshot is untouched"
    # `until`: the replay stops once those started.
    assert set(forecast(snapshot, until={"el_3"})) == {"el_1", "el_2", "el_3"}


def test_drawn_run_times_bring_the_first_of_many_ends_forward() -> None:
    """64 one-IPU jobs fill the POD64, each predicted to end at 1,000 s. On predictions alone a new
    one-IPU job starts at 1,000 s; but the first of 64 jobs whose run times are off by about 20% ends
    well before the prediction they share. With run times drawn around the predictions the median of
    the replays says so, the same answer every time it is asked."""
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    running = []
    for i in range(64):
        assert alloc.allocate(f"p_{i}", 1) is not None
        running.append(RunningJob(f"job_{i}", "t", 1, f"p_{i}", 0.0, 1000.0))
    snapshot = Snapshot(now=10.0, queue=JobQueue(), running=running, tenants={}, allocator=alloc)
    target = QueuedJob("job_new", "u", 1, 10.0, 100.0)
    plain = get_policy("default-classes").with_options(forecast_spread=0.0)
    assert forecast(snapshot, plain, target=target) == {"job_new": 1000.0}
    drawn = plain.with_options(forecast_spread=0.3, forecast_samples=9)
    first = forecast(snapshot, drawn, target=target)
    assert 10.0 < first["job_new"] < 800.0, first
    assert forecast(snapshot, drawn, target=target) == first
    assert set(snapshot.allocator.partitions()) == {f"p_{i}" for i in range(64)}


def test_a_preempted_job_restarted_in_the_replay_runs_its_whole_restart() -> None:
    """Preemptible V holds the POD64 until 1,000 s; non-preemptible A preempts it (30 s warning), runs
    100 s, and V restarts at 140 s with 990 s left. The end V had before it was preempted (1,000 s)
    must not end its restart: the job asked about, preemptible too and behind V, starts at 1,130 s.
    (V goes back to the queue preemptible, as it was: it does not start ahead of A.)"""
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    assert alloc.allocate("p_v", 64) is not None
    running = [RunningJob("job_v", "t", 64, "p_v", 0.0, 1000.0, preemptible=True)]
    queued = [QueuedJob("job_a", "u", 64, 5.0, 100.0)]
    snapshot = Snapshot(now=10.0, queue=JobQueue(queued), running=running, tenants={}, allocator=alloc)
    target = QueuedJob("job_t", "w", 64, 10.0, 50.0, preemptible=True)
    starts = forecast(snapshot, "default", target=target)
    assert starts == {"job_a": 40.0, "job_v": 140.0, "job_t": 1130.0}, starts


def test_a_victim_holds_its_ipus_for_the_configured_warning_not_30_s() -> None:
    """The scene above with a 120 s warning (IPUCLOUD_PREEMPTION_WARNING_S) on a clock 2x the pass's:
    V is warned 60 s of the pass's clock, so A starts at 70 s, V restarts at 170 s, the job asked
    about at 1,160 s."""
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    assert alloc.allocate("p_v", 64) is not None
    running = [RunningJob("job_v", "t", 64, "p_v", 0.0, 1000.0, preemptible=True)]
    queued = [QueuedJob("job_a", "u", 64, 5.0, 100.0)]
    snapshot = Snapshot(now=10.0, queue=JobQueue(queued), running=running, tenants={}, allocator=alloc)
    target = QueuedJob("job_t", "w", 64, 10.0, 50.0, preemptible=True)
    config = get_policy("default").with_options(preempt_warning_s=120.0, clock_scale=2.0)
    starts = forecast(snapshot, config, target=target)
    assert starts == {"job_a": 70.0, "job_v": 170.0, "job_t": 1160.0}, starts


def test_a_job_starved_while_the_forecast_runs_is_lifted_to_the_top_as_the_policy_lifts_it() -> None:
    """`default-classes` lifts a job starved for its size to the top class (scheduler.policy.las);
    the forecast does the same when its replay passes that moment. A POD64 is held (never preempted)
    until 10,000 s; W (64 IPUs, 10 s) ranks behind L (64 IPUs, 5 s: less work), but is starved at
    3,600 s, so it goes first when the POD frees."""
    config = get_policy("default-classes")
    assert starved_after(config, 10.0) == 3600.0
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    assert alloc.allocate("p_r", 64) is not None
    running = [RunningJob("job_r", "t", 64, "p_r", 0.0, 10_000.0, never_preempt=True)]
    wide = QueuedJob("job_w", "u", 64, 0.0, 10.0, priority=job_class(config, 0, 64, 10.0))
    less = QueuedJob("job_l", "v", 64, 5.0, 5.0, priority=job_class(config, 0, 64, 5.0))
    assert less.priority > wide.priority
    snapshot = Snapshot(now=10.0, queue=JobQueue([wide, less]), running=running, tenants={}, allocator=alloc)
    assert forecast(snapshot, config) == {"job_w": 10_000.0, "job_l": 10_010.0}


def test_work_the_replay_starts_preemptible_stays_preemptible_and_requeues_in_its_place() -> None:
    """Preemptible P (tenant t, 32 IPUs, 1,000 s, submitted at 0) starts at once in the other half of
    the POD64. At 100 s an array's running element ends and its held 64-IPU element E joins the
    queue: P is stopped for it as the live pass would stop it (warned until 130 s), not kept running
    to its end at 1,010 s as if it were not preemptible. P goes back to the queue as submitted at 0,
    ahead of its tenant's newer job A (asked about at 10 s, 64 IPUs), so A starts once P's restart
    (910 s left) ends, at 1,090 s; a job the replay restarts keeps its first forecast start."""
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    assert alloc.allocate("p_0", 32) is not None
    running = [RunningJob("el_0", "u", 32, "p_0", 0.0, 100.0)]
    held = {
        "arr": HeldArray(cap=1, members=frozenset({"el_0"}), waiting=(QueuedJob("el_1", "u", 64, 0.0, 50.0),))
    }
    queued = [QueuedJob("job_p", "t", 32, 0.0, 1000.0, preemptible=True)]
    snapshot = Snapshot(
        now=10.0, queue=JobQueue(queued), running=running, tenants={}, allocator=alloc, held=held
    )
    assert forecast(snapshot, "default") == {"job_p": 10.0, "el_1": 130.0}
    target = QueuedJob("job_a", "t", 64, 10.0, 2000.0, preemptible=True)
    assert forecast(snapshot, "default", target=target) == {"job_p": 10.0, "el_1": 130.0, "job_a": 1090.0}


def test_a_preemptible_job_expects_the_recent_non_preemptible_work_again_ahead_of_it() -> None:
    """A POD64 is held until 1,010 s. Preemptible P waits for it; non-preemptible work was submitted
    900 s ago (X, 64 IPUs, 300 s), and older than the window (Y) and preemptible (Z) too. With a
    1,000 s window the forecast expects X's like again at 110 s: it leads the line when the POD frees
    (preemptible work never leads while other work waits), so P is told 1,310 s, not 1,010 s. A
    non-preemptible job asked about is not told to wait for it, and the expected work is not in the
    answer. Without the window (0) it is the queue as it stands."""
    config = get_policy("default").with_options(inflow_window_s=1000.0)
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    assert alloc.allocate("p_r", 64) is not None
    running = [RunningJob("job_r", "t", 64, "p_r", 0.0, 1010.0, never_preempt=True)]
    recent = [
        QueuedJob("job_y", "u", 64, -1500.0, 300.0),
        QueuedJob("job_x", "u", 64, -890.0, 300.0),
        QueuedJob("job_z", "v", 64, -500.0, 300.0, preemptible=True),
    ]
    waiting = QueuedJob("job_p", "w", 64, 5.0, 500.0, preemptible=True)
    snapshot = Snapshot(
        now=10.0, queue=JobQueue([waiting]), running=running, tenants={}, allocator=alloc, recent=recent
    )
    assert forecast(snapshot, config) == {"job_p": 1310.0}
    assert forecast(snapshot, config.with_options(inflow_window_s=0.0)) == {"job_p": 1010.0}
    asked = QueuedJob("job_a", "a", 64, 10.0, 50.0, preemptible=True)
    assert forecast(snapshot, config, target=asked) == {"job_a": 1810.0, "job_p": 1310.0}
    other = QueuedJob("job_b", "b", 64, 10.0, 50.0)
    assert forecast(snapshot, config, target=other) == {"job_b": 1010.0}


def test_a_running_jobs_class_rises_in_the_replay_as_its_work_runs_down() -> None:
    """`default-classes` ranks a running job by the work it has left (scheduler.policy.las), and
    the live loop and the simulator move its class as it runs; so must the replay. Two PODs: V
    (preemptible, 64 IPUs, to 20,000 s) ranks at the snapshot by 20,000 s left (class -21); an
    array's element holds the other POD until 15,000 s, when its held 128-IPU element E stops V for
    it (warned 30 s) and runs 100 s. V goes back to the queue with 5,000 s left: class -19, ahead of
    Q (128 IPUs, 5,000 s: class -20). V restarts at 15,130 s, and Q, which needs both PODs, waits
    for it to end at 20,130 s. With V's class as it started, Q went first at 15,130 s."""
    config = get_policy("default-classes")
    alloc = Allocator(Fleet.uniform(2, MachineType("m2000")))
    assert alloc.allocate("p_v", 64) is not None and alloc.allocate("p_0", 64) is not None
    v_class = job_class(config, 0, 64, 19_990.0)
    running = [
        RunningJob("job_v", "t", 64, "p_v", 0.0, 20_000.0, v_class, preemptible=True),
        RunningJob("el_0", "u", 64, "p_0", 0.0, 15_000.0, job_class(config, 0, 64, 14_990.0)),
    ]
    held = {
        "arr": HeldArray(
            cap=1,
            members=frozenset({"el_0"}),
            waiting=(QueuedJob("el_1", "u", 128, 0.0, 100.0, priority=job_class(config, 0, 128, 100.0)),),
        )
    }
    wide = QueuedJob("job_q", "w", 128, 5.0, 5_000.0, job_class(config, 0, 128, 5_000.0), preemptible=True)
    assert v_class < wide.priority < job_class(config, 0, 64, 5_000.0)
    snapshot = Snapshot(
        now=10.0, queue=JobQueue([wide]), running=running, tenants={}, allocator=alloc, held=held
    )
    assert forecast(snapshot, config) == {"el_1": 15_030.0, "job_v": 15_130.0, "job_q": 20_130.0}


def test_a_running_job_preempted_in_the_replay_goes_back_at_the_head_of_its_tenants_work() -> None:
    """Preemptible P (tenant t, submitted at 0, started at 8, 32 IPUs to 1,008 s) runs beside an
    array's element until 100 s, when the held 64-IPU element E stops it (warned until 130 s) and
    runs 50 s. P goes back to the queue as submitted at 0, as the live queue and the simulator put it,
    so at 180 s it restarts ahead of its tenant's newer A (submitted at 5, 64 IPUs), which waits for
    P's 908 s left. Requeued as if submitted at its start (8 s), P went behind A."""
    alloc = Allocator(Fleet.uniform(1, MachineType("m2000")))
    assert alloc.allocate("p_p", 32) is not None and alloc.allocate("p_0", 32) is not None
    running = [
        RunningJob("job_p", "t", 32, "p_p", 8.0, 1008.0, preemptible=True, submitted_at=0.0),
        RunningJob("el_0", "u", 32, "p_0", 0.0, 100.0),
    ]
    held = {
        "arr": HeldArray(cap=1, members=frozenset({"el_0"}), waiting=(QueuedJob("el_1", "u", 64, 0.0, 50.0),))
    }
    newer = QueuedJob("job_a", "t", 64, 5.0, 2000.0, preemptible=True)
    snapshot = Snapshot(
        now=10.0, queue=JobQueue([newer]), running=running, tenants={}, allocator=alloc, held=held
    )
    assert forecast(snapshot, "default") == {"el_1": 130.0, "job_p": 180.0, "job_a": 1088.0}


def test_a_running_jobs_measured_progress_not_its_prediction_says_when_the_replay_frees_it() -> None:
    """job_a was predicted to end at 1,000 s; its progress (steps done of its steps, at the step time
    measured) says 600 s in one snapshot and 1,400 s in another. The forecast frees it then, with
    or without drawn run times (its end is measured, not drawn); the policy's own plan, and so the
    snapshot, keep the prediction."""
    assert end_by_progress(400.0, done=30, total=60, measured_s=300.0) == 700.0
    assert math.isnan(end_by_progress(50.0, done=0, total=60, measured_s=0.0))
    drawn = get_policy("default-classes").with_options(forecast_spread=0.3, forecast_samples=9)
    for measured in (600.0, 1400.0):
        snapshot = full_fleet()
        snapshot.running[0] = dataclasses.replace(snapshot.running[0], measured_end=measured)
        assert forecast(snapshot)["job_0"] == measured
        assert forecast(snapshot, drawn)["job_0"] == measured
        assert snapshot.running[0].expected_end == 1000.0
    # Measured, but that end has passed (its agent stopped reporting): the prediction again.
    snapshot = full_fleet()
    snapshot.running[0] = dataclasses.replace(snapshot.running[0], measured_end=5.0)
    assert forecast(snapshot)["job_0"] == 1000.0
