"""A cloud in real processes for the fault scenarios, the batches they run, and their report.

Every process is the real command (`python -m ipucloud scheduler|worker|api`), configured only by
environment, with tests/support/cloud.py's FAST timings (agent lease 3 s, heartbeat 0.2 s, leader
lease 2 s, outbox retry 3 s) and INFO logs, so a scenario can read what each process said.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import select

from scheduler.models import Attempt, LeaderLease, utcnow
from tests.support import services
from tests.support.cloud import FAST, RunningCloud, free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "test-artifacts" / "faults.json"

# About 7,800 cluster seconds on a 4-IPU partition (some 4 s of wall time at the tests' 2000x).
LONG_STEPS = 350_000


def job_body(name: str, steps: int = LONG_STEPS, ipus: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": steps},
        "ipus": ipus,
        **extra,
    }


@contextmanager
def fault_cloud(
    env: dict[str, str],
    db: Any,
    workdir: Path,
    *,
    workers: tuple[str, ...] = ("w1", "w2"),
    concurrency: int = 16,
    pods: int = 2,
    schedulers: tuple[str, ...] = ("scheduler",),
    api: bool = True,
    extra_env: dict[str, str] | None = None,
    worker_env: dict[str, dict[str, str]] | None = None,
) -> Iterator[RunningCloud]:
    """Seed the database and start the named processes; stop every one of them at the end."""
    seeded = services.seed(db, pods=pods)
    cloud = RunningCloud(
        env={**env, **FAST, "IPUCLOUD_LOG_LEVEL": "INFO", **(extra_env or {})},
        workdir=workdir,
        admin_key=seeded.admin_key,
        port=free_port(),
    )
    try:
        for name in schedulers:
            cloud.start_scheduler(name)
        for name in workers:
            cloud.start_worker(name, concurrency=concurrency, extra_env=(worker_env or {}).get(name))
        if api:
            cloud.start_api()
            cloud.wait_ready()
        yield cloud
    finally:
        cloud.stop_all()


def submit_batch(cloud: RunningCloud, key: str, n: int, prefix: str = "job", **body: Any) -> list[str]:
    ids: list[str] = []
    with cloud.http(key) as c:
        for i in range(n):
            r = c.post("/api/v1/jobs", json=job_body(f"{prefix}-{i}", **body))
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
    return ids


def running_attempts(db: Any) -> list[Attempt]:
    with db.read() as s:
        return list(
            s.execute(select(Attempt).where(Attempt.state == "running").order_by(Attempt.id)).scalars()
        )


def wait_for(what: str, predicate: Any, timeout: float = 60, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_running_on(db: Any, worker: str, n: int = 1, timeout: float = 60) -> list[Attempt]:
    """Until `worker` (its Celery node name, e.g. `w1`) runs at least `n` attempts; returns them."""
    return wait_for(
        f"{n} attempts running on {worker}",
        lambda: atts if len(atts := [a for a in running_attempts(db) if owner(a) == worker]) >= n else None,
        timeout,
    )


def owner(attempt: Attempt) -> str:
    """The host agent that took the attempt, by the first part of its name (`w1@host` -> `w1`)."""
    return (attempt.worker or "").split("@", 1)[0]


def leader(db: Any) -> tuple[str, int] | None:
    with db.read() as s:
        row = s.get(LeaderLease, "scheduler", populate_existing=True)
        if row is None or row.expires_at <= utcnow():
            return None
        return row.holder, row.epoch


def record(scenario: str, report: dict[str, Any]) -> None:
    """Print one scenario's figures (visible with -s) and merge them into test-artifacts/faults.json."""
    database = "postgresql" if os.environ.get("IPUCLOUD_TEST_DATABASE_URL") else "sqlite"
    report = {**report, "database": database}
    print(f"\n[faults] {scenario}: {json.dumps(report, sort_keys=True)}")
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    # Under a lock: scenarios on other pytest-xdist workers merge into the same file.
    with open(ARTIFACT.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            existing = json.loads(ARTIFACT.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            existing = {}
        existing[scenario] = report
        ARTIFACT.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
