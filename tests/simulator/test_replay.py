"""The trace simulator on a 500-job slice of the Philly trace: deterministic, complete, and what
`ipucloud simulate` prints and writes."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from xml.etree import ElementTree

import pytest
from typer.testing import CliRunner

from ipucloud.cli import app
from scheduler.simulator import (
    Columns,
    ReplaySpec,
    TraceError,
    estimates,
    largest_partition,
    load_trace,
    replay,
    report,
)
from scheduler.simulator.estimates import ROUND_VALUES, default_limit

SLICE = Path(__file__).parent / "data" / "philly-slice.csv"
CONTRACT_KEYS = {"avg_jct_s", "p99_jct_s", "avg_wait_s", "utilization", "fragmentation", "fairness"}


def figures(spec: ReplaySpec) -> dict[str, dict]:
    out = report(replay(spec, spec.load()))
    for row in out.values():
        del row["replay_wall_s"]  # the one figure that is not a function of the inputs
    return out


def test_same_seed_same_numbers_and_every_job_runs_once() -> None:
    spec = ReplaySpec(trace=SLICE, pods=1, seed=7)
    first = replay(spec, spec.load())
    second = figures(spec)
    assert report(first).keys() == second.keys() == {"default", "fifo-firstfit", "slurm-backfill"}
    for name, result in first.items():
        row = report({name: result})[name]
        del row["replay_wall_s"]
        assert row == second[name], name
        # A job runs once as recorded; one that default preempted runs its last attempt from its
        # checkpoint (what it had left, plus the restart), so it ends sooner than a run from scratch.
        assert all(
            o.start_s >= j.submit_s
            and (
                o.end_s == o.start_s + j.duration_s
                if not o.preempted
                else o.start_s < o.end_s < o.start_s + j.duration_s + o.preempted * 60.0
            )
            for j, o in zip(result.jobs, result.outcomes, strict=True)
        )
    # Another seed draws other predictions: the policies that use them decide differently.
    assert figures(ReplaySpec(trace=SLICE, pods=1, seed=8))["default"] != second["default"]


def test_slice_figures_rank_the_policies() -> None:
    out = figures(ReplaySpec(trace=SLICE, pods=1))
    assert out["slurm-backfill"]["estimates"] == "user"  # Slurm always plans on user time limits
    assert out["slurm-backfill"]["launch_failures"] > 0  # count-only planning meets real partitions
    assert (
        out["default"]["avg_jct_s"] < out["slurm-backfill"]["avg_jct_s"] < out["fifo-firstfit"]["avg_jct_s"]
    )
    for row in out.values():
        assert row.keys() >= CONTRACT_KEYS
        assert 0 < row["utilization"] <= 1 and 0 < row["fairness"] <= 1


def test_trace_sizes_round_up_to_partitions_and_cap_at_the_fleet(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "when,secs,gpus,team\n"
        "30,5,3,b\n"  # 3 GPUs: a partition of 4
        "10,7,12,a\n"  # 12: 16
        "10,9,200,a\n"  # 200: 256, capped at the 2-POD64 fleet's 128
    )
    jobs = load_trace(
        trace, largest_partition=largest_partition(2), columns=Columns("when", "secs", "gpus", "team")
    )
    assert [(j.submit_s, j.size, j.requested_size, j.tenant) for j in jobs] == [
        (0.0, 16, 12, "a"),
        (0.0, 128, 200, "a"),
        (20.0, 4, 3, "b"),
    ]
    with pytest.raises(TraceError, match="no column"):
        load_trace(trace, largest_partition=64)


def test_estimate_models() -> None:
    jobs = load_trace(SLICE, largest_partition=64)
    limit = default_limit(jobs)
    assert limit % 86_400 == 0 and limit >= max(j.duration_s for j in jobs)
    user = estimates(jobs, "user", seed=1, limit_s=limit)
    assert all(u >= j.duration_s for u, j in zip(user, jobs, strict=True))  # time limits never cut a job
    assert all(u == limit or u in ROUND_VALUES for u in user)  # users type round numbers
    assert sum(u == limit for u in user) > len(jobs) / 20
    assert estimates(jobs, "perfect", seed=1, limit_s=limit) == [j.duration_s for j in jobs]
    assert set(estimates(jobs, "none", seed=1, limit_s=limit)) == {limit}
    predicted = estimates(jobs, "predicted", seed=1, limit_s=limit)
    assert predicted == estimates(jobs, "predicted", seed=1, limit_s=limit)
    errors = sorted(
        abs(math.log(p / j.duration_s)) for p, j in zip(predicted, jobs, strict=True) if j.duration_s
    )
    assert 0.1 < errors[len(errors) // 2] < 0.3  # the stated sigma of 0.3: a median error near 20%


def test_cli_json_and_outputs(tmp_path: Path) -> None:
    runner = CliRunner()
    out_dir = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(SLICE),
            "--pods",
            "1",
            "--limit",
            "200",
            "--json",
            "--out",
            str(out_dir),
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert set(body) == {"default", "fifo-firstfit", "slurm-backfill", "tiresias", "srtf-oracle"}
    assert all(row.keys() >= CONTRACT_KEYS for row in body.values())
    with (out_dir / "jobs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5 * 200 and {r["policy"] for r in rows} == set(body)
    for plot in ("sched-jct-cdf.svg", "sched-wait-cdf.svg", "sched-utilization.svg"):
        root = ElementTree.parse(out_dir / plot).getroot()
        assert root.tag.endswith("svg") and len(
            root.findall(".//{http://www.w3.org/2000/svg}polyline")
        ) == len(body)
    # Several policies by name, one of them an ablation; a bad one is refused before any work.
    two = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(SLICE),
            "--limit",
            "50",
            "--json",
            "--workers",
            "1",
            "--policy",
            "fifo-backfill",
            "--policy",
            "default",
        ],
    )
    assert two.exit_code == 0 and list(json.loads(two.stdout)) == ["fifo-backfill", "default"]
    bad = runner.invoke(app, ["simulate", "--trace", str(SLICE), "--policy", "lottery"])
    assert bad.exit_code == 2 and "unknown policy" in unwrapped(bad.output)
    missing = runner.invoke(app, ["simulate", "--trace", str(SLICE), "--size-column", "gpus"])
    assert missing.exit_code == 2 and "no column" in unwrapped(missing.output)


def unwrapped(output: str) -> str:
    """Typer's error panel wraps at the terminal's width and draws a border, so a long path in the
    message (a deep clone) can split the words a test looks for across lines."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", output)
