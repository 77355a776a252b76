"""Issue #32 item 4: a graph exported with a dynamic batch and a dynamic sequence is taken as it is.
Its sizes belong to the job: the upload keeps the symbols and describes the graph at a stated size;
estimates, jobs and endpoints bind them from `seq_len` or `dims`."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.models import Job
from tests.models.test_models_api import alpha, listed, push  # noqa: F401  (fixture)
from tests.support import onnx_files
from tests.tenancy.conftest import assert_problem, auth

DESCRIBE_DIM_SIZE = 128  # the stated size (scheduler.services.own_models.DESCRIBE_DIM_SIZE)
# Per token, forward: x[32] @ w1[32x64] then a[64] @ w2[64x8], two FLOPs a multiply-add.
FLOPS_PER_TOKEN = 2 * 32 * 64 + 2 * 64 * 8


def test_a_dynamic_batch_and_sequence_upload_is_kept_and_described_at_a_stated_size(
    client: Any,
    alpha: Any,  # noqa: F811
) -> None:
    r = push(client, alpha.owner_key, onnx_files.dynamic_export_model(), "exported.onnx")
    assert r.status_code == 201, r.text
    m = r.json()
    assert m["batch_dim"] == "s0" and m["dynamic_dims"] == ["s1"]
    assert m["dims"] == {}, "no size is made the model's: the job gives it"
    assert m["described_at"] == {"s1": DESCRIBE_DIM_SIZE}
    assert any(f"described at s1={DESCRIBE_DIM_SIZE}" in n and "seq_len" in n for n in m["notes"]), m["notes"]
    assert m["forward_flops_per_sample"] >= DESCRIBE_DIM_SIZE * FLOPS_PER_TOKEN
    assert m["forward_flops_per_sample"] < 1.2 * DESCRIBE_DIM_SIZE * FLOPS_PER_TOKEN
    assert [x["name"] for x in listed(client, alpha.owner_key)] == ["exported"]
    # A size given at upload is still the model's default, and the figures are at it.
    r = push(client, alpha.owner_key, onnx_files.dynamic_export_model(), "sized.onnx", dims={"s1": 256})
    assert r.status_code == 201, r.text
    assert r.json()["dims"] == {"s1": 256} and r.json()["described_at"] == {"s1": 256}


def _estimate(client: Any, key: str, **workload: Any) -> Any:
    body = {
        "workload": {"model": "exported", "task": "infer", "batch_size": 8, "steps": 10, **workload},
        "ipus": 1,
    }
    return client.post("/api/v1/estimates", headers=auth(key), json=body)


def test_estimates_jobs_and_endpoints_bind_the_sizes(client: Any, alpha: Any, db: Any) -> None:  # noqa: F811
    assert (
        push(client, alpha.owner_key, onnx_files.dynamic_export_model(), "exported.onnx").status_code == 201
    )
    short = _estimate(client, alpha.read_key, seq_len=64)
    long = _estimate(client, alpha.read_key, seq_len=1024)
    by_dims = _estimate(client, alpha.read_key, dims={"s1": 1024})
    for r in (short, long, by_dims):
        assert r.status_code == 200, r.text
        assert r.json()["fits"], r.json()
    assert long.json()["step_s"] > short.json()["step_s"]
    assert by_dims.json()["step_s"] == pytest.approx(long.json()["step_s"])
    # Without a size the estimate and the job are refused, saying what to give; nothing is stored.
    with db.read() as s:
        before = s.execute(select(func.count()).select_from(Job)).scalar_one()
    unsized = assert_problem(_estimate(client, alpha.read_key), 422)
    assert "'s1'" in unsized["detail"] and "seq_len" in unsized["detail"]
    job = {
        "name": "exported",
        "workload": {"model": "exported", "task": "infer", "batch_size": 8, "steps": 10},
    }
    refused = assert_problem(
        client.post("/api/v1/jobs", headers=auth(alpha.owner_key), json={**job, "ipus": 1}), 422
    )
    assert "seq_len" in refused["detail"]
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == before, "nothing stored"
    sized = {**job, "ipus": 1, "workload": {**job["workload"], "seq_len": 96}}
    r = client.post("/api/v1/jobs", headers=auth(alpha.owner_key), json=sized)
    assert r.status_code == 202, r.text
    assert r.json()["workload"]["seq_len"] == 96
    # An endpoint binds it the same way.
    ep = {"name": "exported-ep", "model": "exported", "batching": {"max_batch_size": 4, "max_wait_ms": 2}}
    r = client.post("/api/v1/endpoints", headers=auth(alpha.owner_key), json={**ep, "seq_len": 64})
    assert r.status_code in (201, 202), r.text
    r = client.post("/api/v1/endpoints", headers=auth(alpha.owner_key), json={**ep, "name": "unsized"})
    assert "seq_len" in assert_problem(r, 422)["detail"]
