"""Standard Workload Format logs (scheduler/simulator/swf.py): which jobs are kept, how cores become
IPUs and users tenants, the requested time as the user's estimate, and a replay of a real sample."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree

import pytest
from typer.testing import CliRunner

from ipucloud.cli import app
from scheduler.simulator import ReplaySpec, TraceError, estimates, replay, report
from scheduler.simulator.swf import ipus_for, load_swf, parse_swf, preemptible_queues, to_trace_jobs

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "gaia-sample.swf"
REPO = Path(__file__).resolve().parents[2]
CARRIED = REPO / "benchmarks" / "data" / "UniLu-Gaia-2014-2.swf.gz"

# job submit wait run alloc cpu mem reqp reqtime reqmem status user group exe queue part prec think
LOG = """\
; Version: 2.2
; Installation: Test cluster
; MaxProcs: 64
; Queue: 1 first
; Queue: 2 second
1   100  5   600  12 -1 -1 12  3600 -1 1 7 70 1 1 -1 -1 -1
2    50  0   300   1 -1 -1  1  1800 -1 0 8 80 1 1 -1 -1 -1
3   200 -1     0  48 -1 -1 48  7200 -1 5 7 70 1 1 -1 -1 -1
4   210 -1    -1   4 -1 -1  4  7200 -1 1 9 90 1 1 -1 -1 -1
5   220  3   900  -1 -1 -1 17   600 -1 5 9 90 1 1 -1 -1 -1
6   230  0   400   8 -1 -1  8    -1 -1 1 7 71 1 1 -1 -1 -1
7   240  0   100   8 -1 -1  8  3600 -1 2 7 70 1 1 -1 -1 -1
8   100  9    60 2004 -1 -1 2004 120 -1 1 8 80 1 1 -1 -1 -1
"""


def test_header_and_fields_are_read() -> None:
    header, jobs = parse_swf(LOG.splitlines())
    assert header["Installation"] == "Test cluster"
    assert header["Queue"] == "1 first"  # the first of a repeated key
    assert [j.number for j in jobs] == list(range(1, 9))
    first = jobs[0]
    assert (first.submit_s, first.wait_s, first.run_s) == (100, 5, 600)
    assert (first.allocated, first.requested, first.requested_s) == (12, 12, 3600)
    assert (first.status, first.user, first.group, first.queue) == (1, 7, 70, 1)


def test_a_line_without_18_fields_is_refused() -> None:
    with pytest.raises(TraceError, match=r"line 2 .* 17 fields"):
        parse_swf(["; header", "1 0 0 10 1 -1 -1 1 60 -1 1 1 1 1 1 -1 -1"])
    with pytest.raises(TraceError, match="line 1"):
        parse_swf(["1 0 0 ten 1 -1 -1 1 60 -1 1 1 1 1 1 -1 -1 -1"])


def test_jobs_that_never_ran_and_partial_lines_are_dropped_failures_that_ran_kept() -> None:
    _, raw = parse_swf(LOG.splitlines())
    jobs = to_trace_jobs(raw, largest_partition=512)
    # 3: cancelled before it started; 4: run time unknown; 7: a partial execution (status 2).
    # 2 failed and 5 was cancelled, but both ran: they held their processors, so they stay.
    # Submission order, the log's order among equal times: 2 (at 50), 1 and 8 (at 100), 5, 6.
    assert [j.duration_s for j in jobs] == [300, 600, 60, 900, 400]
    assert [j.submit_s for j in jobs] == [0, 50, 50, 170, 180]
    assert [j.id for j in jobs] == [f"j{i:06d}" for i in range(5)]


def test_cores_become_power_of_two_partitions_capped_at_the_fleet() -> None:
    assert [ipus_for(c, 4) for c in (1, 4, 5, 12, 13, 17, 2004)] == [1, 1, 2, 3, 4, 5, 501]
    _, raw = parse_swf(LOG.splitlines())
    jobs = {j.duration_s: j for j in to_trace_jobs(raw, largest_partition=64)}
    assert jobs[300].size == 1  # 1 core
    assert jobs[600].size == 4  # 12 cores: 3 IPUs, a 4-IPU partition
    assert (jobs[900].requested_size, jobs[900].size) == (5, 8)  # allocation unknown: the 17 requested
    assert jobs[400].size == 2  # 8 cores
    assert (jobs[60].requested_size, jobs[60].size) == (501, 64)  # the whole cluster, capped
    eight = {j.duration_s: j.size for j in to_trace_jobs(raw, largest_partition=512, cores_per_ipu=12)}
    assert eight[600] == 1 and eight[60] == 256
    with pytest.raises(TraceError):
        to_trace_jobs(raw, largest_partition=64, cores_per_ipu=0)


def test_users_are_tenants_or_groups_on_request() -> None:
    _, raw = parse_swf(LOG.splitlines())
    assert {j.tenant for j in to_trace_jobs(raw, largest_partition=64)} == {"u7", "u8", "u9"}
    by_group = {j.duration_s: j.tenant for j in to_trace_jobs(raw, largest_partition=64, tenant_by="group")}
    assert by_group[600] == "g70" and by_group[400] == "g71"


def test_requested_time_is_the_user_estimate_never_below_the_run() -> None:
    _, raw = parse_swf(LOG.splitlines())
    jobs = {j.duration_s: j for j in to_trace_jobs(raw, largest_partition=64)}
    assert jobs[600].requested_s == 3600
    assert jobs[900].requested_s == 900  # asked for 600 s, ran 900: the scheduler's grace, not a shorter ask
    assert jobs[400].requested_s is None  # unknown in the log
    ordered = to_trace_jobs(raw, largest_partition=64)
    told = estimates(ordered, "user", seed=0, limit_s=86_400)
    by_run = dict(zip([j.duration_s for j in ordered], told, strict=True))
    assert by_run[600] == 3600 and by_run[900] == 900 and by_run[300] == 1800
    assert by_run[400] >= 400  # modelled, as for a trace without requests
    capped = estimates(ordered, "user", seed=0, limit_s=1000)
    assert dict(zip([j.duration_s for j in ordered], capped, strict=True))[600] == 1000
    # Requests replace only the user model: the others stay what they were.
    assert estimates(ordered, "perfect", seed=0, limit_s=86_400) == [j.duration_s for j in ordered]


def test_slices_keep_submission_order() -> None:
    _, raw = parse_swf(LOG.splitlines())
    whole = to_trace_jobs(raw, largest_partition=64)
    part = to_trace_jobs(raw, largest_partition=64, start_row=1, limit=2)
    assert [j.duration_s for j in part] == [j.duration_s for j in whole[1:3]]
    assert part[0].submit_s == 0


def test_gzip_and_plain_logs_read_alike(tmp_path: Path) -> None:
    packed = tmp_path / "sample.swf.gz"
    packed.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    plain = load_swf(SAMPLE, largest_partition=512)
    assert load_swf(packed, largest_partition=512) == plain
    assert len(plain) == 300  # the first 300 jobs of Gaia all ran
    assert {j.size for j in plain} == {1, 2, 4, 8, 16, 32, 64}  # every partition size up to a POD64
    with pytest.raises(TraceError, match="cannot read"):
        load_swf(tmp_path / "missing.swf", largest_partition=512)


def test_a_replay_of_the_gaia_sample_under_a_baseline_and_an_anchor() -> None:
    spec = ReplaySpec(trace=SAMPLE, pods=1, policies=("slurm-backfill", "default-classes", "tiresias"))
    jobs = spec.load()
    assert len(jobs) == 300 and max(j.size for j in jobs) <= 64
    results = replay(spec, jobs)
    figures = report(results)
    for name, result in results.items():
        assert all(o.end_s >= o.start_s >= j.submit_s for j, o in zip(jobs, result.outcomes, strict=True)), (
            name
        )
        assert figures[name]["avg_jct_s"] > 0
    # slurm-backfill reserves on the log's requests, so its numbers differ from a modelled request's.
    modelled = [replace(j, requested_s=None) for j in jobs]
    again = report(replay(ReplaySpec(trace=SAMPLE, pods=1, policies=("slurm-backfill",)), modelled))
    assert again["slurm-backfill"]["avg_jct_s"] != figures["slurm-backfill"]["avg_jct_s"]


def test_the_carried_gaia_log_is_whole() -> None:
    with gzip.open(CARRIED, "rt") as handle:
        header, raw = parse_swf(handle)
    assert header["Installation"] == "UNILU Gaia Cluster" and header["MaxProcs"] == "2004"
    assert len(raw) == int(header["MaxJobs"]) == 51_987
    jobs = to_trace_jobs(raw, largest_partition=512)
    assert len(jobs) == 51_859  # 128 never ran
    assert len({j.tenant for j in jobs}) == 84
    assert max(j.size for j in jobs) == 256


def test_ipucloud_simulate_and_the_docs_plots_read_an_swf_log(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(SAMPLE),
            "--pods",
            "1",
            "--limit",
            "120",
            "--json",
            "--out",
            str(tmp_path / "r"),
            "--policy",
            "default",
            "--policy",
            "fifo-firstfit",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert set(body) == {"default", "fifo-firstfit"}
    plotted = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "plot_traces.py"),
            "--run",
            f"Gaia, a slice={tmp_path / 'r'}",
            "--out",
            str(tmp_path / "img"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for name, shapes in (("jct-cdf", "polyline"), ("avg-jct", "rect")):
        root = ElementTree.parse(tmp_path / "img" / f"trace-gaia-{name}.svg").getroot()
        drawn = root.findall(f".//{{http://www.w3.org/2000/svg}}{shapes}")
        assert len(drawn) >= 2, (name, plotted.stdout)
    hours = {p: body[p]["avg_jct_s"] / 3600 for p in body}
    for policy, value in hours.items():
        assert f"{policy}: avg JCT {value:,.2f} h" in plotted.stdout


def test_the_benchmark_replays_an_swf_log_and_merges_replays_made_apart(tmp_path: Path) -> None:
    script = str(REPO / "benchmarks" / "simulate_philly.py")

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, script, *args], capture_output=True, text=True, timeout=300, check=True
        )
        return done.stdout

    names = ("default", "fifo-firstfit")
    for policy in names:
        out = run(
            *("--trace", str(SAMPLE), "--pods", "1", "--limit", "100", "--policy", policy),
            "--json",
            str(tmp_path / policy),
        )
        assert "100 jobs on 1 POD64" in out
        assert "simulate_philly.py --trace tests/simulator/data/gaia-sample.swf --pods 1" in out
    merged = run(*(arg for policy in names for arg in ("--merge", str(tmp_path / policy)))).splitlines()
    assert merged[1].split() == list(names)
    avg = next(line for line in merged if line.startswith("avg JCT (h)"))
    hours = [json.loads((tmp_path / p).read_text())[p]["avg_jct_s"] / 3600 for p in names]
    assert avg.split()[3:] == [f"{v:,.2f}" for v in hours]


def test_the_queues_the_header_calls_preemptible_are_replayed_preemptible() -> None:
    """#31: Gaia's best-effort queue was preemptible under OAR; the replay marks its jobs so (any job
    that is not may stop them), and the seeded draw of other preemptible work is unchanged by it."""
    described = LOG.replace(
        "; Queue: 1 first\n; Queue: 2 second\n",
        "; Queue: 1 - Normal jobs queue - normal priority - jobs are not preemptible\n"
        "; Queue: 2 - Besteffort jobs queue - low priority - besteffort jobs can be preempted by "
        "normal jobs.\n",
    ).replace(" 8 80 1 1 ", " 8 80 1 2 ")  # user 8's jobs (2 and 8) in the best-effort queue
    lines = described.splitlines()
    assert preemptible_queues(lines) == {2}
    assert preemptible_queues(LOG.splitlines()) == frozenset()  # queues named, none preemptible
    _, raw = parse_swf(lines)
    jobs = to_trace_jobs(raw, largest_partition=512, preemptible=preemptible_queues(lines))
    assert [j.tenant for j in jobs if j.preemptible] == ["u8", "u8"]
    assert len(jobs) == 5
    assert ReplaySpec(trace=SAMPLE).preemptible(jobs) == [j.preemptible for j in jobs]
    drawn = ReplaySpec(trace=SAMPLE, preemptible_fraction=0.5).preemptible(jobs)
    unmarked = ReplaySpec(trace=SAMPLE, preemptible_fraction=0.5).preemptible(
        [replace(j, preemptible=False) for j in jobs]
    )
    assert drawn == [d or j.preemptible for d, j in zip(unmarked, jobs, strict=True)]


def test_the_carried_gaia_logs_best_effort_jobs_are_preemptible() -> None:
    jobs = load_swf(CARRIED, largest_partition=512)
    assert sum(j.preemptible for j in jobs) == 14_902  # the best-effort queue's jobs that ran
