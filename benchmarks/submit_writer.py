"""The submit writer's CPU per batch, in process, on PostgreSQL: `jobs.submit_jobs` as the API's writer
thread runs it (scheduler/services/batch/submitter.py), without HTTP, wrk or a second process.

Batches of `--size` one-step jobs of one tenant (the benchmark's submission, benchmarks/control_plane.py)
are admitted one after another, each in its own transaction, with the answer rendered as the writer
renders it; the CPU this process spends on each (SQLAlchemy, psycopg and admission) is timed with
`time.process_time`, and the batch's wall time beside it (the difference is PostgreSQL's work and
the waits of each round trip). The end-to-end figures (`submit_cpu.py`, `control_plane.py`) move by a
third with the machine's other load; this one moves much less, so two versions compare here first
(run each from its own checkout, one after the other).

    .venv/bin/python benchmarks/submit_writer.py [--size 5] [--batches 400] [--db-name sw_bench]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.control_plane import ONE_STEP_JOB  # noqa: E402
from benchmarks.harness import PG_DEFAULT, fresh_database, prepare  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", default=os.environ.get("IPUCLOUD_BENCH_DATABASE_URL", PG_DEFAULT))
    ap.add_argument("--db-name", default="ipucloud_submit_writer", help="made (dropped first) on that server")
    ap.add_argument("--size", type=int, default=5, help="jobs a batch (wrk's 16 clients: 5-8)")
    ap.add_argument("--batches", type=int, default=400, help="timed batches, after 20 to warm up")
    args = ap.parse_args()
    os.environ.setdefault("IPUCLOUD_SECRET_KEY", "benchmark-secret-" + os.urandom(8).hex())

    from sqlalchemy import select

    from api.views import render_submitted
    from scheduler.db import Database
    from scheduler.jobspec import JobSpec
    from scheduler.models import Tenant
    from scheduler.services.batch import jobs

    db_url = fresh_database(args.database_url, args.db_name)
    prepare(db_url, pods=16)
    db = Database(db_url)  # the API's engine
    with db.read() as s:
        tenant_id = s.execute(select(Tenant.id).where(Tenant.name == "bench")).scalar_one()
    spec = JobSpec.model_validate(ONE_STEP_JOB)
    # As the writer keeps it across batches; a checkout from before it (e7ae5c7 and older) has none, so
    # that this file, copied there, times it too.
    memo = {"compiled": jobs.CompiledKeys()} if hasattr(jobs, "CompiledKeys") else {}
    load0 = os.getloadavg()[0]
    cpu_ms: list[float] = []
    wall_ms: list[float] = []
    for n in range(20 + args.batches):
        requests = [jobs.SubmitRequest(tenant_id, spec) for _ in range(args.size)]
        c0, w0 = time.process_time(), time.perf_counter()
        with db.write() as s:
            out = jobs.submit_jobs(session=s, requests=requests, render=render_submitted, **memo)
        for o in out:
            assert isinstance(o, jobs.Submitted), o
            o.job.submit_response or render_submitted(o.job)
        if n >= 20:
            cpu_ms.append(1000 * (time.process_time() - c0))
            wall_ms.append(1000 * (time.perf_counter() - w0))
    db.dispose()
    q1, median, q3 = statistics.quantiles(cpu_ms, n=4)
    print(
        f"batches of {args.size}: writer CPU {median:.2f} ms a batch (quartiles {q1:.2f}-{q3:.2f}), "
        f"{median / args.size:.3f} ms a job; wall {statistics.median(wall_ms):.2f} ms a batch (the rest is "
        f"PostgreSQL's work and the round trips); load average {load0:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print("# reproduce: .venv/bin/python benchmarks/submit_writer.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
