"""The fleet runs full: host agents keep every IPU busy, at the scale of the seeds' 64,000 IPUs.

Two measurements, each on the cloud in production shape (PostgreSQL, Redis, `ipucloud api` with one uvicorn
process per core, one `ipucloud scheduler`, host agents `ipucloud worker`, each its own process configured
only by environment, production timings: 1 s heartbeats, 10 s agent leases, time scale 1):

- `full`: 16 POD64s (1,024 IPUs), 1,024 one-IPU jobs submitted by 16 clients. Printed: how long after the
  last submission all 1,024 run at once (target 10 s), and for every job its run's wall time against its
  emulated duration (target: all done within the duration plus 10%).
- `scale`: 1,024 POD64s (65,536 IPUs) driven by a handful of agents. Long one-IPU jobs are added until 1,024,
  8,192 and 65,536 attempts run at once; at each level, over a window of steady running: control-plane
  transactions and rows written per second (PostgreSQL's own counters), CPU of every component (from /proc,
  as shares of one core), CPU per running attempt, a job's status through the API (p50/p99 of GET
  /api/v1/jobs/{id}), leases that expired (must be none: every agent is healthy), and the ledger (the sum of
  meter events must equal the tenants' counters).

    .venv/bin/python benchmarks/fleet.py full  [--agents 1] [--jobs 1024] [--pods 16]
    .venv/bin/python benchmarks/fleet.py scale [--agents 4] [--levels 1024,8192,65536] [--window 60]

It needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (as `.ci/run` starts them) and creates
scratch databases there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from benchmarks.harness import PG_DEFAULT, REDIS_DEFAULT, fresh_database, prepare, start_cloud  # noqa: E402
from tests.support.cloud import RunningCloud  # noqa: E402

# About 125 cluster seconds of ResNet-50 inference on one IPU: a minute or two of wall time at scale 1.
FULL_JOB = {"workload": {"model": "resnet50", "task": "infer", "steps": 400}, "ipus": 1}
# About four hours of ResNet-50 training on one IPU: longer than the whole measurement at scale 1.
LONG_JOB = {"workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 300_000}, "ipus": 1}

LAPSED = "SELECT count(*) FROM reconciler_actions WHERE action = 'lease_expired'"
# Jobs of the tenant whose key asks for them (the others are other tenants' and a 404 to it).
OWN_JOBS = "SELECT j.id FROM jobs j JOIN tenants t ON t.id = j.tenant_id WHERE t.name = 'bench' LIMIT 1000"

PRODUCTION = {
    "IPUCLOUD_TIME_SCALE": "1",
    "IPUCLOUD_HEARTBEAT_S": "1",
    "IPUCLOUD_LEASE_S": "10",
    "IPUCLOUD_SCHEDULER_TICK_S": "0.5",
    "IPUCLOUD_LOG_LEVEL": "WARNING",
    # Hundreds of thousands of jobs on an `internal` tenant, the operator's own.
    "IPUCLOUD_RATE_LIMIT": "100000000/minute",
}


def engine_for(db_url: str) -> Any:
    return create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))


async def _submit(url: str, key: str, bodies: list[dict[str, Any]], clients: int) -> list[str]:
    ids: list[str] = []
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60,
        limits=httpx.Limits(max_connections=clients),
    ) as c:  # fmt: skip
        queue = list(reversed(bodies))

        async def client() -> None:
            while queue:
                body = queue.pop()
                # A keep-alive connection the server closed as this request went out fails it: send it
                # again under the same Idempotency-Key, which makes the retry safe.
                for attempt in range(5):
                    try:
                        r = await c.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": body["name"]})
                        break
                    except httpx.TransportError:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.2)
                r.raise_for_status()
                ids.append(r.json()["id"])

        await asyncio.gather(*(client() for _ in range(clients)))
    return ids


def submit(cloud: RunningCloud, key: str, bodies: list[dict[str, Any]], clients: int = 16) -> list[str]:
    return asyncio.run(_submit(cloud.url, key, bodies, clients))


def count(conn: Any, sql: str, **params: Any) -> int:
    value = conn.execute(text(sql), params).scalar_one()
    conn.rollback()
    return int(value)


def wait_running(conn: Any, n: int, timeout: float) -> float:
    """Seconds until at least `n` attempts run at once."""
    t0 = time.monotonic()
    while count(conn, "SELECT count(*) FROM attempts WHERE state = 'running'") < n:
        if time.monotonic() - t0 > timeout:
            running = count(conn, "SELECT count(*) FROM attempts WHERE state = 'running'")
            raise RuntimeError(f"only {running} of {n} attempts running after {timeout:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - t0


# full -------------------------------------------------------------------------------------------------


def bench_full(args: argparse.Namespace) -> None:
    from vipu import emulator

    db_url = fresh_database(args.database_url, "ipucloud_bench_fleet")
    admin, key = prepare(db_url, pods=args.pods)
    work = Path(tempfile.mkdtemp(prefix="ipucloud-fleet-"))
    spec = emulator.WorkloadSpec(**FULL_JOB["workload"])  # type: ignore[arg-type]
    duration = emulator.predicted_runtime_s(spec, 1, "m2000")
    cloud = start_cloud(
        db_url, args.redis_url, work, admin, api_workers=os.cpu_count() or 2, worker_procs=args.agents,
        concurrency=16, scheduler=True, extra_env=PRODUCTION,
    )  # fmt: skip
    engine = engine_for(db_url)
    try:
        t0 = time.monotonic()
        ids = submit(cloud, key, [{**FULL_JOB, "name": f"full-{i}"} for i in range(args.jobs)])
        submitted = time.monotonic()
        with engine.connect() as conn:
            all_running_s = wait_running(conn, args.jobs, timeout=120)
            print(f"  submitted {len(ids)} jobs in {submitted - t0:.2f} s")
            print(f"  all {args.jobs} running at once {all_running_s:.2f} s after the last submission "
                  f"(target 10 s)")  # fmt: skip
            while count(conn, "SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')"):
                if time.monotonic() - submitted > 10 * duration + 120:
                    raise RuntimeError("the jobs did not finish")
                time.sleep(0.5)
            done = time.monotonic()
            rows = conn.execute(
                text(
                    "SELECT j.state, extract(epoch FROM a.ended_at - a.started_at), a.cluster_s "
                    "FROM jobs j JOIN attempts a ON a.job_id = j.id AND a.number = j.attempts"
                )
            ).all()
            held = count(conn, "SELECT count(*) FROM ipu_assignments")
            ledger = count(conn, "SELECT coalesce(sum(ipu_ms), 0) FROM meter_events")
            used = count(conn, "SELECT coalesce(sum(used_ipu_ms), 0) FROM tenants")
    finally:
        cloud.stop_all()
        engine.dispose()
    states = {state for state, _, _ in rows}
    ratios = sorted(float(wall) / duration for _, wall, _ in rows)
    print(f"  every job {states}; emulated duration {duration:.1f} s")
    print(f"  run wall time / emulated duration: median {statistics.median(ratios):.4f}, "
          f"max {ratios[-1]:.4f} (target at most 1.10)")  # fmt: skip
    print(f"  all done {done - submitted:.1f} s after the last submission "
          f"({(done - submitted) / duration:.3f}x the emulated duration)")  # fmt: skip
    print(f"  IPUs still held: {held}; ledger {ledger} IPU-ms = tenants' counters {used} IPU-ms: "
          f"{ledger == used}")  # fmt: skip


# scale ------------------------------------------------------------------------------------------------


def _pids(cloud: RunningCloud) -> dict[str, list[int]]:
    """Every process of each component: the component's own and its children (uvicorn, Celery)."""
    out: dict[str, list[int]] = {}
    for name, proc in cloud.procs.items():
        kind = "agents" if name.startswith("agent") else name
        out.setdefault(kind, []).extend([proc.pid, *proc.children()])
    return out


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _postgres_pids(conn: Any, database: str) -> list[int]:
    """The server processes serving the benchmark's database (not other databases on the server)."""
    pids = conn.execute(
        text("SELECT pid FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"),
        {"d": database},
    ).scalars()
    out = [int(p) for p in pids]
    conn.rollback()
    return out


