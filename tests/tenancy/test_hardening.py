"""What a new user and an attacker met, each now answered right (issue 17's list, one test each).

The classes of defect have their own tests beside this file: scopes on both faces
(test_scope_matrix.py), hostile input (test_hostile_input.py), streams that outlive their right to
read (test_stream_standing.py).
"""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import timedelta
from typing import Any

from sqlalchemy import update

from scheduler.models import Job, Tenant, utcnow
from scheduler.services.tenancy import keys
from scheduler.settings import get_settings
from tests.support import onnx_files
from tests.tenancy.conftest import JOB, World, assert_problem, auth, start_attempt, submit

# bert-large on 8 IPUs for 64 million samples: about 110,000 s on real IPUs, past a trial's 24 h
# (on 16 IPUs, the trial's largest partition, it would take about 58,000 s).
TOO_LONG = {"model": "bert-large", "seq_len": 384, "samples": 64_000_000}


def test_wait_reasons_name_other_tenants_jobs_only_to_admins(client: Any, world: World, db: Any) -> None:
    # As the scheduler explains it: A's job waits behind B's (it would delay it) and one of A's own.
    own = submit(db, world.a.id, name="mine")
    wait = {
        "reason": "behind",
        "detail": f"it would fit now, but would delay {world.b.job_id}, which has 64 IPUs reserved; "
        f"in line behind {own}",
        "behind": [world.b.job_id, own],
    }
    with db.write() as s:
        s.execute(update(Job).where(Job.id == world.a.job_id).values(wait=wait))
    seen = client.get(f"/api/v1/jobs/{world.a.job_id}", headers=auth(world.a.owner_key)).json()["wait"]
    assert world.b.job_id not in str(seen), seen
    assert seen["behind"] == [own] and seen["behind_other_tenants"] == 1
    assert "would delay a job of another tenant" in seen["detail"] and own in seen["detail"]
    listed = client.get("/api/v1/jobs?state=queued", headers=auth(world.a.owner_key)).json()["items"]
    assert world.b.job_id not in str(listed)
    admin = client.get(f"/api/v1/jobs/{world.a.job_id}", headers=auth(world.admin_key)).json()["wait"]
    assert admin["behind"] == [world.b.job_id, own], "an admin sees whom it waits for"


def test_job_lists_and_cancel_answers_carry_what_the_job_page_does(
    client: Any, world: World, db: Any
) -> None:
    start_attempt(db, world.a.job_id, "p-listed")
    items = client.get("/api/v1/jobs", headers=auth(world.a.owner_key)).json()["items"]
    (running,) = [j for j in items if j["id"] == world.a.job_id]
    assert running["partition"] == "p-listed" and running["history"], running
    assert running["used_ipu_hours"] == 0.0
    queued_id = submit(db, world.a.id, name="waits")
    items = client.get("/api/v1/jobs?state=queued", headers=auth(world.a.owner_key)).json()["items"]
    (queued,) = [j for j in items if j["id"] == queued_id]
    assert queued["wait"]["reason"] == "pending" and queued["history"][0]["state"] == "queued"

    cancelled = client.post(f"/api/v1/jobs/{world.a.job_id}/cancel", headers=auth(world.a.owner_key))
    assert cancelled.status_code == 202
    body = cancelled.json()
    assert body["partition"] == "p-listed" and body["machine"] == "m2000", body
    assert (
        body["cancel_requested"]
        and body["state"] == "cancelled"
        and body["history"][-1]["state"] == "cancelled"
    )


def test_an_expired_trial_says_so_reads_and_cannot_make_keys(client: Any, world: World, db: Any) -> None:
    with db.write() as s:
        s.execute(
            update(Tenant).where(Tenant.id == world.a.id).values(expires_at=utcnow() - timedelta(days=1))
        )
    keys.key_cache.forget()
    tenant = client.get(f"/api/v1/admin/tenants/{world.a.id}", headers=auth(world.admin_key)).json()
    assert tenant["status"] == "expired"
    assert client.get("/api/v1/jobs", headers=auth(world.a.owner_key)).status_code == 200
    assert_problem(
        client.post("/api/v1/keys", json={"name": "more"}, headers=auth(world.a.owner_key)),
        403,
        "tenant-inactive",
    )
    assert_problem(
        client.post("/api/v1/jobs", json=JOB, headers=auth(world.a.owner_key)), 403, "tenant-inactive"
    )


def test_a_global_key_must_be_an_admin_key(client: Any, world: World, db: Any) -> None:
    r = client.post(
        "/api/v1/keys", json={"name": "reader", "scopes": ["read"]}, headers=auth(world.admin_key)
    )
    assert_problem(r, 422)
    # One made anyway (an older deployment, straight in the database) sees no tenant's jobs.
    with db.write() as s:
        row, key = keys.create_key(session=s, secret=get_settings().secret(), tenant_id=None, name="x")
        s.execute(update(type(row)).where(type(row).id == row.id).values(scopes="read"))
    keys.key_cache.forget()
    assert_problem(client.get("/api/v1/jobs", headers=auth(key)), 403, "forbidden")


