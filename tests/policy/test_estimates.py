"""`POST /estimates` tells the wait the scheduler will make: the policy's own forecast, not a
first-come-first-served replay of its own (which once said 15 hours for a job that started at once)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from scheduler import emulation
from scheduler.jobspec import WorkloadRequest
from scheduler.models import Job
from scheduler.services import executables
from scheduler.settings import get_settings
from tests.policy.test_live_pass import new_tenant, scheduler, spec, submit

WORKLOAD = {"model": "resnet50", "task": "train", "batch_size": 1024}


def estimate(client: Any, key: str, ipus: int, steps: int) -> dict[str, Any]:
    body = {"workload": {**WORKLOAD, "steps": steps}, "ipus": ipus, "machine": "m2000"}
    out = client.post("/api/v1/estimates", json=body, headers={"Authorization": f"Bearer {key}"})
    assert out.status_code == 200, out.text
    return out.json()


def test_with_free_room_small_jobs_are_estimated_to_start_at_once(db: Any, seeded: Any, client: Any) -> None:
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    submit(db, tenant, spec(64, steps=100_000))  # holds half the fleet for a long time
    big = submit(db, tenant, spec(128))  # waits for all of it: the queue is not empty
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    with db.read() as s:
        held = s.get(Job, big).wait
    assert held["reason"] == "reserved"
    reserved_in = datetime.fromisoformat(held["estimated_start"]).timestamp() - datetime.now().timestamp()
    # 64 IPUs are free; a short job backfills ahead of the reservation at the next pass.
    for ipus in (1, 16):
        out = estimate(client, key, ipus, steps=20)
        assert out["fits"] and out["expected_wait_s"] is not None
        assert out["expected_wait_s"] < 60, (ipus, out["expected_wait_s"])
    # One that would outlast the reservation must not jump it: it waits for both jobs ahead.
    long = estimate(client, key, 16, steps=200_000)
    assert long["expected_wait_s"] > reserved_in * get_settings().time_scale - 5 > 60


def test_behind_a_full_fleet_the_estimate_is_the_reservation_the_scheduler_makes(
    db: Any, seeded: Any, client: Any
) -> None:
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    submit(db, tenant, spec(128, steps=20_000))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    asked_at = datetime.now().astimezone()
    out = estimate(client, key, 64, steps=100)
    wait_s = out["expected_wait_s"]
    assert wait_s is not None and wait_s > 60
    job_id = submit(db, tenant, spec(64, steps=100))
    assert loop.schedule_pass() == 0
    with db.read() as s:
        wait = s.get(Job, job_id).wait
    assert wait["reason"] == "reserved"
    reserved = datetime.fromisoformat(wait["estimated_start"])
    predicted = asked_at.timestamp() + wait_s / get_settings().time_scale
    assert abs(reserved.timestamp() - predicted) < 5, (wait, wait_s)


def test_a_queued_job_behind_another_gets_a_forecast_start(db: Any, seeded: Any) -> None:
    """Not only the first in line: every job waiting for room is told when it should start."""
    tenant, _ = new_tenant(db, "acme", quota_ipu_hours=10_000)
    submit(db, tenant, spec(128, steps=20_000))
    second = submit(db, tenant, spec(128, steps=20_000))
    third = submit(db, tenant, spec(128, steps=100))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    with db.read() as s:
        waits = {j: s.get(Job, j).wait for j in (second, third)}
    assert waits[third]["reason"] in ("behind", "no-room")
    starts = {j: datetime.fromisoformat(w["estimated_start"]).timestamp() for j, w in waits.items()}
    # The third starts when the second ends: one more run of 20,000 steps after the second's start.
    assert starts[third] - starts[second] > 60


BERT = {"model": "bert-base", "task": "train", "batch_size": 32, "seq_len": 128, "steps": 200}


def test_a_compiled_executable_is_left_out_of_cost_and_reservation(db: Any, seeded: Any, client: Any) -> None:
    """A trial grant too small for compiling bert-base, but ample for running it once compiled."""
    tenant_id, key = new_tenant(db, "trial", quota_ipu_hours=0.2)
    headers = {"Authorization": f"Bearer {key}"}
    _, neighbour_key = new_tenant(db, "neighbour", quota_ipu_hours=0.2)
    body = {"workload": BERT, "ipus": 4, "machine": "m2000"}
    cold = client.post("/api/v1/estimates", json=body, headers=headers).json()
    assert cold["cached"] is False and cold["ipu_hours"] > 0.5 and cold["compile_s"] > 0
    job = {"name": "bert", **body}
    refused = client.post("/api/v1/jobs", json=job, headers=headers)
    assert refused.status_code in (402, 403, 409, 422), refused.text
    assert "quota" in refused.text.lower() or "grant" in refused.text.lower()

    resolved = emulation.resolve(WorkloadRequest.model_validate(BERT), 4, "m2000")
    with db.write() as s:  # as a worker does once it has compiled it (workers/agent.py)
        cache_key = executables.tenant_key(tenant_id=tenant_id, key=resolved.executable_key)
        executables.record(session=s, key=cache_key, machine_type="m2000", compile_s=750.0)

    warm = client.post("/api/v1/estimates", json=body, headers=headers).json()
    assert warm["cached"] is True and warm["compile_s"] == 0
    assert warm["ipu_hours"] < cold["ipu_hours"] / 10
    assert abs(warm["total_s"] - (cold["total_s"] - cold["compile_s"])) < 1e-6
    accepted = client.post("/api/v1/jobs", json=job, headers=headers)
    assert accepted.status_code in (200, 201, 202), accepted.text
    with db.read() as s:
        stored = s.get(Job, accepted.json()["id"])
        assert stored.predicted_runtime_s == resolved.cached_runtime_s
        assert stored.reserved_ipu_ms < 0.05 * 3_600_000
    # The cache is the tenant's own: another tenant's estimate shows no sign of it, and its job still
    # needs the compile its grant cannot pay for.
    neighbour = {"Authorization": f"Bearer {neighbour_key}"}
    theirs = client.post("/api/v1/estimates", json=body, headers=neighbour).json()
    assert theirs["cached"] is False and theirs["ipu_hours"] == cold["ipu_hours"]
    assert client.post("/api/v1/jobs", json=job, headers=neighbour).status_code in (402, 403, 409, 422)
