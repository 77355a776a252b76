"""Tenants' own ONNX models through the API: upload, describe, list, remove, quota, every bad input, and
their use in estimates and jobs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.services.tenancy import tenants
from tests.support import onnx_files
from tests.support.services import reload_settings
from tests.tenancy.conftest import assert_problem, auth, make_tenant
from vipu.emulator import WorkloadSpec

BERT = onnx_files.rendering("bert-base", "infer", 128)


@pytest.fixture
def alpha(db: Any, seeded: Any) -> Any:
    return make_tenant(db, "alpha")


@pytest.fixture
def beta(db: Any, seeded: Any) -> Any:
    return make_tenant(db, "beta")


def push(client: Any, key: str, data: bytes, filename: str = "model.onnx", **fields: Any) -> Any:
    form = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in fields.items()}
    return client.post("/api/v1/models", headers=auth(key), files={"file": (filename, data)}, data=form)


def listed(client: Any, key: str) -> list[dict[str, Any]]:
    r = client.get("/api/v1/models", headers=auth(key))
    assert r.status_code == 200, r.text
    return r.json()["items"]


def test_an_upload_is_described_and_found_by_id_or_name(client: Any, alpha: Any) -> None:
    body = assert_problem(push(client, alpha.owner_key, BERT, "bert-base.onnx", dims={"sequence": 128}), 422)
    assert "'bert-base' is a catalogue workload" in body["detail"]
    r = push(client, alpha.owner_key, BERT, "my bert.onnx", dims={"sequence": 128})
    assert r.status_code == 201, r.text
    m = r.json()
    assert m["name"] == "my-bert" and m["id"].startswith("mdl_")
    catalogue = WorkloadSpec(model="bert-base", task="infer", seq_len=128).graph()
    assert m["parameters"] == catalogue.params
    assert m["forward_flops_per_sample"] == pytest.approx(catalogue.flops_per_sample, rel=0.01)
    assert [i["name"] for i in m["inputs"]] == ["input_ids", "token_type_ids", "attention_mask"]
    assert m["inputs"][0]["shape"] == ["batch", "sequence"] and m["inputs"][0]["dynamic"] == [0, 1]
    assert m["batch_dim"] == "batch" and m["dynamic_dims"] == ["sequence"] and m["dims"] == {"sequence": 128}
    assert m["operators"]["MatMul"] == 12 * 6 + 1 and m["tasks"] == ["train", "infer"]
    assert m["activation_bytes_per_sample"]["fp32"] == 2 * m["activation_bytes_per_sample"]["fp16"] > 0
    assert m["graph_bytes"] == len(BERT) < 512 * 1024 and m["weights_stripped_bytes"] == 0
    assert r.headers["location"] == f"/api/v1/models/{m['id']}"
    for ref in (m["id"], m["name"]):
        got = client.get(f"/api/v1/models/{ref}", headers=auth(alpha.read_key))
        assert got.status_code == 200 and got.json() == m
    assert [x["id"] for x in listed(client, alpha.member_key)] == [m["id"]]


def test_a_file_with_its_weights_is_kept_without_them(client: Any, alpha: Any) -> None:
    data = onnx_files.mlp(hidden=256, layers=3)
    r = push(client, alpha.owner_key, data, "mlp.onnx")
    assert r.status_code == 201, r.text
    m = r.json()
    assert m["name"] == "mlp" and m["uploaded_bytes"] == len(data)
    assert m["weights_stripped_bytes"] > 0.95 * (256 * 64 + 2 * 256 * 256) * 4
    assert m["graph_bytes"] < 4096
    assert m["parameters"] == 256 * 64 + 256 + 2 * (256 * 256 + 256)


def test_another_tenants_model_is_a_404(client: Any, alpha: Any, beta: Any) -> None:
    m = push(client, alpha.owner_key, onnx_files.mlp(), "mine.onnx").json()
    for method in ("GET", "DELETE"):
        r = client.request(method, f"/api/v1/models/{m['id']}", headers=auth(beta.owner_key))
        assert_problem(r, 404, "not-found")
    assert listed(client, beta.owner_key) == []
    job = {"name": "theirs", "workload": {"model": m["id"], "task": "infer", "steps": 1}, "ipus": 1}
    r = client.post("/api/v1/jobs", headers=auth(beta.owner_key), json=job)
    body = assert_problem(r, 422, "invalid-request")
    assert "no catalogue workload or model of yours" in body["detail"]
    assert client.get(f"/api/v1/models/{m['id']}", headers=auth(alpha.owner_key)).status_code == 200


BAD_INPUTS = [
    ("not-onnx", b"this is a text file, not a model\n", "not-onnx", ()),
    ("empty", b"", "not-onnx", ()),
    ("truncated", BERT[: len(BERT) // 2], "corrupt", ()),
    ("garbage", bytes(range(256)) * 64, "not-onnx", ()),
    ("no-graph", b"\x08\x07", "not-onnx", ()),
    ("cycle", onnx_files.cycle_model(), "cycle", ("first", "second", "third")),
    ("dangling", onnx_files.dangling_model(), "dangling-input", ("ghost",)),
    ("unknown-op", onnx_files.custom_op_model(), "unknown-operators", ("acme::FastSwish",)),
    ("control-flow", onnx_files.loop_model(), "unsupported-operators", ("Loop",)),
    ("bad-shapes", onnx_files.shape_mismatch_model(), "shape-inference", ()),
]


@pytest.mark.parametrize(("case", "data", "reason", "names"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_a_bad_model_is_a_422_naming_the_problem_and_stores_nothing(
    client: Any, alpha: Any, case: str, data: bytes, reason: str, names: tuple[str, ...]
) -> None:
    r = push(client, alpha.owner_key, data, f"{case}.onnx")
    body = assert_problem(r, 422, "invalid-model")
    assert body["reason"] == reason, body
    for name in names:
        assert any(name in n for n in body["names"]), body
        assert name in body["detail"], body
    assert listed(client, alpha.owner_key) == []


def test_unknown_operators_may_be_declared_element_wise(client: Any, alpha: Any) -> None:
    r = push(
        client, alpha.owner_key, onnx_files.custom_op_model(), "swish.onnx", elementwise="acme::FastSwish"
    )
    assert r.status_code == 201, r.text
    m = r.json()
    assert m["declared_elementwise"] == ["acme::FastSwish"]
    assert [u["operator"] for u in m["unmodelled"]] == ["acme::FastSwish"]
    assert m["operators"]["acme::FastSwish"] == 1


def test_a_dynamic_dimension_bound_at_upload_is_the_default(client: Any, alpha: Any) -> None:
    r = push(client, alpha.owner_key, onnx_files.sequence_model(), "seq.onnx", dims={"sequence": 256})
    assert r.status_code == 201, r.text
    assert r.json()["dims"] == {"sequence": 256}
    body = assert_problem(
        push(client, alpha.owner_key, onnx_files.sequence_model(), "x.onnx", dims={"tokens": 3}),
        422,
        "invalid-request",
    )
    assert "no dynamic dimension 'tokens'" in body["detail"]


@pytest.mark.parametrize(
    ("fields", "status", "field"),
    [
        ({"name": "resnet50"}, 422, "name"),
        ({"name": "mdl_0123"}, 422, "name"),
        ({"name": "no spaces"}, 422, "name"),
        ({"dims": "{not json"}, 422, "dims"),
        ({"dims": '{"sequence": 0}'}, 422, "dims"),
        ({"elementwise": "no spaces!"}, 422, "elementwise"),
        ({"colour": "blue"}, 422, "colour"),
    ],
)
def test_bad_form_fields_are_refused(
    client: Any, alpha: Any, fields: dict[str, str], status: int, field: str
) -> None:
    body = assert_problem(push(client, alpha.owner_key, onnx_files.mlp(), "m.onnx", **fields), status)
    assert field in body["detail"]
    assert listed(client, alpha.owner_key) == []


def test_uploads_must_be_multipart_with_a_file(client: Any, alpha: Any) -> None:
    r = client.post(
        "/api/v1/models",
        headers={**auth(alpha.owner_key), "content-type": "application/octet-stream"},
        content=onnx_files.mlp(),
    )
    assert_problem(r, 415, "unsupported-media-type")
    r = client.post(
        "/api/v1/models", headers=auth(alpha.owner_key), data={"name": "nofile"}, files={"other": ("x", b"1")}
    )
    assert_problem(r, 422)
    r = client.post("/api/v1/models", headers=auth(alpha.owner_key), files={"name": (None, "only-a-name")})
    body = assert_problem(r, 422)
    assert "`file`" in body["detail"]
    r = client.post(
        "/api/v1/models", headers=auth(alpha.read_key), files={"file": ("m.onnx", onnx_files.mlp())}
    )
    assert_problem(r, 403)
    assert listed(client, alpha.owner_key) == []


def test_names_are_unique_per_tenant(client: Any, alpha: Any, beta: Any) -> None:
    first = push(client, alpha.owner_key, onnx_files.mlp(), "net.onnx")
    assert first.status_code == 201
    body = assert_problem(push(client, alpha.owner_key, onnx_files.mlp(seed=5), "net.onnx"), 409, "conflict")
    assert first.json()["id"] in body["detail"]
    assert push(client, beta.owner_key, onnx_files.mlp(), "net.onnx").status_code == 201
    assert len(listed(client, alpha.owner_key)) == 1


def test_the_plan_limits_how_many_models_and_bytes(client: Any, alpha: Any, db: Any) -> None:
    with db.write() as s:
        tenants.update_plan(session=s, name="standard", changes={"max_models": 2, "max_model_bytes": 30_000})
    assert push(client, alpha.owner_key, onnx_files.mlp(), "a.onnx").status_code == 201
    big = push(client, alpha.owner_key, BERT, "b.onnx", dims={"sequence": 64})
    body = assert_problem(big, 409, "limit-exceeded")
    assert body["limit"] == "max_model_bytes"
    assert push(client, alpha.owner_key, onnx_files.mlp(), "c.onnx").status_code == 201
    body = assert_problem(push(client, alpha.owner_key, onnx_files.mlp(), "d.onnx"), 409, "limit-exceeded")
    assert body["limit"] == "max_models"
    assert sorted(m["name"] for m in listed(client, alpha.owner_key)) == ["a", "c"]
    r = client.delete("/api/v1/models/a", headers=auth(alpha.owner_key))
    assert r.status_code == 200 and r.json()["name"] == "a"
    assert push(client, alpha.owner_key, onnx_files.mlp(), "d.onnx").status_code == 201


def test_sizes_over_the_limits_are_413_and_store_nothing(
    monkeypatch: pytest.MonkeyPatch, env: Any, db: Any, runtime: Any, seeded: Any
) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    monkeypatch.setenv("IPUCLOUD_MODEL_UPLOAD_MAX_BYTES", str(200_000))
    monkeypatch.setenv("IPUCLOUD_MODEL_GRAPH_MAX_BYTES", str(8_192))
    reload_settings(runtime)
    a = make_tenant(db, "alpha")
    with TestClient(create_app(runtime=runtime), raise_server_exceptions=False) as client:
        heavy = onnx_files.mlp(hidden=256, layers=3)  # ~0.8 MB of weights
        body = assert_problem(push(client, a.owner_key, heavy, "heavy.onnx"), 413, "payload-too-large")
        assert "200,000" in body["detail"]
        body = assert_problem(push(client, a.owner_key, BERT, "bert.onnx", dims={"sequence": 64}), 413)
        assert "without its weights" in body["detail"]
        assert listed(client, a.owner_key) == []
        assert push(client, a.owner_key, onnx_files.mlp(hidden=32), "small.onnx").status_code == 201
        # Other routes keep the general body limit.
        r = client.post(
            "/api/v1/jobs",
            headers=auth(a.owner_key),
            content=b"{" + b" " * 70_000 + b"}",
        )
        assert_problem(r, 413)


def test_own_models_in_estimates_and_jobs(client: Any, alpha: Any) -> None:
    m = push(client, alpha.owner_key, BERT, "bert.onnx", dims={"sequence": 128}).json()
    workload = {"model": "bert", "task": "infer", "batch_size": 256, "steps": 10}
    est = client.post(
        "/api/v1/estimates", headers=auth(alpha.read_key), json={"workload": workload, "ipus": 4}
    )
    assert est.status_code == 200, est.text
    e = est.json()
    catalogue = client.post(
        "/api/v1/estimates",
        headers=auth(alpha.read_key),
        json={"workload": {**workload, "model": "bert-base"}, "ipus": 4},
    ).json()
    assert e["fits"] and e["throughput"] == pytest.approx(catalogue["throughput"], rel=0.1)
    longer = client.post(
        "/api/v1/estimates",
        headers=auth(alpha.read_key),
        json={"workload": {**workload, "seq_len": 384}, "ipus": 4},
    ).json()
    assert longer["throughput"] < 0.5 * e["throughput"]
    by_dims = client.post(
        "/api/v1/estimates",
        headers=auth(alpha.read_key),
        json={"workload": {**workload, "dims": {"sequence": 384}}, "ipus": 4},
    ).json()
    assert by_dims["throughput"] == pytest.approx(longer["throughput"])
    r = client.post(
        "/api/v1/estimates",
        headers=auth(alpha.read_key),
        json={"workload": {**workload, "dims": {"width": 3}}, "ipus": 4},
    )
    assert "no dynamic dimension 'width'" in assert_problem(r, 422)["detail"]
    r = client.post(
        "/api/v1/estimates",
        headers=auth(alpha.read_key),
        json={"workload": {"model": "resnet50", "dims": {"x": 3}}, "ipus": 4},
    )
    assert_problem(r, 422)

    job = client.post(
        "/api/v1/jobs", headers=auth(alpha.owner_key), json={"name": "mine", "workload": workload, "ipus": 4}
    )
    assert job.status_code == 202, job.text
    j = job.json()
    assert j["workload"]["model"] == m["id"] and j["state"] == "queued"
    r = client.delete(f"/api/v1/models/{m['id']}", headers=auth(alpha.owner_key))
    body = assert_problem(r, 409, "conflict")
    assert j["id"] in body["detail"]
    assert client.post(f"/api/v1/jobs/{j['id']}/cancel", headers=auth(alpha.owner_key)).status_code == 202
    assert client.delete("/api/v1/models/bert", headers=auth(alpha.owner_key)).status_code == 200
    r = client.post(
        "/api/v1/jobs", headers=auth(alpha.owner_key), json={"name": "x", "workload": workload, "ipus": 4}
    )
    assert_problem(r, 422)
    assert client.get(f"/api/v1/jobs/{j['id']}", headers=auth(alpha.owner_key)).json()["state"] == "cancelled"


def test_admin_keys_have_no_models(client: Any, seeded: Any) -> None:
    assert_problem(client.get("/api/v1/models", headers=auth(seeded.admin_key)), 403)
