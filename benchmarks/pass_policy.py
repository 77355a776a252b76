"""The policy's share of a scheduling pass at the seeds' scale: 10,000 queued jobs of 1 to 16 IPUs on
1,024 POD64s (65,536 IPUs), in-process (no database).

Times, alternating, what a pass cost in the policy before issue 35 when its forecast was due (the
forecast's replay, then the decision) and what it costs now when every job starts (the decision
alone: the forecast is made only when a job is left waiting). CPU time is printed beside wall time,
since a shared machine stretches the latter.

    .venv/bin/python benchmarks/pass_policy.py [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.policy import get_policy
from scheduler.policy.forecast import forecast
from scheduler.policy.model import QueuedJob, Snapshot
from scheduler.policy.pipeline import decide
from vipu.allocator import Allocator
from vipu.topology import Fleet

SIZES = [1, 1, 1, 1, 2, 4, 8, 16, 1, 2]  # as benchmarks/control_plane.py's placement figure


def snapshot(jobs: int, pods: int) -> Snapshot:
    queued = [
        QueuedJob(
            id=f"job{i:05d}",
            tenant_id="t",
            size=SIZES[i % len(SIZES)],
            submitted_at=i * 1e-3,
            predicted_runtime_s=600.0,
        )
        for i in range(jobs)
    ]
    return Snapshot.build(now=100.0, queued=queued, allocator=Allocator(Fleet.uniform(pods)), arrivals=queued)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=1024)
    args = parser.parse_args()
    policy = get_policy("default")
    for _ in range(args.reps):
        for label, forecast_first in (("forecast + decide (before)", True), ("decide (now)", False)):
            snap = snapshot(args.jobs, args.pods)
            cpu, wall = time.process_time(), time.perf_counter()
            if forecast_first:
                forecast(snap, policy, budget_s=0.5)
            decision = decide(snap, policy)
            print(
                f"{label:<28} {len(decision.starts)} started, {len(decision.waits)} waiting: "
                f"cpu {time.process_time() - cpu:.2f} s, wall {time.perf_counter() - wall:.2f} s, "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    print(f"# reproduce: .venv/bin/python benchmarks/pass_policy.py --reps {args.reps}")


if __name__ == "__main__":
    main()
