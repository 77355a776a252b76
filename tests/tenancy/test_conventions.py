"""API conventions: problem bodies, Idempotency-Key, size limits, per-key rate limits."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.models import Job
from tests.support import services
from tests.tenancy.conftest import JOB, World, assert_problem, auth


def test_idempotency_key_replays_the_first_response_or_conflicts(client: Any, world: World, db: Any) -> None:
    headers = {**auth(world.a.owner_key), "Idempotency-Key": "nightly-2026-12-02"}
    first = client.post("/api/v1/jobs", json=JOB, headers=headers)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    again = client.post("/api/v1/jobs", json=JOB, headers=headers)
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    body = assert_problem(
        client.post("/api/v1/jobs", json={**JOB, "name": "other"}, headers=headers),
        409,
        "idempotency-key-reused",
    )
    assert body["job_id"] == first.json()["id"]
    # The key belongs to the tenant: another tenant using the same key gets its own job.
    other = client.post(
        "/api/v1/jobs", json=JOB, headers={**auth(world.b.owner_key), "Idempotency-Key": "nightly-2026-12-02"}
    )
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    for bad in ("", "x" * 256, "tab\tkey"):
        assert_problem(
            client.post("/api/v1/jobs", json=JOB, headers={**headers, "Idempotency-Key": bad}), 422
        )
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 4  # 2 seeded, 2 submitted


def test_oversized_bodies_and_strings_are_refused(client: Any, world: World) -> None:
    headers = auth(world.a.owner_key)
    huge = {**JOB, "name": "x" * 70_000}
    assert_problem(client.post("/api/v1/jobs", json=huge, headers=headers), 413, "payload-too-large")
    assert_problem(client.post("/api/v1/jobs", json={**JOB, "name": "x" * 101}, headers=headers), 422)
    assert_problem(
        client.post("/api/v1/trials", content=b"x" * 70_000, headers={"content-type": "application/json"}),
        413,
    )
    assert_problem(client.get("/api/v1/jobs?cursor=" + "x" * 201, headers=headers), 422)
    assert_problem(client.get("/api/v1/jobs/" + "j" * 65, headers=headers), 422)


def test_every_error_is_a_problem(client: Any, world: World) -> None:
    headers = auth(world.a.owner_key)
    assert_problem(client.get("/api/v1/nowhere", headers=headers), 404, "not-found")
    r = client.put("/api/v1/jobs", headers=headers)
    assert_problem(r, 405, "method-not-allowed")
    assert "GET" in r.headers["allow"] or "POST" in r.headers["allow"]
    assert_problem(
        client.post("/api/v1/jobs", content=b"{", headers={**headers, "content-type": "application/json"}),
        400,
    )
    body = assert_problem(client.post("/api/v1/jobs", json={**JOB, "ipus": 3}, headers=headers), 422)
    assert body["errors"] and body["instance"] == "/api/v1/jobs"


def test_per_key_rate_limit_answers_429_with_retry_after(
    client: Any, world: World, runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPUCLOUD_RATE_LIMIT", "5/minute")
    services.reload_settings(runtime)
    a, b = auth(world.a.owner_key), auth(world.a.member_key)
    codes = [client.get("/api/v1/jobs", headers=a).status_code for _ in range(7)]
    assert codes == [200] * 5 + [429] * 2
    r = client.get("/api/v1/jobs", headers=a)
    assert_problem(r, 429, "rate-limited")
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert client.get("/api/v1/jobs", headers=b).status_code == 200, "the limit is per key"
    # Failed authentication spends a budget per client address, so guessing keys is throttled too.
    codes = [client.get("/api/v1/jobs", headers=auth("ipuc_" + "0" * 61)).status_code for _ in range(6)]
    assert codes == [401] * 5 + [429]
