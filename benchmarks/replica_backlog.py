"""How fast one serving replica (workers/serving.py) gets through a backlog at zero device time: the
serving path's own cost per request, without HTTP or the API.

N one-row envelopes of the catalogue's smallest model (HMC, batches of up to 64) are stamped 10 us apart
(100,000 requests/s arriving) and pushed into the endpoint's queue at once; the figure is the wall time
until every answer is in its reply list. At the time scale used (1,000,000) the device's time vanishes, so
on the requests' timeline each request is a batch of its own: this is the replica's worst case.

    .venv/bin/python benchmarks/replica_backlog.py [--requests 20000] [--runs 3] [--root CHECKOUT]

`--root` imports the replica from another checkout of the project (for before/after runs back to back).
It needs Redis on 127.0.0.1:6379 and uses database 13 (`--redis-url`), deleting only its own keys.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ".venv/bin/python benchmarks/replica_backlog.py"
ENDPOINT = "ep_backlog_bench"
WAITER = "wbacklog"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose replica is measured")
    ap.add_argument(
        "--redis-url", default=os.environ.get("IPUCLOUD_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
    )
    args = ap.parse_args()
    sys.path.insert(0, str(args.root.resolve()))

    import redis

    from scheduler import inference
    from scheduler.clock import Clock
    from scheduler.inference import Envelope
    from vipu.emulator import WorkloadSpec, serve_plan
    from workers.serving import ServingHost

    r = redis.Redis.from_url(args.redis_url)
    plan = serve_plan(WorkloadSpec(model="mcmc", task="infer", precision="fp32"), machine="m2000", ipus=1,
                      max_batch_size=64)  # fmt: skip
    reply = inference.reply_key(WAITER)

    def clean() -> None:
        keys = [k for k in r.scan_iter(f"{inference.PREFIX}{ENDPOINT}:*")]
        r.delete(reply, *keys)

    print(
        f"# replica backlog, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}, root {args.root}"
    )
    print(f"# reproduce: {COMMAND} " + " ".join(sys.argv[1:]), flush=True)
    rates = []
    for run in range(args.runs):
        clean()
        host = ServingHost(args.redis_url)
        host.start()
        host.add(attempt_id=1, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(1e6),
                 ready_at=time.time())  # fmt: skip
        time.sleep(1.5)  # listed as ready, batching settings read
        now = time.time()
        envs = [
            Envelope(f"b{i}", WAITER, 1, int((now + 600) * 1000), int(now * 1e6) + 10 * i).encode()
            for i in range(args.requests)
        ]
        t0 = time.perf_counter()
        r.lpush(inference.queue_key(ENDPOINT), *envs)
        while r.llen(reply) < args.requests:
            time.sleep(0.002)
        took = time.perf_counter() - t0
        host.close()
        rates.append(args.requests / took)
        load = os.getloadavg()[0]
        print(
            f"  run {run + 1}: {args.requests:,} answers in {took:.2f} s, {rates[-1]:,.0f}/s "
            f"(load average {load:.1f})"
        )
    clean()
    print(f"median {statistics.median(rates):,.0f} answers/s over {args.runs} runs")


if __name__ == "__main__":
    main()
