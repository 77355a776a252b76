"""Issue #32 item 13 on real processes: after a host agent is SIGKILLed, the job's progress (as
`GET /jobs/{id}` shows it) stops within a quarter of the agent's lease, instead of climbing through
the whole lease (3 s here, 6,000 cluster seconds at the tests' 2000x) and falling back when the lease
lapses; the lost attempt keeps what was shown, and the percent counts steps.

Runs in both passes: on the embedded default and on PostgreSQL + Redis.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import Attempt
from tests.faults.cloudkit import fault_cloud, job_body, wait_for, wait_running_on
from tests.support.cloud import FAST

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

SCALE = float(FAST["IPUCLOUD_TIME_SCALE"])
LEASE_S = float(FAST["IPUCLOUD_LEASE_S"])


def first_attempt(db: Any, job_id: str) -> Attempt | None:
    with db.read() as s:
        return s.execute(
            select(Attempt).where(Attempt.job_id == job_id, Attempt.number == 1)
        ).scalar_one_or_none()


def test_a_killed_agents_job_stops_its_progress_and_keeps_it(
    env: dict[str, str], db: Any, tmp_path: Path
) -> None:
    with fault_cloud(env, db, tmp_path, workers=("w1",), concurrency=2) as cloud:
        _, key = cloud.create_tenant("progress-kill")
        with cloud.http(key) as c:
            r = c.post("/api/v1/jobs", json=job_body("killed", steps=2_000_000, checkpoint_every_s=60))
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]

            def progress() -> dict[str, Any]:
                p = c.get(f"/api/v1/jobs/{job_id}").json()["progress"]
                return p or {}

            wait_running_on(db, "w1", 1)
            wait_for("the run phase", lambda: progress().get("phase") == "run", timeout=60)
            before = progress()
            assert before["percent"] == pytest.approx(100.0 * before["step"] / before["steps"], abs=0.01)
            cloud.procs["w1"].signal(signal.SIGKILL)
            killed_at = time.monotonic()
            shown: list[float] = []
            lost = None
            while time.monotonic() - killed_at < 4 * LEASE_S:
                p = progress()
                if p.get("cluster_s") is not None:
                    shown.append(float(p["cluster_s"]))
                lost = first_attempt(db, job_id)
                if lost is not None and lost.state == "lost":
                    break
                time.sleep(0.05)
    assert lost is not None and lost.state == "lost", "the lease lapsed and the attempt was lost"
    assert shown == sorted(shown), "progress never fell back while the agent was silent"
    # Its clock ran on for at most a quarter of the lease past its last heartbeat (0.75 s here), plus
    # a second of slack for a loaded machine: not the whole lease (3 s) as before.
    climbed_s = (max(shown) - float(before["cluster_s"])) / SCALE
    assert climbed_s < LEASE_S / 4 + 1.0, f"progress climbed {climbed_s:.2f} wall s after the kill"
    assert lost.progress is not None
    assert abs(float(lost.progress["cluster_s"]) - max(shown)) < 1.0, (lost.progress, max(shown))
