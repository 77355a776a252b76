"""What the benchmarks share: figures over repeated runs, a scratch PostgreSQL database, a seeded cloud
started in production shape (each component its own process, configured only by environment).

Not a benchmark itself; `control_plane.py` and `fleet.py` use it.
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from tests.support.cloud import RunningCloud, free_port  # noqa: E402

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_DEFAULT = "redis://127.0.0.1:6379/15"


@dataclass
class Figure:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)

    def line(self) -> str:
        if not self.values:
            return f"{self.name:<44} no data"
        v = sorted(self.values)
        return (
            f"{self.name:<44} median={statistics.median(v):>10.3f}  min={v[0]:>10.3f}  max={v[-1]:>10.3f}  "
            f"n={len(v)} {self.unit}"
        )

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


@dataclass
class Report:
    figures: dict[str, Figure] = field(default_factory=dict)

    def add(self, name: str, unit: str, value: float) -> None:
        self.figures.setdefault(name, Figure(name, unit)).values.append(value)
        print(f"  {name} = {value:.3f} {unit}", flush=True)


# Database and cloud ----------------------------------------------------------------------------------------


def fresh_database(base: str, name: str) -> str:
    url = make_url(base.replace("postgresql://", "postgresql+psycopg://", 1))
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def prepare(db_url: str, pods: int) -> tuple[str, str]:
    """Migrate and seed; return (admin key, an internal tenant's key)."""
    from scheduler.db import Database
    from scheduler.migrate import upgrade
    from scheduler.services.capacity import fleet
    from scheduler.services.tenancy import tenants

    upgrade(db_url)
    db = Database(db_url)
    secret = os.environ["IPUCLOUD_SECRET_KEY"].encode()
    with db.write() as s:
        tenants.seed_plans(session=s)
        fleet.seed_fleet(session=s, pods=pods)
        admin = tenants.ensure_admin_key(session=s, secret=secret)
        created = tenants.create_tenant(
            session=s, secret=secret, name="bench", plan="internal", quota_ipu_hours=10_000_000
        )
    db.dispose()
    assert admin is not None
    return admin, created.api_key


def start_cloud(
    db_url: str,
    redis_url: str,
    workdir: Path,
    admin: str,
    *,
    api_workers: int,
    worker_procs: int,
    concurrency: int,
    scheduler: bool,
    extra_env: dict[str, str] | None = None,
) -> RunningCloud:
    env = {
        "IPUCLOUD_MODE": "production",
        "IPUCLOUD_DATABASE_URL": db_url,
        "IPUCLOUD_REDIS_URL": redis_url,
        "IPUCLOUD_SECRET_KEY": os.environ["IPUCLOUD_SECRET_KEY"],
        "IPUCLOUD_DATA_DIR": str(workdir / "data"),
        "IPUCLOUD_RATE_LIMIT": "100000000/minute",
        "IPUCLOUD_LOG_LEVEL": "WARNING",
        "IPUCLOUD_API_WORKERS": str(api_workers),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    cloud = RunningCloud(env={**env, **(extra_env or {})}, workdir=workdir, admin_key=admin, port=free_port())
    if scheduler:
        cloud.start_scheduler()
    for i in range(worker_procs):
        cloud.start_worker(f"agent{i + 1}", concurrency=concurrency)
    cloud.start_api()
    try:
        # Generous: on a two-core machine shared with other work, importing the app in each
        # uvicorn process has taken over a minute.
        cloud.wait_ready(timeout=300)
    except BaseException:
        cloud.stop_all()  # not left running to hold the agent's name for the next run
        raise
    return cloud
