"""An uploaded ONNX model run end to end on real processes (API, scheduler, host agent, Redis; SQLite or
PostgreSQL): it succeeds, it is metered, and its executable is cached for the next job of the same graph."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import Attempt, Executable, MeterEvent
from scheduler.services.batch import executables
from tests.support import onnx_files
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e


def _events(c: Any, job_id: str) -> list[dict[str, Any]]:
    r = c.get(f"/api/v1/jobs/{job_id}/logs", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [e["data"] for e in r.json()["items"] if e["kind"] == "log" and e["data"]]


def test_an_uploaded_model_runs_is_metered_and_its_executable_is_cached(cloud: RunningCloud, db: Any) -> None:
    tenant_id, key = cloud.create_tenant("byom")
    weighted = onnx_files.mlp(hidden=512, layers=4)
    with cloud.http(key) as c:
        r = c.post("/api/v1/models", files={"file": ("net.onnx", weighted)})
        assert r.status_code == 201, r.text
        model = r.json()
        assert model["weights_stripped_bytes"] > 0 and model["graph_bytes"] < 8192
        # The same graph again under another name (the weights differ, the graph does not).
        again = c.post(
            "/api/v1/models", files={"file": ("net-v2.onnx", onnx_files.mlp(hidden=512, layers=4, seed=9))}
        )
        assert again.status_code == 201, again.text
        assert again.json()["sha256"] == model["sha256"] and again.json()["id"] != model["id"]

        workload = {"model": "net", "task": "train", "batch_size": 256, "steps": 200}
        est = c.post("/api/v1/estimates", json={"workload": workload, "ipus": 2}).json()
        assert est["fits"] and est["compile_s"] > 0, est
        first = c.post("/api/v1/jobs", json={"name": "first", "workload": workload, "ipus": 2})
        assert first.status_code == 202, first.text
        first_id = first.json()["id"]
        done = cloud.wait_jobs(key, [first_id], timeout=180)[first_id]
        assert done["state"] == "succeeded", done
        assert done["used_ipu_hours"] > 0 and done["workload"]["model"] == model["id"]
        kinds = [e.get("kind") for e in _events(c, first_id)]
        assert "compile_start" in kinds and "cache_hit" not in kinds, kinds

        second = c.post(
            "/api/v1/jobs",
            json={"name": "second", "workload": {**workload, "model": again.json()["id"]}, "ipus": 2},
        )
        assert second.status_code == 202, second.text
        second_id = second.json()["id"]
        done2 = cloud.wait_jobs(key, [second_id], timeout=180)[second_id]
        assert done2["state"] == "succeeded", done2
        events = _events(c, second_id)
        hits = [e for e in events if e.get("kind") == "cache_hit"]
        assert hits and "compile_start" not in [e.get("kind") for e in events], events
        compiled = next(e for e in _events(c, first_id) if e.get("kind") == "compile_start")
        assert hits[0]["executable_key"] == compiled["executable_key"]
        # Without the compile, the second run holds its partition for less.
        assert done2["used_ipu_hours"] < done["used_ipu_hours"]
        usage = c.get("/api/v1/usage").json()
        assert usage["used_ipu_hours"] == pytest.approx(
            done["used_ipu_hours"] + done2["used_ipu_hours"], rel=1e-6
        )
        assert any(w["workload"] == model["id"] for w in usage["by_workload"]), usage["by_workload"]
    with db.read() as s:
        cached = executables.tenant_key(tenant_id=tenant_id, key=compiled["executable_key"])
        assert s.get(Executable, cached) is not None
        attempts = (
            s.execute(select(Attempt.id).where(Attempt.job_id.in_([first_id, second_id]))).scalars().all()
        )
        settles = (
            s.execute(
                select(MeterEvent.attempt_id).where(
                    MeterEvent.kind == "settle", MeterEvent.attempt_id.in_(attempts)
                )
            )
            .scalars()
            .all()
        )
        assert sorted(settles) == sorted(attempts)
