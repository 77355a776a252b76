"""Trial applications: open to anyone, validated and rate-limited; admins approve or reject."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.errors import Conflict
from scheduler.models import ApiKey, Member, Tenant, TrialApplication
from scheduler.services.tenancy import trials
from tests.support import services
from tests.tenancy.conftest import JOB, assert_problem, auth

APPLICATION = {
    "name": "Ada Lovelace",
    "email": "Ada@Example.org",
    "organisation": "University of Analytical Engines",
    "category": "university",
    "intended_use": "Training graph neural networks for protein folding on IPU-POD64.",
}


def test_apply_approve_and_use_the_trial(client: Any, seeded: Any, db: Any) -> None:
    r = client.post("/api/v1/trials", json=APPLICATION)
    assert r.status_code == 201, r.text
    receipt = r.json()
    assert receipt["status"] == "pending" and receipt["email"] == "ada@example.org"
    assert "intended_use" not in receipt and "reason" not in receipt
    admin = auth(seeded.admin_key)
    pending = client.get("/api/v1/admin/trials?status=pending", headers=admin).json()["items"]
    assert [a["id"] for a in pending] == [receipt["id"]]
    assert pending[0]["intended_use"] == APPLICATION["intended_use"]

    # The admin hands the key over here (mail's claim link, the default, is in tests/tenancy/test_mail.py).
    r = client.post(
        f"/api/v1/admin/trials/{receipt['id']}/approve", json={"hand_over_key": True}, headers=admin
    )
    assert r.status_code == 200, r.text
    decision = r.json()
    tenant, key = decision["tenant"], decision["api_key"]
    assert (
        decision["application"]["status"] == "approved"
        and decision["application"]["plan"] == "trial-university"
    )
    assert tenant["plan"] == "trial-university" and tenant["category"] == "university"
    assert tenant["name"] == "University of Analytical Engines" and tenant["expires_at"]
    assert tenant["quota_ipu_hours"] == 500.0
    with db.read() as s:
        owner = s.execute(select(Member).where(Member.tenant_id == tenant["id"])).scalar_one()
        assert (owner.email, owner.role, owner.name) == ("ada@example.org", "owner", "Ada Lovelace")
    # The key works, once shown; it is never shown again.
    assert client.post("/api/v1/jobs", json=JOB, headers=auth(key)).status_code == 202
    again = client.get(f"/api/v1/admin/trials/{receipt['id']}", headers=admin)
    assert again.json()["tenant_id"] == tenant["id"] and key not in again.text
    assert_problem(
        client.post(f"/api/v1/admin/trials/{receipt['id']}/approve", headers=admin), 409, "conflict"
    )
    assert_problem(
        client.post(f"/api/v1/admin/trials/{receipt['id']}/reject", json={"reason": "late"}, headers=admin),
        409,
    )
    # One free trial per address.
    assert_problem(client.post("/api/v1/trials", json={**APPLICATION, "email": "ADA@example.org"}), 409)


def test_reject_needs_a_reason_and_frees_the_address(client: Any, seeded: Any, db: Any) -> None:
    admin = auth(seeded.admin_key)
    first = client.post("/api/v1/trials", json={**APPLICATION, "category": "individual"}).json()
    assert_problem(client.post("/api/v1/trials", json=APPLICATION), 409, "conflict")
    assert_problem(client.post(f"/api/v1/admin/trials/{first['id']}/reject", json={}, headers=admin), 422)
    assert_problem(
        client.post(f"/api/v1/admin/trials/{first['id']}/reject", json={"reason": ""}, headers=admin), 422
    )
    r = client.post(
        f"/api/v1/admin/trials/{first['id']}/reject",
        json={"reason": "Please apply as a business"},
        headers=admin,
    )
    assert r.status_code == 200 and r.json()["status"] == "rejected" and r.json()["reason"]
    second = client.post("/api/v1/trials", json={**APPLICATION, "category": "business"})
    assert second.status_code == 201
    decision = client.post(
        f"/api/v1/admin/trials/{second.json()['id']}/approve", json={"plan": "standard"}, headers=admin
    ).json()
    assert decision["tenant"]["plan"] == "standard"
    # By default the admin sees no key: the applicant's claim link mints the tenant's first.
    assert decision["api_key"] is None
    with db.read() as s:
        assert s.execute(select(ApiKey).where(ApiKey.tenant_id == decision["tenant"]["id"])).first() is None
    assert_problem(client.post("/api/v1/admin/trials/app_nope/approve", headers=admin), 404, "not-found")
    third = client.post("/api/v1/trials", json={**APPLICATION, "email": "bob@example.org"}).json()
    assert_problem(
        client.post(f"/api/v1/admin/trials/{third['id']}/approve", json={"plan": "gold"}, headers=admin), 422
    )
    with client:  # still pending after the refused approval
        assert client.get(f"/api/v1/admin/trials/{third['id']}", headers=admin).json()["status"] == "pending"


def test_same_organisation_twice_gets_two_tenants(client: Any, seeded: Any) -> None:
    admin = auth(seeded.admin_key)
    names = []
    for email in ("a@acme.example", "b@acme.example"):
        app_id = client.post(
            "/api/v1/trials",
            json={**APPLICATION, "email": email, "organisation": "Acmé / Labs", "category": "business"},
        ).json()["id"]
        names.append(
            client.post(f"/api/v1/admin/trials/{app_id}/approve", headers=admin).json()["tenant"]["name"]
        )
    assert names == ["Acme - Labs", "Acme - Labs-2"]


BAD_CHANGES: list[dict[str, Any]] = [
    {"email": "not-an-address"},
    {"email": "x" * 250 + "@example.org"},
    {"category": "government"},
    {"name": ""},
    {"name": " leading space"},
    {"name": "x" * 101},
    {"organisation": "o" * 201},
    {"intended_use": "short"},
    {"intended_use": "u" * 5001},
    {"intended_use": "bell \x07 inside"},
    {"extra": "field"},
]


def test_bad_applications_are_refused_and_change_nothing(
    client: Any, db: Any, runtime: Any, subtests: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused applications count against the address's budget too; this test sends many.
    monkeypatch.setenv("IPUCLOUD_TRIAL_RATE_LIMIT", "100/minute")
    services.reload_settings(runtime)
    for change in BAD_CHANGES:
        with subtests.test(change=change):
            assert_problem(
                client.post("/api/v1/trials", json={**APPLICATION, **change}), 422, "invalid-request"
            )
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(TrialApplication)).scalar_one() == 0


def test_applications_are_rate_limited_per_address(
    client: Any, db: Any, runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPUCLOUD_TRIAL_RATE_LIMIT", "3/minute")
    services.reload_settings(runtime)
    codes = [
        client.post("/api/v1/trials", json={**APPLICATION, "email": f"u{i}@example.org"}).status_code
        for i in range(5)
    ]
    assert codes == [201, 201, 201, 429, 429]
    r = client.post("/api/v1/trials", json={**APPLICATION, "email": "late@example.org"})
    body = assert_problem(r, 429, "rate-limited")
    assert 1 <= int(r.headers["retry-after"]) <= 60 and body["retry_after"] == int(r.headers["retry-after"])
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(TrialApplication)).scalar_one() == 3


def test_admin_lists_applications_with_cursor_pagination(client: Any, seeded: Any, db: Any) -> None:
    with db.write() as s:
        for i in range(7):
            trials.submit_application(
                session=s, **{**APPLICATION, "email": f"p{i}@example.org", "category": "individual"}
            )
    admin = auth(seeded.admin_key)
    seen: list[str] = []
    cursor = None
    while True:
        page = client.get("/api/v1/admin/trials", params={"limit": 3, "cursor": cursor}, headers=admin).json()
        seen += [a["email"] for a in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    # Every application exactly once (ids order by arrival to the millisecond).
    assert sorted(seen) == [f"p{i}@example.org" for i in range(7)]
    assert_problem(client.get("/api/v1/admin/trials?status=maybe", headers=admin), 422)
    assert_problem(client.get("/api/v1/admin/trials?cursor=%%%", headers=admin), 422)
    assert client.get("/api/v1/admin/trials?status=approved", headers=admin).json()["items"] == []


def test_racing_duplicate_applications_leave_one(db: Any, env: Any) -> None:
    """Two submissions from one address at once: the partial unique index lets one through."""
    results: list[str] = []
    barrier = threading.Barrier(4)

    def apply() -> None:
        barrier.wait()
        try:
            with db.write() as s:
                trials.submit_application(session=s, **{**APPLICATION, "category": "business"})
            results.append("ok")
        except Conflict:
            results.append("conflict")

    threads = [threading.Thread(target=apply) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict", "conflict", "conflict", "ok"]
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(TrialApplication)).scalar_one() == 1
        assert s.execute(select(func.count()).select_from(Tenant)).scalar_one() == 0
