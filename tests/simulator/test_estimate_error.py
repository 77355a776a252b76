"""The simulator measures the wait estimate: at a submission it asks the forecast `POST /estimates`
runs (scheduler/policy/forecast.py) and compares its answer with the start that came."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from ipucloud.cli import app
from scheduler.policy import get_policy
from scheduler.simulator import ReplaySpec, replay, report
from scheduler.simulator.engine import Simulation
from scheduler.simulator.metrics import decision_hash
from scheduler.simulator.trace import TraceJob

SLICE = Path(__file__).parent / "data" / "philly-slice.csv"


def job(i: int, submit: float, size: int, duration: float, tenant: str = "t") -> TraceJob:
    return TraceJob(f"j{i}", submit, duration, size, tenant, size)


def test_with_exact_run_times_the_estimate_is_the_start_the_scheduler_makes() -> None:
    jobs = [
        job(0, 0, 32, 1000),  # half the POD64 for a while
        job(1, 5, 1, 50),  # room now: starts at once
        job(2, 10, 64, 300),  # the whole POD64: waits for job 0, with IPUs reserved
        job(3, 20, 16, 5000),  # would outlast that reservation: not backfilled, waits for job 2
        job(4, 30, 4, 100),  # ends before the reservation: backfilled at once
    ]
    result = Simulation(
        jobs, get_policy("default"), [j.duration_s for j in jobs], pods=1, estimate_every=1
    ).run()
    starts = [o.start_s for o in result.outcomes]
    assert starts == [0, 5, 1000, 1300, 30]
    estimated = [o.estimated_start_s for o in result.outcomes]
    assert all(math.isclose(e, s, abs_tol=1e-6) for e, s in zip(estimated, starts, strict=True)), estimated
    errors = report({"default": result})["default"]["estimate_error"]
    assert errors["median_abs_error_share"] == 0 and errors["within_25pct"] == 1
    assert errors["immediate_jobs"] == 3 and errors["immediate_under_60s"] == 1


def test_on_a_philly_slice_immediate_starts_are_estimated_under_a_minute() -> None:
    spec = ReplaySpec(trace=SLICE, pods=1, policies=("default", "fifo-firstfit"), estimate_every=1)
    out = report(replay(spec, spec.load()))
    for name, row in out.items():
        errors = row["estimate_error"]
        assert errors["estimated_jobs"] == row["jobs"]
        assert errors["immediate_jobs"] > 0 and errors["immediate_under_60s"] >= 0.95, (name, errors)
        assert 0 <= errors["median_abs_error_share"] < 1, (name, errors)


def test_simulate_json_reports_the_estimate_error() -> None:
    run = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(SLICE),
            "--pods",
            "1",
            "--limit",
            "150",
            "--json",
            "--estimate-every",
            "2",
        ],
    )
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout)
    assert out["default"]["estimate_error"]["estimated_jobs"] == 75


def test_the_wait_estimate_decides_nothing_and_the_decision_hash_says_so() -> None:
    """`decision_hash` digests every job's starts, end and preemptions. Asking the forecast at every
    submission, with its sampled replays, leaves it as it is; another policy changes it."""
    jobs = [job(i, 60.0 * i, 1 << (i % 5), 900.0 + 37 * i, tenant=f"t{i % 3}") for i in range(80)]
    told = [j.duration_s * (1.3 if i % 2 else 0.8) for i, j in enumerate(jobs)]
    config = get_policy("default-classes")

    def digest(policy: object = config, every: int = 0) -> str:
        return decision_hash(Simulation(jobs, policy, told, pods=1, estimate_every=every).run())

    plain = digest()
    assert len(plain) == 16 and digest() == plain
    assert digest(every=1) == plain
    assert digest(config.with_options(forecast_samples=1, forecast_spread=0.0), every=1) == plain
    assert digest(get_policy("fifo-firstfit")) != plain


def test_a_running_jobs_new_class_keeps_every_other_field() -> None:
    """The engine moves running jobs' classes field by field (`_with_priority`, for speed): a field
    added to `RunningJob` and not copied there would be lost at the first move."""
    import dataclasses

    from scheduler.policy import RunningJob
    from scheduler.simulator.engine import _with_priority

    values: dict[str, object] = {}
    for f in dataclasses.fields(RunningJob):
        kind = {"str": "x", "int": 3, "float": 2.5, "bool": True}[str(f.type)]
        values[f.name] = f"{f.name}-1" if kind == "x" else kind
    job = RunningJob(**values)  # type: ignore[arg-type]
    assert _with_priority(job, -7) == dataclasses.replace(job, priority=-7)


def test_the_error_of_preemptible_and_other_jobs_is_also_given_apart() -> None:
    """P, preemptible, is asked at 10 s and told 1,000 s (when the POD64 frees); N, not preemptible
    and submitted after it, goes first then, as the pass lets non-preemptible work lead, so P starts
    at 1,100 s: a forecast at P's submission could not know of N. N's own estimate is exact."""
    jobs = [job(0, 0, 64, 1000), job(1, 10, 64, 100), job(2, 20, 64, 100)]
    result = Simulation(
        jobs,
        get_policy("default"),
        [j.duration_s for j in jobs],
        pods=1,
        estimate_every=1,
        preemptible=[False, True, False],
    ).run()
    assert [o.first_start_s for o in result.outcomes] == [0, 1100, 1000]
    assert [o.estimated_start_s for o in result.outcomes] == [0, 1000, 1000]
    errors = report({"default": result})["default"]["estimate_error"]
    assert errors["waited_jobs"] == 2
    assert errors["waited_jobs_preemptible"] == 1 and errors["waited_jobs_not_preemptible"] == 1
    assert errors["median_abs_error_share_preemptible"] == round(100 / 1090, 4)
    assert errors["median_abs_error_share_not_preemptible"] == 0
    # Without preemptible work the answer keeps its shape.
    plain = Simulation(
        jobs, get_policy("default"), [j.duration_s for j in jobs], pods=1, estimate_every=1
    ).run()
    assert "waited_jobs_preemptible" not in report({"default": plain})["default"]["estimate_error"]


def test_a_preemptible_job_is_told_of_the_work_submitted_within_the_window_again() -> None:
    """A holds the POD64 until 2,000 s; D (non-preemptible) queued at 100 s runs next. P,
    preemptible, asked at 1,000 s, waits for D and for E, non-preemptible work submitted after it
    (1,600 s), so it starts at 2,600 s. Expecting the last 950 s's non-preemptible submissions (D)
    again over the next 950 s, the simulator's forecast tells P 2,600 s; with the window 0, 2,300 s."""
    jobs = [job(0, 0, 64, 2000), job(1, 100, 64, 300), job(2, 1000, 64, 100), job(3, 1600, 64, 300)]
    flags = [False, False, True, False]

    def told(window: float) -> float:
        result = Simulation(
            jobs,
            get_policy("default").with_options(inflow_window_s=window),
            [j.duration_s for j in jobs],
            pods=1,
            # The true run times, as such: A's measured end is then its true one, not within 5%.
            estimate_model="perfect",
            estimate_every=1,
            preemptible=flags,
        ).run()
        assert result.outcomes[2].first_start_s == 2600
        return result.outcomes[2].estimated_start_s

    assert told(950.0) == 2600
    assert told(0.0) == 2300
