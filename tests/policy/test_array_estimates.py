"""`POST /estimates` with `array` or `sweep`: each element as a job's estimate answers it, the whole
in total, and starts forecast no more than `max_running` at once; bad input a 4xx naming the field;
nothing stored or reserved."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.models import Job, JobArray, Tenant
from tests.policy.test_live_pass import new_tenant

WORKLOAD = {"model": "resnet50", "task": "train", "batch_size": 256, "steps": 2000}


def post(client: Any, key: str, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/estimates", json=body, headers={"Authorization": f"Bearer {key}"})


def single(client: Any, key: str, batch_size: int, ipus: int) -> dict[str, Any]:
    r = post(
        client, key, {"workload": {**WORKLOAD, "batch_size": batch_size}, "ipus": ipus, "machine": "m2000"}
    )
    assert r.status_code == 200, r.text
    return r.json()


def nothing_stored(db: Any, tenant: str) -> None:
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 0
        assert s.execute(select(func.count()).select_from(JobArray)).scalar_one() == 0
        assert s.get(Tenant, tenant).reserved_ipu_ms == 0


def test_a_sweep_is_estimated_per_point_and_in_total_within_its_max_running(
    db: Any, seeded: Any, client: Any
) -> None:
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    body = {
        "workload": WORKLOAD,
        "ipus": 4,
        "machine": "m2000",
        "array": {"max_running": 2},
        "sweep": {
            "method": "grid",
            "parameters": {"workload.batch_size": {"values": [256, 1024]}, "ipus": {"values": [4, 8, 16]}},
        },
    }
    r = post(client, key, body)
    assert r.status_code == 200, r.text
    out = r.json()
    rows = out["elements"]
    assert [(row["index"], row["params"]) for row in rows] == [
        (i, {"workload.batch_size": b, "ipus": n})
        for i, (b, n) in enumerate((b, n) for b in (256, 1024) for n in (4, 8, 16))
    ]
    for row in rows:
        alone = single(client, key, row["params"]["workload.batch_size"], row["params"]["ipus"])
        assert row["fits"] and row["machine"] == "m2000"
        for field in ("ipus", "total_s", "throughput", "ipu_hours", "charged_ipu_hours"):
            assert row[field] == alone[field], (row, field)
    totals = out["totals"]
    assert totals["elements"] == totals["fitting"] == 6 and totals["max_running"] == 2
    assert totals["charged_ipu_hours"] == pytest.approx(
        sum(row["charged_ipu_hours"] for row in rows), abs=1e-5
    )
    assert totals["ipu_hours"] == pytest.approx(sum(row["ipu_hours"] for row in rows), abs=1e-5)
    assert out["charged_ipu_hours"] == totals["charged_ipu_hours"] and out["fits"] is True
    assert out["elements_truncated"] is False
    # An idle fleet with room for all six: still only two at a time, in index order.
    spans = [(row["expected_wait_s"], row["expected_wait_s"] + row["total_s"]) for row in rows]
    assert all(row["expected_wait_s"] is not None for row in rows)
    assert sorted(row["expected_wait_s"] for row in rows)[:2] == [0.0, 0.0]
    assert sum(1 for row in rows if row["expected_wait_s"] > 1) == 4
    for start, _ in spans:
        running = sum(1 for a, b in spans if a <= start + 0.01 < b - 0.01)
        assert running <= 2, (start, spans)
    assert totals["expected_wait_s"] == 0.0
    assert totals["expected_end_s"] == pytest.approx(max(b for _, b in spans), abs=0.01)
    # Without max_running, all six are forecast to start at once.
    free = post(client, key, {**body, "array": None}).json()
    assert {row["expected_wait_s"] for row in free["elements"]} == {0.0}
    nothing_stored(db, tenant)


def test_rows_are_capped_but_the_totals_count_every_element(db: Any, seeded: Any, client: Any) -> None:
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    alone = single(client, key, 256, 4)
    body = {
        "workload": WORKLOAD,
        "ipus": 4,
        "machine": "m2000",
        "array": {"indices": "0-99:3"},
        "max_rows": 10,
    }
    out = post(client, key, body).json()
    assert [row["index"] for row in out["elements"]] == list(range(0, 30, 3))
    assert out["elements_truncated"] is True and out["totals"]["elements"] == 34
    assert out["totals"]["charged_ipu_hours"] == pytest.approx(34 * alone["charged_ipu_hours"], abs=1e-4)
    assert all(row["params"] is None for row in out["elements"])
    assert post(client, key, {**body, "max_rows": 1001}).status_code == 422
    nothing_stored(db, tenant)


def test_a_point_that_cannot_run_is_a_row_that_says_so(db: Any, seeded: Any, client: Any) -> None:
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    body = {"workload": WORKLOAD, "ipus": 4, "sweep": {"parameters": {"ipus": {"values": [4, 256]}}}}
    out = post(client, key, body).json()
    small, huge = out["elements"]
    assert small["fits"] and not huge["fits"] and huge["error"]
    assert out["fits"] is False and out["totals"]["fitting"] == 1
    assert out["totals"]["charged_ipu_hours"] == small["charged_ipu_hours"]
    nothing_stored(db, tenant)


def test_bad_array_input_is_refused_naming_the_field(db: Any, seeded: Any, client: Any) -> None:
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    trial, trial_key = new_tenant(db, "tiny", quota_ipu_hours=10_000)
    with db.write() as s:
        s.get(Tenant, trial).plan_name = "trial"  # 64 elements per array
    base = {"workload": WORKLOAD, "ipus": 4}
    cases = [
        (key, {**base, "array": {"max_running": 2}}, 422, None),
        (
            key,
            {**base, "array": {"indices": "0-3"}, "sweep": {"parameters": {"ipus": {"values": [4]}}}},
            422,
            None,
        ),
        (key, {**base, "array": {"indices": "5-1"}}, 422, None),
        (key, {**base, "array": {"indices": "0-3", "max_running": 100_000}}, 422, None),
        (key, {**base, "array": {"indices": "0-3", "max_running": 5000}}, 422, "array.max_running"),
        (trial_key, {**base, "array": {"indices": "0-99"}}, 422, "array.indices"),
        (
            key,
            {**base, "sweep": {"method": "grid", "parameters": {"workload.steps": {"min": 1, "max": 9}}}},
            422,
            None,
        ),
        (key, {**base, "sweep": {"parameters": {"workload.nope": {"values": [1]}}}}, 422, None),
        (key, {**base, "ipus": 3, "array": {"indices": "0-3"}}, 422, "ipus"),
        (
            key,
            {
                "workload": {**WORKLOAD, "task": "infer"},
                "ipus": 4,
                "array": {"indices": "0-1"},
                "serve": {"batch_sizes": [1]},
            },
            422,
            None,
        ),
    ]
    for k, body, status, field in cases:
        r = post(client, k, body)
        assert r.status_code == status, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json"), r.text
        if field is not None:
            assert r.json().get("field") == field, r.text
    nothing_stored(db, tenant)
    nothing_stored(db, trial)
