"""Control-plane speed, in production shape, side by side with Slurm when asked.

Starts the cloud as production runs it (PostgreSQL, Redis, `ipucloud api` with one uvicorn process per core,
one scheduler, workers) and measures, over repeated runs, printing min, median and max of each figure:

- submit throughput: accepted jobs per second from 1 and from 16 concurrent clients (wrk), with p50/p99
  latency; the scheduler is stopped while it runs, as Slurm's figure is measured with held jobs;
- the floors: the same load against a bare endpoint doing one durable INSERT per request, and against one
  doing the same INSERTs group-committed (one transaction per batch of what arrived together,
  benchmarks/floor_app.py);
- start latency: submission to `running` on a free partition, p50 and p99 over 200 jobs, one at a time;
- short-job throughput: 2,000 one-step jobs end to end (submitted, placed, run, metered, freed),
  submitted by h2load and again by 16 httpx clients in this process;
- scheduler cost: time to place 10,000 queued jobs on a 1,024-POD64 fleet (65,536 IPUs).

With `--vs-slurm` it installs and starts Slurm 22.05 from Debian with the scripts in `benchmarks/slurm/`,
runs their equivalents in the same run and prints the ratios.

    .venv/bin/python benchmarks/control_plane.py [--reps 3] [--vs-slurm]
        [--only submit,floor,latency,throughput,placement]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    PG_DEFAULT,
    REDIS_DEFAULT,
    Figure,
    Report,
    fresh_database,
    prepare,
    start_cloud,
)
from tests.support.cloud import RunningCloud, free_port  # noqa: E402

ONE_STEP_JOB = {"name": "tiny", "workload": {"model": "mcmc", "task": "infer", "steps": 1}, "ipus": 1}
SLURM_DIR = ROOT / "benchmarks" / "slurm"


# Production timing for the control plane (heartbeats every second, 10 s leases, a 0.5 s tick), but
# the emulated device's own time compressed: a one-step job spends about 10 s of cluster time
# loading its executable onto the IPUs, which at one cluster second per wall second would make
# "short-job throughput" a measure of the emulated load time. Slurm's trivial job is `true`; at
# 1,000 cluster seconds per wall second ours spends about 10 ms of wall time on the device.
BENCH_ENV = {
    "IPUCLOUD_TIME_SCALE": "1000",
    "IPUCLOUD_HEARTBEAT_S": "1",
    "IPUCLOUD_LEASE_S": "10",
    "IPUCLOUD_SCHEDULER_TICK_S": "0.5",
}


# Load ---------------------------------------------------------------------------------------------


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
done = function(summary, latency, requests)
  io.write(string.format("RESULT %%d %%d %%d %%d %%f %%f\\n", summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


def wrk(
    url: str, body: dict[str, Any], key: str, *, clients: int, seconds: int
) -> tuple[float, float, float, int]:
    """(accepted jobs/s, p50 ms, p99 ms, errors) from `clients` keep-alive connections."""
    if shutil.which("wrk") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT % (json.dumps(body), key))
        script = f.name
    threads = min(clients, 2)
    out = subprocess.run(
        [
            "wrk",
            "-t",
            str(threads),
            "-c",
            str(clients),
            "-d",
            f"{seconds}s",
            "-s",
            script,
            "--timeout",
            "5s",
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(script)
    m = re.search(r"RESULT (\d+) (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+)", out)
    assert m, out
    requests, bad_status, sock_errors, duration_us = (int(m.group(i)) for i in range(1, 5))
    ok = requests - bad_status
    return (
        ok / (duration_us / 1e6),
        float(m.group(5)) / 1000,
        float(m.group(6)) / 1000,
        bad_status + sock_errors,
    )


def bench_submit(report: Report, cloud: RunningCloud, key: str, seconds: int) -> None:
    url = f"{cloud.url}/api/v1/jobs"
    for clients in (1, 16):
        rate, p50, p99, errors = wrk(url, ONE_STEP_JOB, key, clients=clients, seconds=seconds)
        report.add(f"submit_{clients}_clients_jobs_per_s", "jobs/s", rate)
        report.add(f"submit_{clients}_clients_p50_ms", "ms", p50)
        report.add(f"submit_{clients}_clients_p99_ms", "ms", p99)
        if errors:
            print(f"  ({errors} requests failed)")


def bench_floor(report: Report, db_url: str, seconds: int, workers: int) -> None:
    port = free_port()
    env = {**os.environ, "FLOOR_DATABASE_URL": db_url}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "benchmarks.floor_app:app",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        for clients in (1, 16):
            rate, _p50, p99, _ = wrk(
                f"http://127.0.0.1:{port}/jobs", ONE_STEP_JOB, "floor", clients=clients, seconds=seconds
            )
            report.add(f"floor_{clients}_clients_inserts_per_s", "inserts/s", rate)
            report.add(f"floor_{clients}_clients_p99_ms", "ms", p99)
        # The group-commit floor: the same INSERTs, one transaction per batch of what arrived together.
        rate, _p50, p99, _ = wrk(
            f"http://127.0.0.1:{port}/jobs-grouped", ONE_STEP_JOB, "floor", clients=16, seconds=seconds
        )
        report.add("floor_group_16_clients_inserts_per_s", "inserts/s", rate)
        report.add("floor_group_16_clients_p99_ms", "ms", p99)
        # The same batches written as one multi-row INSERT each instead of a pipelined executemany.
        rate, _p50, p99, _ = wrk(
            f"http://127.0.0.1:{port}/jobs-grouped-values", ONE_STEP_JOB, "floor", clients=16, seconds=seconds
        )
        report.add("floor_group_values_16_clients_inserts_per_s", "inserts/s", rate)
        report.add("floor_group_values_16_clients_p99_ms", "ms", p99)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


def bench_latency(report: Report, cloud: RunningCloud, key: str, db_url: str, n: int) -> None:
    """Submit one job at a time on an idle cloud; time from the client's send to the attempt's start."""
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    lat: list[float] = []
    with cloud.http(key) as c:
        for _ in range(n):
            t0 = time.time()
            r = c.post("/api/v1/jobs", json=ONE_STEP_JOB)
            r.raise_for_status()
            job_id = r.json()["id"]
            started = None
            deadline = time.monotonic() + 30
            with engine.connect() as conn:
                while started is None and time.monotonic() < deadline:
                    started = conn.execute(
                        text("SELECT started_at FROM attempts WHERE job_id = :j AND started_at IS NOT NULL"),
                        {"j": job_id},
                    ).scalar()
                    conn.rollback()
                    if started is None:
                        time.sleep(0.001)
                while conn.execute(text("SELECT state FROM jobs WHERE id = :j"), {"j": job_id}).scalar() in (
                    "queued",
                    "running",
                ):
                    conn.rollback()
                    time.sleep(0.005)
            assert started is not None, "job did not start in 30 s"
            # Stored as naive UTC; the client and the worker share this machine's clock.
            lat.append(started.replace(tzinfo=UTC).timestamp() - t0)
    engine.dispose()
    lat.sort()
    report.add("start_latency_p50_ms", "ms", 1000 * lat[len(lat) // 2])
    report.add("start_latency_p99_ms", "ms", 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))])


async def _submit_many(url: str, key: str, n: int, clients: int) -> None:
    async with httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
        limits=httpx.Limits(max_connections=clients),
    ) as c:
        queue = list(range(n))

        async def client() -> None:
            while queue:
                queue.pop()
                r = await c.post("/api/v1/jobs", json=ONE_STEP_JOB)
                r.raise_for_status()

        await asyncio.gather(*(client() for _ in range(clients)))


def _submit_with_h2load(url: str, key: str, n: int, clients: int) -> None:
    """Exactly n POSTs from `clients` keep-alive HTTP/1.1 connections (h2load --h1; wrk runs for a
    duration, not a count)."""
    if shutil.which("h2load") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "nghttp2-client"], check=True, capture_output=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(json.dumps(ONE_STEP_JOB))
        body = f.name
    try:
        out = subprocess.run(
            [
                *("h2load", "--h1", "-n", str(n), "-c", str(clients), "-t", "2", "-d", body),
                *("-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {key}"),
                f"{url}/api/v1/jobs",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(body)
    m = re.search(r"status codes: (\d+) 2xx", out)
    assert m and int(m.group(1)) == n, out


def bench_throughput(
    report: Report, cloud: RunningCloud, key: str, db_url: str, n: int, *, submitter: str
) -> None:
    """n one-step jobs from 16 clients until every one has succeeded and freed its IPU.

    `submitter` is `h2load` (a C load generator, as `sbatch` is Slurm's C client: the figure is the
    cloud's) or `sdk` (16 httpx clients in this Python process, on the same two cores: what a
    Python user's own submitter adds)."""
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    count_jobs = text("SELECT count(*) FROM jobs")
    count_done = text("SELECT count(*) FROM jobs WHERE state = 'succeeded'")
    with engine.connect() as conn:
        jobs_before = conn.execute(count_jobs).scalar_one()
        done_before = conn.execute(count_done).scalar_one()
    t0 = time.monotonic()
    if submitter == "h2load":
        _submit_with_h2load(cloud.url, key, n, 16)
    else:
        asyncio.run(_submit_many(cloud.url, key, n, 16))
    submitted = time.monotonic() - t0
    with engine.connect() as conn:
        accepted = conn.execute(count_jobs).scalar_one() - jobs_before
        conn.rollback()
        if accepted < n * 0.99:
            raise RuntimeError(f"only {accepted} of {n} short jobs were accepted")
        while True:
            done = conn.execute(count_done).scalar_one() - done_before
            conn.rollback()
            if done >= accepted:
                break
            if time.monotonic() - t0 > 600:
                raise RuntimeError(f"only {done} of {accepted} short jobs finished in 600 s")
            time.sleep(0.05)
        held = conn.execute(text("SELECT count(*) FROM ipu_assignments")).scalar_one()
    elapsed = time.monotonic() - t0
    engine.dispose()
    assert held == 0, f"{held} IPUs still held after every job finished"
    tag = "" if submitter == "h2load" else "sdk_"
    report.add(f"short_jobs_{n}_{tag}end_to_end_jobs_per_s", "jobs/s", accepted / elapsed)
    report.add(f"short_jobs_{n}_{tag}submit_phase_s", "s", submitted)


def bench_placement(report: Report, base_url: str, redis_url: str, jobs: int, db_name: str) -> None:
    """Place `jobs` queued jobs on 1,024 POD64s with the live loop's own pass (dispatch excluded;
    choosing each attempt's queue from the workers registered in Redis included)."""
    import redis as redis_lib

    from scheduler.db import Database
    from scheduler.jobspec import JobSpec
    from scheduler.loop import SchedulerLoop
    from scheduler.routing import Router
    from scheduler.services.batch import jobs as job_service
    from scheduler.services.tenancy import tenants
    from scheduler.settings import Settings

    db_url = fresh_database(base_url, f"{db_name}_place")
    prepare(db_url, pods=1024)
    # The scheduler's own bound on an idle transaction (`ipucloud scheduler`): a pass decides in
    # Python between its statements.
    db = Database(db_url, idle_tx_timeout_s=60.0)
    with db.read() as s:
        tid = s.execute(text("SELECT id FROM tenants WHERE name = 'bench'")).scalar_one()
    sizes = [1, 1, 1, 1, 2, 4, 8, 16, 1, 2]
    with db.write() as s:
        for i in range(jobs):
            job_service.submit_job(
                session=s,
                tenant_id=tid,
                spec=JobSpec.model_validate({**ONE_STEP_JOB, "name": f"q{i}", "ipus": sizes[i % len(sizes)]}),
            )
    del tenants

    class NoBroker:
        def producer_or_acquire(self) -> Any:
            from contextlib import nullcontext

            return nullcontext(None)

        def send_task(self, *args: Any, **kwargs: Any) -> None:
            return None

    # A long leader lease: the figure is how long placing takes, whatever it is.
    settings = Settings(database_url=db_url, redis_url=redis_url, secret_key="x", leader_lease_s=600)  # type: ignore[arg-type]
    client = redis_lib.Redis.from_url(redis_url)
    loop = SchedulerLoop(
        settings=settings,
        db=db,
        celery=NoBroker(),  # type: ignore[arg-type]
        router=Router(lambda: client),
        queue_depth=lambda _queue: None,
    )
    assert loop.lead()
    t0 = time.perf_counter()
    placed = 0
    passes = []
    while placed < jobs:
        started = time.perf_counter()
        assert loop.lead(), "the benchmark's scheduler lost its lease"
        n = loop.schedule_pass()
        passes.append((n, time.perf_counter() - started))
        if n == 0:
            break
        placed += n
    elapsed = time.perf_counter() - t0
    print("  passes (placed, s): " + ", ".join(f"({n}, {t:.2f})" for n, t in passes))
    db.dispose()
    report.add(f"place_{jobs}_jobs_on_65536_ipus_s", "s", elapsed)
    report.add(f"place_{jobs}_jobs_placed", "jobs", placed)


# Slurm --------------------------------------------------------------------------------------------


def run_slurm(report: Report, reps: int) -> None:
    subprocess.run(["bash", str(SLURM_DIR / "stop.sh"), "--all"], check=False)
    subprocess.run(["bash", str(SLURM_DIR / "setup.sh"), "default"], check=True)
    try:
        out = subprocess.run(
            ["bash", str(SLURM_DIR / "bench.sh"), "submit", "latency", "throughput"],
            env={**os.environ, "REPS": str(reps)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        subprocess.run(["bash", str(SLURM_DIR / "stop.sh"), "--all"], check=False)
    for line in out.splitlines():
        m = re.match(r"FIGURE \S+ (\S+) median=([\d.]+) min=([\d.]+) max=([\d.]+)", line)
        if m:
            fig = report.figures.setdefault(f"slurm_{m.group(1)}", Figure(f"slurm_{m.group(1)}", ""))
            fig.values = [float(m.group(3)), float(m.group(2)), float(m.group(4))]
            print("  " + line)


# Main ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--vs-slurm", action="store_true")
    ap.add_argument("--only", default="submit,floor,latency,throughput,placement")
    ap.add_argument("--database-url", default=os.environ.get("IPUCLOUD_BENCH_DATABASE_URL", PG_DEFAULT))
    ap.add_argument("--redis-url", default=os.environ.get("IPUCLOUD_BENCH_REDIS_URL", REDIS_DEFAULT))
    ap.add_argument(
        "--db-name",
        default="ipucloud_bench",
        help="the databases made (dropped first) on that server: NAME, NAME_floor and NAME_place; another "
        "name lets two benchmarks share one server",
    )
    ap.add_argument("--seconds", type=int, default=10, help="wrk duration per submit measurement")
    ap.add_argument("--latency-jobs", type=int, default=200)
    ap.add_argument("--short-jobs", type=int, default=2000)
    ap.add_argument("--place-jobs", type=int, default=10_000)
    args = ap.parse_args()
    only = set(args.only.split(","))
    os.environ.setdefault("IPUCLOUD_SECRET_KEY", "benchmark-secret-" + os.urandom(8).hex())
    cores = os.cpu_count() or 2
    report = Report()
    print(f"# ipucloud control plane, {cores} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print("# reproduce: .venv/bin/python benchmarks/control_plane.py " + " ".join(sys.argv[1:]))
    import redis as redis_lib

    redis_lib.Redis.from_url(args.redis_url).flushdb()
    for rep in range(args.reps):
        print(f"== run {rep + 1} of {args.reps}", flush=True)
        work = Path(tempfile.mkdtemp(prefix="ipucloud-bench-"))
        if only & {"submit", "latency", "throughput"}:
            db_url = fresh_database(args.database_url, args.db_name)
            admin, key = prepare(db_url, pods=16)
            if "submit" in only:
                cloud = start_cloud(
                    db_url,
                    args.redis_url,
                    work / "a",
                    admin,
                    api_workers=cores,
                    worker_procs=0,
                    concurrency=1,
                    scheduler=False,
                    extra_env=BENCH_ENV,
                )
                try:
                    bench_submit(report, cloud, key, args.seconds)
                finally:
                    cloud.stop_all()
                db_url = fresh_database(args.database_url, args.db_name)
                admin, key = prepare(db_url, pods=16)
            if only & {"latency", "throughput"}:
                cloud = start_cloud(
                    db_url,
                    args.redis_url,
                    work / "b",
                    admin,
                    api_workers=cores,
                    worker_procs=1,
                    concurrency=64,  # the default IPUCLOUD_WORKER_CONCURRENCY
                    scheduler=True,
                    extra_env=BENCH_ENV,
                )
                try:
                    if "latency" in only:
                        bench_latency(report, cloud, key, db_url, args.latency_jobs)
                    if "throughput" in only:
                        for submitter in ("h2load", "sdk"):
                            bench_throughput(report, cloud, key, db_url, args.short_jobs, submitter=submitter)
                finally:
                    cloud.stop_all()
        if "floor" in only:
            bench_floor(
                report, fresh_database(args.database_url, f"{args.db_name}_floor"), args.seconds, cores
            )
        if "placement" in only:
            bench_placement(report, args.database_url, args.redis_url, args.place_jobs, args.db_name)
        shutil.rmtree(work, ignore_errors=True)
    if args.vs_slurm:
        print("== Slurm 22.05 (Debian), same machine", flush=True)
        run_slurm(report, args.reps)
    print("\n# figures (min / median / max over runs)")
    for fig in report.figures.values():
        print(fig.line())
    ratios: list[tuple[str, Callable[[], float]]] = []
    f = report.figures
    if "slurm_submit_par8_2000_jobs_per_s" in f and "submit_16_clients_jobs_per_s" in f:
        ratios.append(
            (
                "submit throughput vs Slurm parallel sbatch",
                lambda: (
                    f["submit_16_clients_jobs_per_s"].median / f["slurm_submit_par8_2000_jobs_per_s"].median
                ),
            )
        )
    if "slurm_start_latency_s" in f and "start_latency_p50_ms" in f:
        ratios.append(
            (
                "start latency, Slurm median / ours p50",
                lambda: 1000 * f["slurm_start_latency_s"].median / f["start_latency_p50_ms"].median,
            )
        )
    key_tp = next(
        (k for k in f if k.startswith("short_jobs_") and "_sdk_" not in k and k.endswith("jobs_per_s")), None
    )
    key_sl = next((k for k in f if k.startswith("slurm_short_jobs_") and k.endswith("jobs_per_s")), None)
    key_sdk = next(
        (k for k in f if k.startswith("short_jobs_") and k.endswith("_sdk_end_to_end_jobs_per_s")), None
    )
    if key_tp and key_sl:
        ratios.append(("short-job throughput vs Slurm", lambda: f[key_tp].median / f[key_sl].median))
    if key_sdk and key_sl:
        ratios.append(
            (
                "short-job throughput, Python SDK clients, vs Slurm",
                lambda: f[key_sdk].median / f[key_sl].median,
            )
        )
    if "floor_16_clients_inserts_per_s" in f and "submit_16_clients_jobs_per_s" in f:
        ratios.append(
            (
                "submit throughput / bare-INSERT floor (16 clients)",
                lambda: f["submit_16_clients_jobs_per_s"].median / f["floor_16_clients_inserts_per_s"].median,
            )
        )
    if "floor_group_16_clients_inserts_per_s" in f and "submit_16_clients_jobs_per_s" in f:
        ratios.append(
            (
                "submit throughput / group-commit floor (16 clients)",
                lambda: (
                    f["submit_16_clients_jobs_per_s"].median
                    / f["floor_group_16_clients_inserts_per_s"].median
                ),
            )
        )
    if ratios:
        print("\n# ratios (medians)")
        for name, fn in ratios:
            print(f"{name:<52} {fn():.2f}x")


if __name__ == "__main__":
    main()
