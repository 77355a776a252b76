"""How far the wait estimate is from the start that came, on a slice of Philly, for one policy with
options of its own: what docs/scheduling.md ("How good is the wait estimate") measures forecast
variants with.

    .venv/bin/python benchmarks/estimate_error.py [--limit 10000] [--every 50] [--policy default-classes]
        [--option forecast_samples=5 --option forecast_spread=0.3 ...]

At every ``--every``-th submission the simulator asks the forecast `POST /estimates` runs
(scheduler/policy/forecast.py) and holds its answer against the job's first start. Printed: the
median absolute error as a share of the wait (jobs that waited over 1 s), the share within 25%, the
shares estimated more than 25% too early and too late, the signed median, the decision hash (the
forecast decides nothing: the same for every option of the forecast) and the replay's processor
seconds. The options are `PolicyConfig` fields (``scheduler/policy/config.py``); values are read as
int, float, None or text.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduler.policy import get_policy  # noqa: E402
from scheduler.policy.preemption import PreemptionCost  # noqa: E402
from scheduler.simulator import ReplaySpec  # noqa: E402
from scheduler.simulator.engine import Simulation  # noqa: E402
from scheduler.simulator.estimates import default_limit, estimates  # noqa: E402
from scheduler.simulator.metrics import decision_hash, estimate_error, summarize  # noqa: E402


def _value(text: str) -> object:
    if text == "None":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trace", type=Path, default=REPO / "benchmarks" / "data" / "philly.csv.gz")
    parser.add_argument("--limit", type=int, default=10_000, help="the first N jobs (0: the whole trace)")
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--policy", default="default-classes")
    parser.add_argument("--option", action="append", default=[], help="KEY=VALUE, a PolicyConfig field")
    args = parser.parse_args()

    options = dict(item.split("=", 1) for item in args.option)
    config = get_policy(args.policy).with_options(**{k: _value(v) for k, v in options.items()})
    spec = ReplaySpec(trace=args.trace, pods=8, seed=0, limit=args.limit or None)
    jobs = spec.load()
    told = estimates(jobs, config.estimates or "predicted", seed=0, limit_s=default_limit(jobs))
    sim = Simulation(
        jobs, config, told, pods=8, estimate_every=args.every, preemption_cost=PreemptionCost(warning_s=30.0)
    )
    processor = time.process_time()
    result = sim.run()
    cpu = time.process_time() - processor
    signed = sorted(
        (o.estimated_start_s - o.first_start_s) / (o.first_start_s - j.submit_s)
        for j, o in zip(result.jobs, result.outcomes, strict=True)
        if not math.isnan(o.estimated_start_s) and o.first_start_s - j.submit_s > 1.0
    )
    figures = {
        **estimate_error(result),
        "too_early_25pct": round(sum(1 for e in signed if e < -0.25) / len(signed), 4) if signed else None,
        "too_late_25pct": round(sum(1 for e in signed if e > 0.25) / len(signed), 4) if signed else None,
        "signed_median": round(signed[(len(signed) - 1) // 2], 4) if signed else None,
        "decision_hash": decision_hash(result),
        "avg_jct_h": round(summarize(result)["avg_jct_s"] / 3600, 3),
        "replay_cpu_s": round(cpu, 2),
    }
    print(json.dumps({"policy": args.policy, "options": options, **figures}, indent=2))
    command = [".venv/bin/python", "benchmarks/estimate_error.py", "--limit", str(args.limit)]
    command += ["--every", str(args.every), "--policy", args.policy]
    for item in args.option:
        command += ["--option", item]
    print("reproduce: " + shlex.join(command))


if __name__ == "__main__":
    main()
