"""Replay the Philly trace on a mixed fleet: heterogeneity-aware placement against a type-blind baseline.

    .venv/bin/python benchmarks/simulate_mixed_fleet.py [--trace PATH] [--fleet DESC] [--limit N]
        [--seed S] [--workers N] [--plots DIR] [--json PATH]

The fleet is by default 4 POD64s of IPU-M2000, 2 of Bow-2000 and 32 Dell DSS 8440 servers (896 IPUs:
256 GC200, 128 Bow, 512 GC2). Every job is given a catalogue workload (seeded) and may run on any type
it fits on, for as long as the emulator predicts there (scheduler/simulator/machines.py). Two policies
replay it through the live policy code and the real allocator: `default` (a job runs where it is
predicted to finish first) and `type-blind` (the same, but a job takes the first type with room).

It prints both policies' figures, the jobs and average JCT per type, checks the target (the default's
average JCT at most 0.8 of the type-blind baseline's) and the command that reproduces them. The trace
is ``benchmarks/data/philly.csv.gz``, carried in the repository.
``--plots DIR`` writes the JCT and wait CDFs there (docs/img holds the committed ones).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduler.simulator import ReplaySpec, replay, report  # noqa: E402
from scheduler.simulator.svg import cdf_chart  # noqa: E402
from vipu.topology import Fleet  # noqa: E402

DEFAULT_FLEET = "4xm2000,2xbow,32xdss8440"
POLICIES = ("default", "type-blind")
TARGET = 0.8
ROWS = (
    ("avg JCT (h)", "avg_jct_s", 3600),
    ("p50 JCT (h)", "p50_jct_s", 3600),
    ("p99 JCT (h)", "p99_jct_s", 3600),
    ("avg wait (h)", "avg_wait_s", 3600),
    ("p99 wait (h)", "p99_wait_s", 3600),
    ("makespan (d)", "makespan_s", 86400),
    ("utilisation", "utilization", None),
    ("fairness (Jain)", "fairness", None),
    ("backfilled jobs", "backfilled", None),
    ("replay (s)", "replay_wall_s", None),
)


def default_trace() -> Path:
    """The Philly trace the repository carries (benchmarks/data/philly-README.md says what it is)."""
    return REPO / "benchmarks" / "data" / "philly.csv.gz"


def table(figures: dict[str, dict]) -> str:
    names = list(figures)
    lines = ["".ljust(18) + "".join(n.rjust(14) for n in names)]
    for label, key, scale in ROWS:
        cells = []
        for name in names:
            value = figures[name][key]
            if scale:
                text = f"{value / scale:,.2f}"
            elif key == "replay_wall_s":
                text = f"{value:,.1f}"
            else:
                text = f"{value:,}" if isinstance(value, int) else f"{value:.4f}"
            cells.append(text.rjust(14))
        lines.append(label.ljust(18) + "".join(cells))
    kinds = sorted({k for f in figures.values() for k in f.get("by_machine_type", {})})
    for kind in kinds:
        cells = []
        for name in names:
            row = figures[name].get("by_machine_type", {}).get(kind, {"jobs": 0, "avg_jct_s": 0.0})
            cells.append(f"{row['jobs']:,} / {row['avg_jct_s'] / 3600:,.1f}".rjust(14))
        lines.append(f"{kind} jobs / JCT h".ljust(18) + "".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=default_trace())
    parser.add_argument("--fleet", default=DEFAULT_FLEET, help="fleet description (default %(default)s)")
    parser.add_argument("--limit", type=int, help="replay only the first N jobs (in time order)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="policies replayed in parallel")
    parser.add_argument("--plots", type=Path, help="write the JCT and wait CDFs here")
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    args = parser.parse_args()

    fleet = Fleet.build(args.fleet)
    spec = ReplaySpec(trace=args.trace, fleet=args.fleet, policies=POLICIES, seed=args.seed, limit=args.limit)
    jobs = spec.load()
    started = time.perf_counter()
    results = replay(spec, jobs, workers=args.workers)
    wall = time.perf_counter() - started
    figures = report(results)
    types = ", ".join(
        f"{sum(fleet.layout_of(p).ipus for p in fleet.pods_of_type(k)):,} {k.value}"
        for k in fleet.machine_types
    )
    print(f"{args.trace}: {len(jobs):,} jobs on {args.fleet} ({fleet.ipus:,} IPUs: {types})")
    print(
        f"estimates: predicted (x the emulator's run time per type), seed {args.seed}; {wall:.0f} s for both"
    )
    print(table(figures))
    ratio = figures["default"]["avg_jct_s"] / figures["type-blind"]["avg_jct_s"]
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(f"\n[{verdict}] default avg JCT / type-blind avg JCT = {ratio:.3f} (target <= {TARGET})")
    if args.plots is not None:
        args.plots.mkdir(parents=True, exist_ok=True)
        title = f"Philly, {len(jobs):,} jobs on {args.fleet}"
        jct = {
            n: [o.end_s - j.submit_s for j, o in zip(r.jobs, r.outcomes, strict=True)]
            for n, r in results.items()
        }
        wait = {
            n: [o.start_s - j.submit_s for j, o in zip(r.jobs, r.outcomes, strict=True)]
            for n, r in results.items()
        }
        for name, chart in (
            ("mixed-jct-cdf.svg", cdf_chart(jct, title=f"Job completion time, {title}", x_label="JCT")),
            ("mixed-wait-cdf.svg", cdf_chart(wait, title=f"Queueing delay, {title}", x_label="wait")),
        ):
            path = args.plots / name
            path.write_text(chart)
            print(f"wrote {path}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {args.json}")
    command = [".venv/bin/python", "benchmarks/simulate_mixed_fleet.py", "--seed", str(args.seed)]
    if args.fleet != DEFAULT_FLEET:
        command += ["--fleet", args.fleet]
    if args.limit is not None:
        command += ["--limit", str(args.limit)]
    print("\nreproduce: " + shlex.join(command))


if __name__ == "__main__":
    main()