def _redis_pid(url: str) -> list[int]:
    import redis as redis_lib

    return [int(redis_lib.Redis.from_url(url).info("server")["process_id"])]


def add_tenants(db_url: str, n: int) -> list[str]:
    """`n` more `internal` tenants: a plan lets one tenant run 10,000 jobs at once, and a fleet this
    size serves many tenants anyway."""
    from scheduler.db import Database
    from scheduler.services.tenancy import tenants

    db = Database(db_url)
    secret = os.environ["IPUCLOUD_SECRET_KEY"].encode()
    with db.write() as s:
        for i in range(n):
            tenants.create_tenant(
                session=s, secret=secret, name=f"team-{i}", plan="internal", quota_ipu_hours=10_000_000
            )
    with db.read() as s:
        ids = [str(t) for t in s.execute(text("SELECT id FROM tenants ORDER BY id")).scalars()]
    db.dispose()
    return ids


def submit_direct(db_url: str, tenants: list[str], names: list[str], batch: int = 1000) -> None:
    """Admit jobs, round-robin over the tenants, through the same admission service the API calls, in
    batches (the scale benchmark measures the fleet running, not 65,536 HTTP round trips)."""
    from scheduler.db import Database
    from scheduler.jobspec import JobSpec
    from scheduler.services.batch import jobs

    db = Database(db_url)
    for i in range(0, len(names), batch):
        with db.write() as s:
            outcomes = jobs.submit_jobs(
                session=s,
                requests=[
                    jobs.SubmitRequest(
                        tenants[(i + k) % len(tenants)], JobSpec.model_validate({**LONG_JOB, "name": n})
                    )
                    for k, n in enumerate(names[i : i + batch])
                ],
            )
        refused = [o for o in outcomes if not isinstance(o, jobs.Submitted)]
        assert not refused, refused[0]
    db.dispose()


