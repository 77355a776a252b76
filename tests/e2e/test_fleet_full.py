"""The fleet runs full: on the embedded default, one host agent drives every IPU of the demo fleet.

Before host agents, a worker ran one attempt per pool slot (4 by default), so 124 of 128 IPUs sat
placed but idle; now the number running is bounded by the IPUs alone.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.models import Agent, Attempt
from tests.faults.checker import check_cloud
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e

# One IPU, about 280,000 cluster seconds: some 140 s of wall time at the tests' 2000x. All 128 must be
# submitted, started and cancelled before the first ends: alone on the machine that took about 10 s,
# beside three busy workers on two cores a few times that, so the test runs with the others (it
# cancels them all, so their length costs nothing).
JOB = {"workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 6_000_000}, "ipus": 1}


def test_128_one_ipu_jobs_all_run_at_once_on_128_ipus(cloud: RunningCloud, db: Any) -> None:
    _, key = cloud.create_tenant("full", quota_ipu_hours=100_000, plan="internal")
    ids: list[str] = []
    with cloud.http(key) as c:
        for i in range(128):
            r = c.post("/api/v1/jobs", json={**JOB, "name": f"full-{i}"})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
    deadline = time.monotonic() + 60
    running = 0
    while time.monotonic() < deadline:
        with db.read() as s:
            running = s.execute(
                select(func.count()).select_from(Attempt).where(Attempt.state == "running")
            ).scalar_one()
        if running == 128:
            break
        time.sleep(0.2)
    assert running == 128, f"only {running} of 128 attempts ran at once\n{cloud.logs()}"
    with db.read() as s:
        agents = s.execute(select(Agent)).scalars().all()
        workers = set(s.execute(select(Attempt.worker).where(Attempt.state == "running")).scalars())
    assert len(agents) == 1 and workers == {agents[0].name}, "one agent drives them all"
    with cloud.http(key) as c:
        job = c.get(f"/api/v1/jobs/{ids[0]}").json()
        assert job["state"] == "running" and job["progress"]["percent"] > 0, job
        for job_id in ids:
            assert c.post(f"/api/v1/jobs/{job_id}/cancel").status_code in (200, 202)
    final = cloud.wait_jobs(key, ids, timeout=60)
    assert {j["state"] for j in final.values()} == {"cancelled"}
    outcome = check_cloud(db, ids)
    assert outcome.attempts == {"cancelled": 128}
