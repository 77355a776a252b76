"""The live scheduling pass against a real database: placing 1,000 queued jobs on 16 POD64s, and a pass
over 10,000 queued jobs that cannot start (explanations and fair share included).

    .venv/bin/python benchmarks/live_loop.py [--database-url URL] [--jobs N] [--pods N] [--backlog N]

It creates a scratch database next to the one named (PostgreSQL by default:
postgresql://postgres@127.0.0.1:5432/postgres; a sqlite:/// URL works too), migrates it, seeds the
plans, the fleet and one tenant, submits the jobs through ``scheduler.services.batch.jobs.submit_job`` and
times ``SchedulerLoop.schedule_pass`` (leader fence, allocator refresh, snapshot, policy, placement
rows, attempts, outbox, waits) with a broker stub. The scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine, func, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from scheduler.db import Database, normalise_url  # noqa: E402
from scheduler.jobspec import JobSpec  # noqa: E402
from scheduler.loop import SchedulerLoop  # noqa: E402
from scheduler.migrate import upgrade  # noqa: E402
from scheduler.models import Attempt, Job  # noqa: E402
from scheduler.services.batch import jobs  # noqa: E402
from scheduler.services.capacity import fleet  # noqa: E402
from scheduler.services.tenancy import tenants  # noqa: E402
from scheduler.settings import Settings  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/live_loop.py"


class NullCelery:
    """The broker is not what is measured: dispatch is a separate step of the loop."""

    def producer_or_acquire(self) -> Any:
        return nullcontext(None)

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        return None


def scratch_database(url: str) -> tuple[str, Any]:
    """A new, migrated database; returns its URL and a function that drops it."""
    if url.startswith("sqlite"):
        directory = tempfile.mkdtemp(prefix="ipucloud-bench-")
        path = Path(directory) / "bench.db"
        db_url = f"sqlite:///{path}"
        upgrade(db_url)
        return db_url, lambda: path.unlink(missing_ok=True)
    admin_url = make_url(normalise_url(url))
    name = f"ipucloud_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = admin_url.set(database=name).render_as_string(hide_password=False)
    upgrade(db_url)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return db_url, drop


def submit(db: Database, tenant_id: str, count: int, size: int) -> float:
    spec = JobSpec.model_validate(
        {"name": "bench", "workload": {"model": "resnet50", "task": "train", "steps": 100}, "ipus": size}
    )
    started = time.perf_counter()
    for chunk in range(0, count, 500):
        with db.write() as s:
            for _ in range(min(500, count - chunk)):
                jobs.submit_job(session=s, tenant_id=tenant_id, spec=spec)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--pods", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=1000, help="queued 1-IPU jobs placed by one pass")
    parser.add_argument("--backlog", type=int, default=10_000, help="queued jobs for the idle-pass timing")
    parser.add_argument("--repeat", type=int, default=5, help="idle passes timed over the backlog")
    args = parser.parse_args()

    db_url, drop = scratch_database(args.database_url)
    try:
        settings = Settings(
            mode="production",
            database_url=db_url,
            redis_url="redis://127.0.0.1:6379/15",
            secret_key="benchmark-secret-benchmark-secret",
        )
        db = Database(db_url)
        with db.write() as s:
            tenants.seed_plans(session=s)
            fleet.seed_fleet(session=s, pods=args.pods)
            tenant = tenants.create_tenant(
                session=s, secret=settings.secret(), name="bench", plan="internal", quota_ipu_hours=1e9
            ).tenant.id
        submit_s = submit(db, tenant, args.jobs, 1)
        loop = SchedulerLoop(settings=settings, db=db, celery=NullCelery(), router=_Router())  # type: ignore[arg-type]
        assert loop.lead()
        started = time.perf_counter()
        placed = loop.schedule_pass()
        place_s = time.perf_counter() - started
        with db.read() as s:
            attempts = s.execute(select(func.count()).select_from(Attempt)).scalar_one()
        assert placed == attempts == args.jobs, (placed, attempts)

        # A backlog that cannot start (the fleet is full): the cost of explaining and ordering it.
        submit(db, tenant, args.backlog, 64)
        idle = []
        for _ in range(args.repeat):
            assert loop.lead()  # submitting took longer than a leader lease
            started = time.perf_counter()
            assert loop.schedule_pass() == 0
            idle.append(time.perf_counter() - started)
        with db.read() as s:
            explained = s.execute(
                select(func.count()).select_from(Job).where(Job.wait.is_not(None))
            ).scalar_one()
        db.dispose()
    finally:
        drop()

    kind = make_url(db_url).get_backend_name()
    print(f"database: {kind}; fleet: {args.pods} POD64 ({args.pods * 64} IPUs)")
    print(f"submitted {args.jobs} jobs in {submit_s:.2f} s (not part of the pass)")
    print(
        f"one pass placed {placed} queued jobs in {place_s:.3f} s ({place_s / placed * 1000:.2f} ms per job)"
    )
    print(
        f"{args.backlog} queued jobs that cannot start: first pass (writes {explained} explanations) "
        f"{idle[0]:.3f} s, then median {statistics.median(idle[1:] or idle):.3f} s per pass "
        "(nothing changed, nothing written)"
    )
    print(f"reproduce: {COMMAND} --database-url {args.database_url} --pods {args.pods} --jobs {args.jobs}")


class _Router:
    """Every attempt goes to the default queue: routing is not what is measured."""

    def queue_for(self, machine_type: str, ipu_ids: list[str], widen: int = 0) -> str:
        return "ipucloud"


if __name__ == "__main__":
    main()
