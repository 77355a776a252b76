"""A job array and a job that depends on it, on real processes (API, scheduler, a Celery host agent,
Redis): the array runs to completion never more than `max_running` at once, and the dependent job
starts only after its last element ended."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import Attempt, Job
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e

JOB = {"name": "r50", "workload": {"model": "resnet50", "batch_size": 64, "steps": 20}, "ipus": 4}


def test_an_array_runs_throttled_to_completion_then_its_dependent_starts(
    cloud: RunningCloud, db: Any
) -> None:
    _, key = cloud.create_tenant("sweeper")
    _, other_key = cloud.create_tenant("neighbour")
    with cloud.http(key) as c:
        r = c.post("/api/v1/jobs", json={**JOB, "name": "bs", "array": {"indices": "0-5", "max_running": 2}})
        assert r.status_code == 202, r.text
        array = r.json()
        assert array["id"].startswith("arr_") and array["size"] == 6 and array["max_running"] == 2
        assert r.headers["Location"] == f"/api/v1/arrays/{array['id']}"
        after = c.post(
            "/api/v1/jobs",
            json={
                **JOB,
                "name": "fine-tune",
                "depends_on": {"all": [{"job": array["id"], "type": "afterok"}]},
            },
        )
        assert after.status_code == 202, after.text
        after_id = after.json()["id"]
        assert after.json()["depends_on"]["on"] == [{"job": array["id"], "type": "afterok"}]
        # Bad input: each a problem naming the field, nothing stored.
        bad = c.post("/api/v1/jobs", json={**JOB, "array": {"indices": "5-1"}})
        assert bad.status_code == 422 and "array" in bad.text
        over = c.post("/api/v1/jobs", json={**JOB, "array": {"indices": "0-1000"}})  # standard: 1,000
        assert over.status_code == 422 and over.json()["field"] == "array.indices"
        elements = c.get(f"/api/v1/arrays/{array['id']}/jobs").json()["items"]
        assert [e["array_index"] for e in elements] == list(range(6))
        assert all(e["array_id"] == array["id"] and e["name"] == f"bs[{e['array_index']}]" for e in elements)
    with cloud.http(other_key) as c:
        assert c.get(f"/api/v1/arrays/{array['id']}").status_code == 404
        assert c.post(f"/api/v1/arrays/{array['id']}/cancel", json={}).status_code == 404
        refused = c.post("/api/v1/jobs", json={**JOB, "depends_on": {"all": [{"job": array["id"]}]}})
        assert refused.status_code == 404
        assert c.get("/api/v1/arrays").json()["items"] == []

    ids = [e["id"] for e in elements]
    final = cloud.wait_jobs(key, [*ids, after_id], timeout=240)
    assert {final[j]["state"] for j in [*ids, after_id]} == {"succeeded"}, final
    with cloud.http(key) as c:
        done = c.get(f"/api/v1/arrays/{array['id']}").json()
        assert done["state"] == "succeeded" and done["completed_indices"] == "0-5"
        assert done["progress_percent"] == 100.0 and done["elements_by_state"] == {"succeeded": 6}
        assert done["used_ipu_hours"] > 0 and done["reserved_ipu_hours"] == 0
        logs = c.get(f"/api/v1/jobs/{ids[3]}/logs").json()["items"]
        envs = [e["data"]["env"] for e in logs if (e.get("data") or {}).get("env")]
        assert envs and envs[0]["SLURM_ARRAY_TASK_ID"] == "3" and envs[0]["IPUCLOUD_ARRAY_ID"] == array["id"]
        assert envs[0]["SLURM_ARRAY_TASK_COUNT"] == "6"
        history = [h["message"] for h in c.get(f"/api/v1/jobs/{after_id}").json()["history"]]
        assert history[0].startswith("queued")

    with db.read() as s:
        spans = [
            (a.placed_at, a.ended_at)
            for a in s.execute(
                select(Attempt).join(Job, Job.id == Attempt.job_id).where(Job.array_id == array["id"])
            ).scalars()
        ]
        dependent = s.execute(select(Attempt).where(Attempt.job_id == after_id)).scalars().one()
    assert len(spans) == 6 and all(end is not None for _, end in spans)
    # Never more than two elements held a partition at once...
    for placed, _ in spans:
        overlapping = sum(1 for p, e in spans if p <= placed < e)
        assert overlapping <= 2, spans
    # ... and the dependent job was placed only after the last element ended.
    assert dependent.placed_at >= max(end for _, end in spans)
