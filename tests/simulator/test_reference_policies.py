"""The research anchors in the simulator: Tiresias (discretised 2D least attained service,
preemptive, blind to run times) and shortest-remaining-time-first on perfect run times."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ipucloud.cli import app
from scheduler.policy import POLICIES, REFERENCES, get_policy
from scheduler.policy.preemption import PreemptionCost
from scheduler.simulator.engine import SimResult, Simulation
from scheduler.simulator.trace import TraceJob

SLICE = Path(__file__).parent / "data" / "philly-slice.csv"


def job(i: int, submit: float, size: int, duration: float, tenant: str = "t") -> TraceJob:
    return TraceJob(f"j{i}", submit, duration, size, tenant, size)


def run(
    policy: str, jobs: list[TraceJob], told: list[float] | None = None, *, free: bool = False
) -> SimResult:
    told = told if told is not None else [j.duration_s for j in jobs]
    cost = None if free else PreemptionCost()
    return Simulation(jobs, get_policy(policy), told, pods=1, preemption_cost=cost).run()


COST = PreemptionCost()


def test_both_are_registered_policies() -> None:
    assert set(REFERENCES) == {"tiresias", "srtf-oracle"} and set(REFERENCES) <= set(POLICIES)


def test_tiresias_preempts_a_job_that_has_had_more_service_and_resumes_it() -> None:
    jobs = [job(0, 0, 64, 100_000), job(1, 1000, 64, 100)]
    a, b = run("tiresias", jobs, free=True).outcomes
    # By t=1000 the first job has had 64,000 IPU-seconds: past both thresholds, it yields.
    assert b.start_s == 1000 and b.end_s == 1100
    assert a.preempted == 1 and a.start_s == 1100
    assert a.end_s == 100_100  # free preemption: resumed from the moment it stopped
    # With the emulator's costs (the default): warned, it holds its IPUs for the warning and loses
    # what it ran in it, then loads its executable and reads its checkpoint back.
    a, b = run("tiresias", jobs).outcomes
    assert b.start_s == 1000 + COST.warning_s and b.end_s == b.start_s + 100
    assert a.preempted == 1 and a.start_s == b.end_s and a.lost_s == COST.warning_s
    assert abs(a.end_s - (a.start_s + 100_000 - 1000 + COST.restart_s())) < 1e-6


def test_tiresias_does_not_use_run_times() -> None:
    jobs = [job(i, 37 * i, 1 << (i % 7), 500 + 900 * (i % 5), f"t{i % 3}") for i in range(60)]
    exact = run("tiresias", jobs)
    blind = run("tiresias", jobs, told=[1e6] * len(jobs))
    assert [(o.start_s, o.end_s) for o in exact.outcomes] == [(o.start_s, o.end_s) for o in blind.outcomes]
    # Whereas the default policy's backfill does.
    assert [o.start_s for o in run("default", jobs).outcomes] != [
        o.start_s for o in run("default", jobs, told=[1e6] * len(jobs)).outcomes
    ]


def test_srtf_runs_the_shortest_remaining_first_and_preempts_for_it() -> None:
    jobs = [job(0, 0, 64, 10_000), job(1, 10, 64, 100), job(2, 20, 64, 50_000)]
    a, b, c = run("srtf-oracle", jobs, free=True).outcomes
    assert b.start_s == 10 and a.preempted == 1
    assert a.end_s == 10_100  # resumed after the short one, with its work kept
    assert c.start_s == a.end_s  # the longest waits for both, though it came before a resumed
    a, b, c = run("srtf-oracle", jobs).outcomes
    assert b.start_s == 10 + COST.warning_s and a.preempted == 1
    assert abs(a.end_s - (b.end_s + 10_000 - 10 + COST.restart_s())) < 1e-6
    assert c.start_s == a.end_s


def test_simulate_reports_the_anchors_beside_the_baselines() -> None:
    args = ["simulate", "--trace", str(SLICE), "--pods", "1", "--limit", "200", "--json"]
    for name in ("default", "fifo-firstfit", "slurm-backfill", *REFERENCES):
        args += ["--policy", name]
    outcome = CliRunner().invoke(app, args)
    assert outcome.exit_code == 0, outcome.output
    out = json.loads(outcome.stdout)
    assert list(out) == ["default", "fifo-firstfit", "slurm-backfill", "tiresias", "srtf-oracle"]
    for row in out.values():
        assert {"avg_jct_s", "p99_jct_s", "avg_wait_s", "utilization", "fragmentation", "fairness"} <= set(
            row
        )
    assert out["srtf-oracle"]["estimates"] == "perfect"
