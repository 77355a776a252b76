"""Submit throughput and the API's CPU per accepted submission, from 16 `wrk` clients.

The cloud as `control_plane.py` starts it for its submit figure (one API process per core, the
scheduler stopped, one-step jobs). On a shared machine the throughput measures the load as much as
the cloud; the API processes' CPU per accepted submission (from /proc, over the number accepted) is
the steadier figure for comparing two versions run one after the other. It also prints the mean
batch the submit writers committed (jobs over distinct creation times) and how many cores each
program on the machine used meanwhile (PostgreSQL, Redis, the API's processes).

    .venv/bin/python benchmarks/submit_cpu.py LABEL [--seconds 15] [--db-name cp_bench_sf]
        [--redis-url redis://127.0.0.1:6379/13] [--api-workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.control_plane import BENCH_ENV, ONE_STEP_JOB, wrk  # noqa: E402
from benchmarks.harness import PG_DEFAULT, REDIS_DEFAULT, fresh_database, prepare, start_cloud  # noqa: E402


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (uvicorn's supervisor and its worker processes)."""
    out = [pid]
    for p in os.listdir("/proc"):
        if p.isdigit() and (st := _stat(int(p))) is not None and int(st[1]) == pid:
            out += _tree(int(p))
    return out


def _cpu_s(pids: list[int]) -> float:
    ticks = sum(int(st[11]) + int(st[12]) for p in pids if (st := _stat(p)) is not None)
    return ticks / os.sysconf("SC_CLK_TCK")


def _by_program() -> dict[str, float]:
    """CPU seconds so far of every process on the machine, summed by program name (postgres, wrk,
    redis-server, python ...): where the machine's two cores go, beside the API's own share."""
    out: dict[str, float] = {}
    for p in os.listdir("/proc"):
        if p.isdigit() and (st := _stat(int(p))) is not None:
            try:
                with open(f"/proc/{p}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
            out[name] = out.get(name, 0.0) + (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _api_pid(port: str) -> int:
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline") as f:
                    cmd = f.read().split("\0")
            except OSError:
                continue
            if "ipucloud" in cmd and "api" in cmd and port in cmd:
                return int(p)
    raise RuntimeError("the API process was not found")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("label")
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--database-url", default=os.environ.get("IPUCLOUD_BENCH_DATABASE_URL", PG_DEFAULT))
    ap.add_argument("--redis-url", default=os.environ.get("IPUCLOUD_BENCH_REDIS_URL", REDIS_DEFAULT))
    ap.add_argument("--db-name", default="ipucloud_submit_cpu", help="made (dropped first) on that server")
    ap.add_argument("--api-workers", type=int, default=os.cpu_count() or 2, help="uvicorn processes")
    args = ap.parse_args()
    os.environ.setdefault("IPUCLOUD_SECRET_KEY", "benchmark-secret-" + os.urandom(8).hex())
    import redis as redis_lib

    redis_lib.Redis.from_url(args.redis_url).flushdb()
    db_url = fresh_database(args.database_url, args.db_name)
    admin, key = prepare(db_url, pods=16)
    cloud = start_cloud(
        db_url,
        args.redis_url,
        Path(tempfile.mkdtemp(prefix="ipucloud-submit-cpu-")),
        admin,
        api_workers=args.api_workers,
        worker_procs=0,
        concurrency=1,
        scheduler=False,
        extra_env=BENCH_ENV,
    )
    try:
        pids = _tree(_api_pid(cloud.url.rsplit(":", 1)[1]))
        url = f"{cloud.url}/api/v1/jobs"
        wrk(url, ONE_STEP_JOB, key, clients=16, seconds=3)  # warm-up: key cache, prepared statements
        load0, cpu0, all0 = os.getloadavg()[0], _cpu_s(pids), _by_program()
        rate, p50, p99, errors = wrk(url, ONE_STEP_JOB, key, clients=16, seconds=args.seconds)
        cpu1, load1, all1 = _cpu_s(pids), os.getloadavg()[0], _by_program()
        accepted = rate * args.seconds
        print(
            f"{args.label}: {rate:.0f} jobs/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, {errors} errors; API CPU "
            f"{1000 * (cpu1 - cpu0) / accepted:.3f} ms a submission ({(cpu1 - cpu0) / args.seconds:.2f} "
            f"cores, {len(pids)} processes); load average {load0:.1f} -> {load1:.1f}",
            flush=True,
        )
        # A batch's jobs share their creation time (one transaction's clock): the mean batch, which
        # sets how far each batch's fixed work (its reads, the reservation, the commit) is shared.
        from sqlalchemy import create_engine, text

        engine = create_engine(db_url)
        with engine.connect() as conn:
            jobs, batches = conn.execute(text("SELECT count(*), count(DISTINCT created_at) FROM jobs")).one()
        engine.dispose()
        print(f"  {jobs} jobs in {batches} batches (mean {jobs / max(batches, 1):.1f}, warm-up included)")
        # Processes that ended during the run are missing from the second reading: a lower bound.
        shares = sorted(((all1[n] - all0.get(n, 0.0), n) for n in all1), reverse=True)
        print(
            "  cores by program: "
            + ", ".join(f"{n} {c / args.seconds:.2f}" for c, n in shares if c / args.seconds >= 0.01),
            flush=True,
        )
    finally:
        cloud.stop_all()


if __name__ == "__main__":
    main()
