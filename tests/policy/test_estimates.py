"""`POST /estimates` tells the wait the scheduler will make: the policy's own forecast, not a
first-come-first-served replay of its own (which once said 15 hours for a job that started at once)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from scheduler import emulation
from scheduler.jobspec import WorkloadRequest
from scheduler.models import Job
from scheduler.services.batch import executables
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


def test_an_estimate_ranks_the_job_at_its_tenants_plan_priority(db: Any, seeded: Any, client: Any) -> None:
    """The job asked about is ranked as the tenant's real job would be: at its plan's priority. It was
    ranked at 0, so an internal tenant heavier in fair share than a standard tenant was told it would
    wait behind the standard tenant's queued job, which its job would in fact pass."""
    from scheduler.services.tenancy import tenants

    light, _ = new_tenant(db, "light", quota_ipu_hours=10_000)  # standard: plan priority 2
    with db.write() as s:
        made = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name="heavy", plan="internal", quota_ipu_hours=10_000
        )  # internal: plan priority 3
        heavy, key = made.tenant.id, made.api_key
    running = submit(db, heavy, spec(128, steps=20_000))  # the heavy tenant holds the whole fleet
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    queued = submit(db, light, spec(128, steps=20_000))  # the standard tenant waits for all of it
    assert loop.schedule_pass() == 0
    with db.read() as s:
        first_end = datetime.fromisoformat(s.get(Job, queued).wait["estimated_start"]).timestamp()
    asked_at = datetime.now().astimezone().timestamp()
    wait_s = estimate(client, key, 128, steps=20_000)["expected_wait_s"]
    assert wait_s is not None
    # It starts when the running job ends, ahead of the standard tenant's job, not one run after it.
    starts_at = asked_at + wait_s / get_settings().time_scale
    assert abs(starts_at - first_end) < 5, (starts_at - first_end, running)


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


def test_an_inference_estimate_answers_a_serving_row_per_batch_size(
    db: Any, seeded: Any, client: Any
) -> None:
    _, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    auth = {"Authorization": f"Bearer {key}"}
    body = {
        "workload": {"model": "bert-large", "task": "infer", "seq_len": 384},
        "ipus": 1,
        "machine": "m2000",
        "serve": {"batch_sizes": [1, 4, 64]},
    }
    out = client.post("/api/v1/estimates", json=body, headers=auth)
    assert out.status_code == 200, out.text
    answer = out.json()
    assert answer["fits"] and answer["throughput"] > 0  # the offline estimate is still there
    served = answer["serve_plan"]
    assert served["ipus"] == 1 and served["machine"] == "m2000" and 4 < served["max_batch_size"] < 64
    assert [i["name"] for i in served["signature"]["inputs"]] == [
        "input_ids",
        "attention_mask",
        "token_type_ids",
    ]
    one, four, too_big = answer["serve"]
    assert [r["batch_size"] for r in answer["serve"]] == [1, 4, 64]
    assert one["fits"] and four["fits"] and not too_big["fits"]
    assert one["latency_ms"] < four["latency_ms"] and one["throughput"] < four["throughput"]
    for row in (one, four):
        parts = row["host_call_ms"] + row["host_ms"] + row["device_ms"]
        assert abs(row["latency_ms"] - parts) < 1e-3 and row["step_ms"] <= row["latency_ms"]
    assert one["host_call_ms"] == 0.09  # the gateway-attached machine's host call, 90 us
    assert f"the largest that fits is {served['max_batch_size']}" in too_big["error"]
    assert too_big["latency_ms"] is None

    # `auto` sizes the replica for the largest batch asked; a PCIe C2 answers with its own host call
    # (offline, as `ipucloud estimate` asks: this fleet has no C2 servers).
    from scheduler.services.batch.estimates import estimate as service_estimate

    auto = service_estimate(
        session=None,
        workload=WorkloadRequest.model_validate(body["workload"]),
        ipus="auto",
        machine="c2",
        serve=[1, 4, 64],
    )
    # No C2 replica (a server holds 16 IPUs of 304 MB) takes 64 sequences of 384 tokens of BERT-Large:
    # auto gives the one that takes the most, and the row of 64 says it does not fit.
    assert auto["serve_plan"] is not None and auto["serve_plan"]["ipus"] == 16
    assert [r["fits"] for r in auto["serve"]] == [True, True, False]
    assert auto["serve"][0]["host_call_ms"] == 0.054

    # Without `serve`, no rows; bad batch sizes are refused naming the field.
    plain = client.post(
        "/api/v1/estimates", json={k: v for k, v in body.items() if k != "serve"}, headers=auth
    )
    assert plain.status_code == 200 and plain.json().get("serve") is None
    for bad, field in (
        ([], "serve.batch_sizes"),
        ([0], "serve.batch_sizes"),
        ([1.5], "serve.batch_sizes"),
        (["8"], "serve.batch_sizes"),
        ([70_000], "serve.batch_sizes"),
        (list(range(1, 66)), "serve.batch_sizes"),
    ):
        refused = client.post("/api/v1/estimates", json={**body, "serve": {"batch_sizes": bad}}, headers=auth)
        assert refused.status_code == 422, (bad, refused.text)
        assert field in named(refused.json()), (bad, refused.text)
    train = {**body, "workload": {"model": "bert-large", "task": "train", "seq_len": 384}}
    refused = client.post("/api/v1/estimates", json=train, headers=auth)
    assert refused.status_code == 422 and "infer" in refused.json()["detail"]
    assert "serve" in named(refused.json())


def named(problem: dict[str, Any]) -> set[str]:
    """The fields a problem body names: its `errors` (schema validation) or its `field`."""
    fields = {str(e.get("field", "")).removeprefix("body.") for e in problem.get("errors") or []}
    fields |= {str(problem["field"])} if problem.get("field") else set()
    # A list item's error names its index too (serve.batch_sizes.0): the field is its list.
    return fields | {f.rsplit(".", 1)[0] for f in fields if f.rsplit(".", 1)[-1].isdigit()}
