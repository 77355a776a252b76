"""Variants of the default policy on the Philly trace: what its placement and its aging cost or buy.

    .venv/bin/python benchmarks/default_variants.py default,default-firstfit,default-aging1d [LIMIT]

(names: default, default-firstfit, default-nohints, default-aging1d, fifo-backfill)

Each named variant replays the trace (8 POD64 of IPU-M2000, seed 0, ``predicted`` estimates) and
prints one JSON line: the headline figures, average JCT by job size (hours), the tenants with the
most jobs in the top 1% of JCT, and those jobs' average run time. ``default-nohints`` is ``default``
without predicted ends passed to the placement policy; ``default-aging1d`` ages waiting jobs' fair-
share standing by half every day instead of every three (docs/scheduling.md says what they show).
"""

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from scheduler.policy import get_policy  # noqa: E402
from scheduler.simulator import ReplaySpec  # noqa: E402
from scheduler.simulator.engine import Simulation  # noqa: E402
from scheduler.simulator.estimates import default_limit, estimates  # noqa: E402
from scheduler.simulator.metrics import summarize  # noqa: E402

spec = ReplaySpec(
    trace=REPO / "benchmarks" / "data" / "philly.csv.gz",
    pods=8,
    limit=int(sys.argv[2]) if len(sys.argv) > 2 else None,
)
jobs = spec.load()
told = estimates(jobs, "predicted", seed=0, limit_s=default_limit(jobs))
variants = {
    "default-nohints": get_policy("default").with_options(name="default-nohints", runtime_hints=False),
    "default-aging1d": get_policy("default").with_options(name="default-aging1d", aging_s=86400.0),
    "default": get_policy("default"),
    "default-firstfit": get_policy("default-firstfit"),
    "fifo-backfill": get_policy("fifo-backfill"),
}
chosen = sys.argv[1].split(",")
out = {}
for name in chosen:
    t = time.time()
    r = Simulation(jobs, variants[name], told, pods=8).run()
    s = summarize(r)
    # who is in the tail: JCT by size class and tenant share of the top 1%
    jct = [(o.end_s - j.submit_s, j) for j, o in zip(r.jobs, r.outcomes, strict=True)]
    jct.sort(key=lambda x: x[0])
    tail = jct[int(0.99 * len(jct)) :]
    by_size = {}
    for v, j in jct:
        by_size.setdefault(j.size, []).append(v)
    tenants = {}
    for _, j in tail:
        tenants[j.tenant] = tenants.get(j.tenant, 0) + 1
    out[name] = {
        k: s[k]
        for k in (
            "avg_jct_s",
            "p50_jct_s",
            "p99_jct_s",
            "avg_wait_s",
            "fairness",
            "fragmentation",
            "refused_while_free",
            "utilization",
        )
    }
    out[name]["avg_jct_h_by_size"] = {k: round(sum(v) / len(v) / 3600, 2) for k, v in sorted(by_size.items())}
    out[name]["tail_tenants"] = dict(sorted(tenants.items(), key=lambda x: -x[1])[:5])
    out[name]["tail_avg_duration_h"] = round(sum(j.duration_s for _, j in tail) / len(tail) / 3600, 1)
    out[name]["wall_s"] = round(time.time() - t, 1)
    print(name, json.dumps(out[name]), flush=True)