def test_a_job_longer_than_its_plan_allows_is_refused_with_what_would_fit(
    client: Any, world: World, db: Any
) -> None:
    with db.write() as s:
        s.execute(
            update(Tenant).where(Tenant.id == world.a.id).values(plan_name="trial", quota_ipu_ms=10**12)
        )
    keys.key_cache.forget()
    headers = auth(world.a.owner_key)
    estimate = client.post(
        "/api/v1/estimates", json={"workload": TOO_LONG, "ipus": 8}, headers=headers
    ).json()
    limit = estimate["runtime_limit"]
    assert estimate["fits"] and estimate["total_s"] > 86_400
    assert limit["max_runtime_s"] == 86_400 and limit["within"] is False
    assert limit["fitting_samples"] > 0 and "86,400 s" in limit["detail"], limit
    assert limit["fitting_ipus"] == 16 and "all of it on 16 IPUs" in limit["detail"]
    job = {"name": "long", "workload": TOO_LONG, "ipus": 8}
    body = assert_problem(client.post("/api/v1/jobs", json=job, headers=headers), 409, "limit-exceeded")
    assert body["limit"] == "max_runtime_s" and body["max_runtime_s"] == 86_400
    assert body["predicted_runtime_s"] == round(estimate["total_s"], 3)
    assert f"{body['fitting_samples']:,} samples on 8 IPUs" in body["detail"], body["detail"]
    # Asked to stop within the limit, it runs that long: the estimate and the submission agree.
    capped = client.post(
        "/api/v1/estimates", json={"workload": TOO_LONG, "ipus": 8, "max_runtime_s": 3600}, headers=headers
    ).json()
    assert capped["runtime_limit"]["within"] is True
    accepted = client.post("/api/v1/jobs", json={**job, "max_runtime_s": 3600}, headers=headers)
    assert accepted.status_code == 202 and accepted.json()["max_runtime_s"] == 3600
    # What would fit does fit.
    fitting = {**TOO_LONG, "samples": body["fitting_samples"]}
    assert client.post("/api/v1/jobs", json={**job, "workload": fitting}, headers=headers).status_code == 202


def test_a_chunked_body_over_the_limit_gets_413(client: Any, world: World) -> None:
    def chunks() -> Any:
        for _ in range(100):
            yield b"x" * 1024

    for path, kind in (("/api/v1/jobs", "application/json"), ("/login", "application/x-www-form-urlencoded")):
        r = client.post(path, content=chunks(), headers={**auth(world.a.owner_key), "content-type": kind})
        assert_problem(r, 413, "payload-too-large")


def test_docs_serve_pinned_assets_from_this_server_with_the_dashboards_headers(client: Any) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert (
        "script-src 'self'" in csp
        and "unsafe-inline" not in csp
        and page.headers["x-frame-options"] == "DENY"
    )
    assert "http://" not in page.text and "https://" not in page.text, "nothing from another site"
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page.text) is None, "no inline script"
    assets = re.findall(r'(?:src|href)="(/docs/assets/[^"]+)" integrity="(sha384-[^"]+)"', page.text)
    assert len(assets) == 2
    for path, integrity in assets:
        served = client.get(path)
        assert served.status_code == 200 and served.headers["content-security-policy"] == csp
        digest = "sha384-" + base64.b64encode(hashlib.sha384(served.content).digest()).decode()
        assert digest == integrity, f"{path} is not the pinned asset the page names"
    assert client.get("/docs/assets/../../secret.key").status_code == 404
    assert client.get("/docs/assets/index.html").status_code == 404


def test_a_model_name_or_operator_list_with_a_hidden_end_is_refused(
    client: Any, world: World, db: Any
) -> None:
    # `$` in a Python pattern matches before a final newline: "mlp\n" passed for "mlp".
    model = ("m.onnx", onnx_files.mlp(hidden=32, layers=2, features=16), "application/octet-stream")
    for fields in (
        {"name": "mlp\n"},
        {"name": "mlp", "elementwise": "\xa0"},
        {"name": "mlp", "elementwise": "Relu\n"},
    ):
        r = client.post("/api/v1/models", data=fields, files={"file": model}, headers=auth(world.a.owner_key))
        assert_problem(r, 422)
    assert client.get("/api/v1/models", headers=auth(world.a.owner_key)).json()["items"] == []


def test_a_cancel_that_lost_a_deadlock_is_run_again_not_answered_503(
    client: Any, world: World, db: Any, monkeypatch: Any
) -> None:
    """PostgreSQL aborts one transaction of a deadlock (and of a serialization conflict) and says to
    run it again: a cancel that lost one is, whole, instead of answering 503 "unavailable". Any other
    database error still is 503, at once."""
    import psycopg.errors
    from sqlalchemy.exc import OperationalError

    from api.routers import jobs as routes

    cancel = routes.job_service.request_cancel
    raised: list[str] = []

    def losing_once(**kwargs: Any) -> Any:
        if not raised:
            raised.append("deadlock")
            raise OperationalError("SELECT", {}, psycopg.errors.DeadlockDetected("deadlock detected"))
        return cancel(**kwargs)

    monkeypatch.setattr(routes.job_service, "request_cancel", losing_once)
    answer = client.post(f"/api/v1/jobs/{world.a.job_id}/cancel", headers=auth(world.a.owner_key))
    assert answer.status_code == 202 and answer.json()["state"] == "cancelled", answer.text
    assert raised == ["deadlock"]

    def down(**kwargs: Any) -> Any:
        raised.append("down")
        raise OperationalError("SELECT", {}, psycopg.errors.AdminShutdown("terminating connection"))

    monkeypatch.setattr(routes.job_service, "request_cancel", down)
    queued = submit(db, world.a.id)
    answer = client.post(f"/api/v1/jobs/{queued}/cancel", headers=auth(world.a.owner_key))
    assert answer.status_code == 503 and raised == ["deadlock", "down"], answer.text
