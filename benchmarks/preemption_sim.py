"""Preemptible work on the Philly trace: the work each preemption loses, and the JCT of preemptible
jobs beside the others (docs/checkpoints.md).

    .venv/bin/python benchmarks/preemption_sim.py [--trace PATH] [--fraction F] [--limit N] [--pods N]
        [--seed S] [--checkpoint-every S] [--warning S] [--json PATH]

Replays the trace (``benchmarks/data/philly.csv.gz`` by default; ``--limit`` takes the first N jobs)
on 8 POD64s under the ``default`` policy three times, through the live policy code and the real
allocator (``scheduler.simulator``):

- ``none``: no job preemptible (the baseline);
- ``warned``: a share ``--fraction`` of the jobs, drawn from the seed, preemptible, checkpointing
  every ``--checkpoint-every`` s, warned ``--warning`` s ahead of a preemption (the cloud's behaviour);
- ``unwarned``: the same jobs, stopped at once: each loses the work since its last periodic checkpoint.

It prints, per run, the preemptions, the run time each cost its victim (mean, p50, max), the average
JCT of preemptible jobs and of the others, and the command that reproduces the figures.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduler.simulator import ReplaySpec, replay, report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=REPO / "benchmarks" / "data" / "philly.csv.gz")
    ap.add_argument("--fraction", type=float, default=0.3, help="share of jobs submitted preemptible")
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    ap.add_argument("--pods", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=float, default=600.0)
    ap.add_argument("--warning", type=float, default=30.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    base = ReplaySpec(
        trace=args.trace,
        pods=args.pods,
        policies=("default",),
        seed=args.seed,
        limit=args.limit,
        checkpoint_every_s=args.checkpoint_every,
    )
    jobs = base.load()
    runs = {
        "none": replace(base, preemptible_fraction=0.0),
        "warned": replace(base, preemptible_fraction=args.fraction, warning_s=args.warning),
        "unwarned": replace(base, preemptible_fraction=args.fraction, warning_s=0.0),
    }
    figures: dict[str, dict[str, object]] = {}
    for name, spec in runs.items():
        started = time.perf_counter()
        row = report(replay(spec, jobs))["default"]
        p = row.get("preemptible") or {}
        lost = p.get("lost_per_preemption_s") or {}
        figures[name] = {
            "preemptible_jobs": p.get("jobs", 0),
            "preemptions": row["preemptions"],
            "preempted_jobs": p.get("preempted_jobs", 0),
            "lost_per_preemption_mean_s": lost.get("mean"),
            "lost_per_preemption_p50_s": lost.get("p50"),
            "lost_per_preemption_max_s": lost.get("max"),
            "avg_jct_preemptible_s": p.get("avg_jct_s"),
            "avg_jct_others_s": p.get("avg_jct_other_s", row["avg_jct_s"]),
            "avg_jct_all_s": row["avg_jct_s"],
            "utilization": row["utilization"],
            "replay_s": round(time.perf_counter() - started, 1),
        }
    print(f"{len(jobs):,} jobs of {args.trace.name} on {args.pods} POD64s (default policy), "
          f"{args.fraction:.0%} preemptible, checkpoints every {args.checkpoint_every:g} s, "
          f"warning {args.warning:g} s")  # fmt: skip
    keys = list(next(iter(figures.values())))
    print("".ljust(30) + "".join(name.rjust(14) for name in figures))
    for key in keys:
        cells = []
        for row in figures.values():
            v = row[key]
            if v is None:
                text = "-"
            elif isinstance(v, float):
                text = f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
            else:
                text = f"{v:,}"
            cells.append(text.rjust(14))
        print(key.ljust(30) + "".join(cells))
    command = ["python", "benchmarks/preemption_sim.py", "--fraction", f"{args.fraction:g}"]
    if args.limit is not None:
        command += ["--limit", str(args.limit)]
    if args.pods != 8:
        command += ["--pods", str(args.pods)]
    if args.seed:
        command += ["--seed", str(args.seed)]
    if args.checkpoint_every != 600.0:
        command += ["--checkpoint-every", f"{args.checkpoint_every:g}"]
    if args.warning != 30.0:
        command += ["--warning", f"{args.warning:g}"]
    print(f"\nreproduce: .venv/bin/{shlex.join(command)}")
    trace = args.trace.relative_to(REPO) if args.trace.is_relative_to(REPO) else args.trace
    limit = f" --limit {args.limit}" if args.limit else ""
    print(
        f"      or: .venv/bin/ipucloud simulate --trace {trace} --policy default "
        f"--preemptible-fraction {args.fraction:g}{limit}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