def _pg_counters(conn: Any, database: str) -> tuple[int, int]:
    """(transactions committed, rows written) of the database so far."""
    row = conn.execute(
        text(
            "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted "
            "FROM pg_stat_database WHERE datname = :d"
        ),
        {"d": database},
    ).one()
    conn.rollback()
    return int(row[0]), int(row[1])


def _status_latencies(cloud: RunningCloud, key: str, job_ids: list[str], seconds: float) -> list[float]:
    lat: list[float] = []
    with cloud.http(key) as c:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            t = time.perf_counter()
            r = c.get(f"/api/v1/jobs/{job_ids[i % len(job_ids)]}")
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
            i += 1
            time.sleep(0.05)
    return sorted(lat)


def bench_scale(args: argparse.Namespace) -> None:
    db_url = fresh_database(args.database_url, "ipucloud_bench_scale")
    admin, key = prepare(db_url, pods=args.pods)
    work = Path(tempfile.mkdtemp(prefix="ipucloud-scale-"))
    cloud = start_cloud(
        db_url, args.redis_url, work, admin, api_workers=os.cpu_count() or 2, worker_procs=args.agents,
        concurrency=16, scheduler=True, extra_env=PRODUCTION,
    )  # fmt: skip
    engine = engine_for(db_url)
    database = db_url.rsplit("/", 1)[1]
    from scheduler import bus

    wake = bus.redis_from_url(args.redis_url)  # this process has no runtime of its own

    started = 0
    tenants = add_tenants(db_url, 7)  # eight tenants with the one prepare() made
    try:
        for level in args.levels:
            t0 = time.monotonic()
            submit_direct(db_url, tenants, [f"long-{i}" for i in range(started, level)])
            started = level
            bus.publish(bus.WAKE_CHANNEL, "submit", client=wake)
            with engine.connect() as conn:
                wait_running(conn, level, timeout=1800)
                ids = [str(j) for j in conn.execute(text(OWN_JOBS)).scalars()]
                conn.rollback()
            print(f"== {level} attempts running ({time.monotonic() - t0:.0f} s to submit and start them)",
                  flush=True)  # fmt: skip
            time.sleep(args.settle)  # past the start-up burst of takes, first log lines, first meter ticks
            with engine.connect() as conn:
                pids = {
                    **_pids(cloud),
                    "postgresql": _postgres_pids(conn, database),
                    "redis": _redis_pid(args.redis_url),
                }
                lapsed_before = count(conn, LAPSED)
                tx0, rows0 = _pg_counters(conn, database)
            cpu0 = {k: _cpu_s(v) for k, v in pids.items()}
            w0 = time.monotonic()
            lat = _status_latencies(cloud, key, ids, args.window)
            elapsed = time.monotonic() - w0
            cpu = {k: (_cpu_s(v) - cpu0[k]) / elapsed for k, v in pids.items()}
            with engine.connect() as conn:
                tx1, rows1 = _pg_counters(conn, database)
                lapsed = count(conn, LAPSED)
                running = count(conn, "SELECT count(*) FROM attempts WHERE state = 'running'")
                conn.execute(text("LOCK TABLE tenants IN SHARE MODE"))  # a consistent look at the ledger
                ledger = conn.execute(text("SELECT coalesce(sum(ipu_ms), 0) FROM meter_events")).scalar_one()
                used = conn.execute(text("SELECT coalesce(sum(used_ipu_ms), 0) FROM tenants")).scalar_one()
                conn.rollback()
            total = sum(cpu.values())
            print(f"  window {elapsed:.0f} s, {running} running")
            print(f"  transactions/s {(tx1 - tx0) / elapsed:,.0f}; "
                  f"rows written/s {(rows1 - rows0) / elapsed:,.0f}")  # fmt: skip
            print("  CPU (cores): " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(cpu.items()))
                  + f"; control plane {total:.3f} of {os.cpu_count()}")  # fmt: skip
            print(f"  agents' CPU per running attempt: {1e6 * cpu['agents'] / running:.1f} us/s "
                  f"({1000 * cpu['agents'] / running:.4f} ms of CPU per second)")  # fmt: skip
            p50, p99 = (1000 * lat[min(len(lat) - 1, int(q * len(lat)))] for q in (0.5, 0.99))
            print(f"  job status through the API: p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(lat)} "
                  f"requests (target p99 50 ms)")  # fmt: skip
            print(f"  leases expired while every agent was healthy: {lapsed - lapsed_before} (target 0)")
            print(f"  ledger {ledger} IPU-ms = tenants' counters {used} IPU-ms: {ledger == used}", flush=True)
    finally:
        cloud.stop_all()
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("full", "scale"))
    ap.add_argument("--database-url", default=os.environ.get("IPUCLOUD_BENCH_DATABASE_URL", PG_DEFAULT))
    ap.add_argument("--redis-url", default=os.environ.get("IPUCLOUD_BENCH_REDIS_URL", REDIS_DEFAULT))
    ap.add_argument("--agents", type=int, default=None, help="host agents (full: 1, scale: 4)")
    ap.add_argument("--pods", type=int, default=None, help="POD64s (full: 16, scale: 1024)")
    ap.add_argument("--jobs", type=int, default=1024, help="full: one-IPU jobs")
    ap.add_argument("--levels", default="1024,8192,65536", help="scale: running attempts to measure at")
    ap.add_argument("--window", type=float, default=60.0, help="scale: seconds measured at each level")
    ap.add_argument("--settle", type=float, default=20.0, help="scale: seconds waited before each window")
    args = ap.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    os.environ.setdefault("IPUCLOUD_SECRET_KEY", "benchmark-secret-" + os.urandom(8).hex())
    import redis as redis_lib

    redis_lib.Redis.from_url(args.redis_url).flushdb()
    print(f"# ipucloud fleet: {args.mode}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print("# reproduce: .venv/bin/python benchmarks/fleet.py " + " ".join(sys.argv[1:]), flush=True)
    if args.mode == "full":
        args.agents, args.pods = args.agents or 1, args.pods or 16
        bench_full(args)
    else:
        args.agents, args.pods = args.agents or 4, args.pods or 1024
        bench_scale(args)


if __name__ == "__main__":
    main()
