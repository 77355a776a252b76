"""Inference endpoints' control plane through the API (no scheduler running): validation, plan
limits, quota, tenancy, and what is held (or not) after each answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.models import SERVE_TASK, Endpoint, Job, Tenant
from tests.support import onnx_files
from tests.support.services import Seeded

EP = {
    "name": "bert",
    "model": "bert-base",
    "seq_len": 128,
    "batching": {"max_batch_size": 8, "max_wait_ms": 2},
}


def tenant(client: Any, seeded: Seeded, name: str, plan: str = "trial", hours: float = 100) -> dict[str, str]:
    r = client.post(
        "/api/v1/admin/tenants",
        json={"name": name, "plan": plan, "quota_ipu_hours": hours},
        headers={"Authorization": f"Bearer {seeded.admin_key}"},
    )
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def problem(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return dict(r.json())


def held(db: Any) -> tuple[int, int, int]:
    """Endpoints, replica jobs and reserved IPU-ms across every tenant."""
    with db.read() as s:
        return (
            s.execute(select(func.count()).select_from(Endpoint)).scalar_one(),
            s.execute(select(func.count()).select_from(Job).where(Job.task == SERVE_TASK)).scalar_one(),
            s.execute(select(func.coalesce(func.sum(Tenant.reserved_ipu_ms), 0))).scalar_one(),
        )


def test_an_endpoint_is_created_listed_read_changed_and_deleted(client: Any, seeded: Seeded, db: Any) -> None:
    h = tenant(client, seeded, "server")
    r = client.post("/api/v1/endpoints", json=EP, headers=h)
    assert r.status_code == 202, r.text
    ep = r.json()
    assert r.headers["location"] == f"/api/v1/endpoints/{ep['id']}"
    assert ep["id"].startswith("ep_") and ep["state"] == "provisioning"
    assert ep["url"].endswith(f"/api/v1/endpoints/{ep['id']}")
    assert ep["replicas"] == {"min": 1, "max": 1, "desired": 1, "ready": 0}
    assert ep["ipus_per_replica"] == 1 and ep["ipus_requested"] == "auto"
    assert ep["workload"] == {
        "model": "bert-base",
        "task": "infer",
        "batch_size": 8,
        "precision": "fp16",
        "seq_len": 128,
    }
    assert [t["name"] for t in ep["signature"]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    plans = {p["machine"]: p for p in ep["serve_plans"]}
    m2000 = plans["m2000"]
    assert [b["batch_size"] for b in m2000["batches"]] == [1, 2, 4, 8]
    # Latency grows with the batch, and so does throughput: one batch per host call.
    lat = [b["latency_ms"] for b in m2000["batches"]]
    thr = [b["throughput"] for b in m2000["batches"]]
    assert lat == sorted(lat) and thr == sorted(thr) and m2000["compile_s"] > 0
    assert [x["state"] for x in ep["replica_list"]] == ["queued"]
    # One replica holder job, hidden from the job list, its window reserved from the grant.
    with db.read() as s:
        (job,) = s.execute(select(Job).where(Job.endpoint_id == ep["id"])).scalars()
        tenant_row = s.get(Tenant, job.tenant_id)
        assert job.task == SERVE_TASK and job.max_runtime_s is None and job.predicted_runtime_s == 3600
        assert job.spec == {"workload": ep["workload"], "ipus": 1, "machine": "any", "endpoint": ep["id"]}
        assert job.reserved_ipu_ms == tenant_row.reserved_ipu_ms > 0
    assert client.get("/api/v1/jobs", headers=h).json()["items"] == []
    listed = client.get("/api/v1/endpoints", headers=h).json()
    assert [x["id"] for x in listed["items"]] == [ep["id"]] and listed["next_cursor"] is None
    assert client.get(f"/api/v1/endpoints/{ep['id']}", headers=h).json()["name"] == "bert"
    # A second endpoint of the same name is refused while the first lives.
    problem(client.post("/api/v1/endpoints", json=EP, headers=h), 409)
    changed = client.patch(
        f"/api/v1/endpoints/{ep['id']}",
        json={
            "replicas": {"min": 0, "max": 2},
            "autoscaling": {"target_queue_delay_ms": 20},
            "max_queue": 10,
        },
        headers=h,
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert body["replicas"]["min"] == 0 and body["replicas"]["max"] == 2 and body["max_queue"] == 10
    assert body["autoscaling"]["target_queue_delay_ms"] == 20
    gone = client.delete(f"/api/v1/endpoints/{ep['id']}", headers=h)
    assert gone.status_code == 200 and gone.json()["state"] == "stopped", gone.text
    assert gone.json()["replica_list"] == []
    with db.read() as s:
        job = s.execute(select(Job).where(Job.endpoint_id == ep["id"])).scalar_one()
        assert job.state == "cancelled" and s.get(Tenant, job.tenant_id).reserved_ipu_ms == 0
    problem(client.delete(f"/api/v1/endpoints/{ep['id']}", headers=h), 409)
    problem(client.patch(f"/api/v1/endpoints/{ep['id']}", json={"max_queue": 5}, headers=h), 409)
    # Its name is free again.
    assert client.post("/api/v1/endpoints", json=EP, headers=h).status_code == 202


@pytest.mark.parametrize(
    "body",
    [
        {**EP, "ipus_per_replica": 3},
        {**EP, "ipus_per_replica": 0},
        {**EP, "ipus_per_replica": 128},
        {**EP, "ipus_per_replica": "4"},
        {**EP, "replicas": {"min": 3, "max": 2}},
        {**EP, "replicas": {"min": -1, "max": 2}},
        {**EP, "replicas": {"min": 0, "max": 0}},
        {**EP, "name": "Bert"},
        {**EP, "name": "-bert"},
        {**EP, "name": "b" * 64},
        {**EP, "machine": "gpu"},
        {**EP, "model": "no-such-model"},
        {**EP, "batching": {"max_batch_size": 0}},
        {**EP, "autoscaling": {"target_queue_delay_ms": 0}},
        {**EP, "seq_len": 128, "dims": {"seq": 128}},
        {**EP, "colour": "blue"},
        {"name": "x"},
    ],
)
def test_bad_specs_are_422_and_hold_nothing(
    client: Any, seeded: Seeded, db: Any, body: dict[str, Any]
) -> None:
    h = tenant(client, seeded, "validator")
    problem(client.post("/api/v1/endpoints", json=body, headers=h), 422)
    assert held(db) == (0, 0, 0)


def test_plan_limits_and_quota_refuse_with_nothing_held(client: Any, seeded: Seeded, db: Any) -> None:
    h = tenant(client, seeded, "trialist")
    # Trial plans: two endpoints, two replicas each, eight IPUs together at their maxima.
    body = problem(
        client.post("/api/v1/endpoints", json={**EP, "replicas": {"min": 1, "max": 3}}, headers=h), 409
    )
    assert body["limit"] == "max_endpoint_replicas"
    body = problem(
        client.post(
            "/api/v1/endpoints",
            json={**EP, "ipus_per_replica": 8, "replicas": {"min": 0, "max": 2}},
            headers=h,
        ),
        409,
    )
    assert body["limit"] == "max_endpoint_ipus"
    assert held(db) == (0, 0, 0)
    assert client.post("/api/v1/endpoints", json={**EP, "name": "a"}, headers=h).status_code == 202
    assert (
        client.post(
            "/api/v1/endpoints", json={**EP, "name": "b", "replicas": {"min": 0, "max": 1}}, headers=h
        ).status_code
        == 202
    )
    before = held(db)
    body = problem(client.post("/api/v1/endpoints", json={**EP, "name": "c"}, headers=h), 409)
    assert body["limit"] == "max_endpoints"
    assert held(db) == before
    # A grant that is spent holds no replica.
    poor = tenant(client, seeded, "pauper", hours=0.0001)
    with db.write() as s:
        t = s.execute(select(Tenant).where(Tenant.name == "pauper")).scalar_one()
        t.used_ipu_ms = t.quota_ipu_ms
    problem(client.post("/api/v1/endpoints", json=EP, headers=poor), 403)
    assert held(db) == before


def test_an_own_model_that_does_not_fit_is_refused(client: Any, seeded: Seeded, db: Any) -> None:
    h = tenant(client, seeded, "bigmodel", plan="standard")
    up = client.post(
        "/api/v1/models",
        headers=h,
        files={"file": ("bert-large.onnx", onnx_files.rendering("bert-large", "infer", 384))},
        data={"name": "my-bert-large", "dims": json.dumps({"sequence": 384})},
    )
    assert up.status_code == 201, up.text
    # BERT-Large's FP32 weights alone (1.27 GB) are more than one IPU's 900 MB: not even a batch of one.
    body = {
        "name": "big",
        "model": "my-bert-large",
        "precision": "fp32",
        "ipus_per_replica": 1,
        "machine": "m2000",
    }
    refused = problem(client.post("/api/v1/endpoints", json=body, headers=h), 422)
    assert "Out of memory" in refused["detail"] and "my-bert-large" in refused["detail"]
    assert held(db) == (0, 0, 0)
    # On "auto" it is laid out on enough IPUs, and the endpoint names the model as its owner does.
    ok = client.post("/api/v1/endpoints", json={**body, "ipus_per_replica": "auto"}, headers=h)
    assert ok.status_code == 202, ok.text
    assert ok.json()["ipus_per_replica"] >= 2 and ok.json()["model"] == "my-bert-large"
    assert ok.json()["model_id"] == up.json()["id"]


def test_other_tenants_get_404_and_an_invoke_only_key_can_do_nothing_here(
    client: Any, seeded: Seeded, db: Any
) -> None:
    owner = tenant(client, seeded, "owner")
    other = tenant(client, seeded, "other")
    ep = client.post("/api/v1/endpoints", json=EP, headers=owner).json()
    for method, url, body in [
        ("GET", f"/api/v1/endpoints/{ep['id']}", None),
        ("GET", f"/api/v1/endpoints/{ep['id']}/metrics", None),
        ("PATCH", f"/api/v1/endpoints/{ep['id']}", {"max_queue": 3}),
        ("DELETE", f"/api/v1/endpoints/{ep['id']}", None),
    ]:
        problem(client.request(method, url, json=body, headers=other), 404)
    assert client.get("/api/v1/endpoints", headers=other).json()["items"] == []
    key = client.post("/api/v1/keys", json={"name": "app", "scopes": ["invoke"]}, headers=owner)
    assert key.status_code == 201 and key.json()["scopes"] == ["invoke"], key.text
    invoke = {"Authorization": f"Bearer {key.json()['api_key']}"}
    for method, url, body in [
        ("GET", "/api/v1/endpoints", None),
        ("POST", "/api/v1/endpoints", {**EP, "name": "x"}),
        ("GET", f"/api/v1/endpoints/{ep['id']}", None),
        ("GET", f"/api/v1/endpoints/{ep['id']}/metrics", None),
        ("PATCH", f"/api/v1/endpoints/{ep['id']}", {"max_queue": 3}),
        ("DELETE", f"/api/v1/endpoints/{ep['id']}", None),
        ("GET", "/api/v1/jobs", None),
        ("GET", "/api/v1/usage", None),
        ("POST", "/api/v1/keys", {"name": "escalate"}),
    ]:
        problem(client.request(method, url, json=body, headers=invoke), 403)
    assert client.get(f"/api/v1/endpoints/{ep['id']}", headers=owner).json()["max_queue"] == EP.get(
        "max_queue", 256
    )
    # Keys made before endpoints existed could submit: they may invoke too (the migration gave it).
    mine = client.get("/api/v1/keys", headers=owner).json()["items"]
    assert all("invoke" in k["scopes"] for k in mine if "submit" in k["scopes"])


def test_metrics_answer_without_a_data_plane_window(client: Any, seeded: Seeded) -> None:
    h = tenant(client, seeded, "watcher")
    ep = client.post("/api/v1/endpoints", json=EP, headers=h).json()
    m = client.get(f"/api/v1/endpoints/{ep['id']}/metrics?minutes=30", headers=h)
    assert m.status_code == 200, m.text
    assert m.json()["history"] == [] and m.json()["replicas"]["desired"] == 1
    problem(client.get(f"/api/v1/endpoints/{ep['id']}/metrics?minutes=0", headers=h), 422)


def test_prometheus_counts_endpoints_and_their_replicas_by_state(client: Any, seeded: Seeded) -> None:
    h = tenant(client, seeded, "scraped")
    ep = client.post("/api/v1/endpoints", json={**EP, "replicas": {"min": 2, "max": 2}}, headers=h).json()
    client.post("/api/v1/endpoints", json={**EP, "name": "idle", "replicas": {"min": 0, "max": 1}}, headers=h)
    text = client.get("/metrics").text
    assert f'ipucloud_endpoint_replicas{{endpoint="{ep["id"]}",state="queued"}} 2.0' in text
    assert 'ipucloud_cluster_endpoints{state="provisioning"} 1.0' in text
    assert 'ipucloud_cluster_endpoints{state="scaled-to-zero"} 1.0' in text


def test_a_patch_that_moves_the_wanted_replicas_is_an_endpoint_scaled_event(
    client: Any, seeded: Seeded, db: Any
) -> None:
    h = tenant(client, seeded, "patcher", plan="standard")
    other = tenant(client, seeded, "onlooker", plan="standard")
    ep = client.post("/api/v1/endpoints", json=EP, headers=h).json()
    scaled = "/api/v1/events?type=endpoint.scaled"
    # Refused: nothing changed, nothing said.
    problem(
        client.patch(f"/api/v1/endpoints/{ep['id']}", json={"replicas": {"min": 3, "max": 2}}, headers=h), 422
    )
    # Within the bounds it already had: its wanted count stays 1, no event.
    ok = client.patch(f"/api/v1/endpoints/{ep['id']}", json={"replicas": {"min": 1, "max": 3}}, headers=h)
    assert ok.status_code == 200, ok.text
    assert client.get(scaled, headers=h).json()["items"] == []
    ok = client.patch(f"/api/v1/endpoints/{ep['id']}", json={"replicas": {"min": 2, "max": 3}}, headers=h)
    assert ok.status_code == 200 and ok.json()["replicas"]["desired"] == 2, ok.text
    (event,) = client.get(scaled, headers=h).json()["items"]
    assert event["id"].startswith(f"endpoint.scaled:{ep['id']}:1-2:")
    assert event["data"] == {
        "id": ep["id"],
        "name": "bert",
        "state": "provisioning",
        "url": f"/api/v1/endpoints/{ep['id']}",
        "from": 1,
        "to": 2,
        "reason": "replicas set to 2..3",
    }
    # Another tenant sees none of it.
    assert client.get("/api/v1/events", headers=other).json()["items"] == []
