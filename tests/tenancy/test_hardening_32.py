"""Issue 32 (the third round of hardening): what a new user and an attacker met, each now answered
right, one test each (items with their own files are named in them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update

from scheduler.models import OwnModel, Tenant, utcnow
from scheduler.services import keys
from tests.support import onnx_files
from tests.tenancy.conftest import World, assert_problem, auth

MODEL = ("m.onnx", onnx_files.mlp(hidden=32, layers=2, features=16), "application/octet-stream")


def models(db: Any) -> int:
    with db.read() as s:
        return int(s.execute(select(func.count()).select_from(OwnModel)).scalar_one())


def test_item_5_an_expired_trial_cannot_upload_models(client: Any, world: World, db: Any) -> None:
    with db.write() as s:
        s.execute(
            update(Tenant).where(Tenant.id == world.a.id).values(expires_at=utcnow() - timedelta(days=1))
        )
    keys.key_cache.forget()
    r = client.post("/api/v1/models", files={"file": MODEL}, headers=auth(world.a.owner_key))
    body = assert_problem(r, 403, "tenant-inactive")
    assert "ended on" in body["detail"], body
    assert models(db) == 0
    # B's trial is whole: it uploads.
    r = client.post("/api/v1/models", files={"file": MODEL}, headers=auth(world.b.owner_key))
    assert r.status_code == 201, r.text
    assert models(db) == 1


def test_item_7_a_plans_largest_partition_is_a_power_of_two(
    client: Any, world: World, db: Any, seeded: Any
) -> None:
    from tests.browser.test_dashboard_http import csrf_of, sign_in

    def largest() -> int:
        r = client.get("/api/v1/admin/plans/standard", headers=auth(world.admin_key))
        return int(r.json()["max_partition_size"])

    before = largest()
    for bad in (3, 48, 100, 65535):
        r = client.patch(
            "/api/v1/admin/plans/standard", json={"max_partition_size": bad}, headers=auth(world.admin_key)
        )
        body = assert_problem(r, 422)
        assert "power of two" in body["detail"], body
    assert largest() == before
    r = client.patch(
        "/api/v1/admin/plans/standard", json={"max_partition_size": 128}, headers=auth(world.admin_key)
    )
    assert r.status_code == 200 and r.json()["max_partition_size"] == 128, r.text

    assert sign_in(client, seeded.admin_key).status_code == 303
    csrf = csrf_of(client, "/admin/tenants")
    r = client.post(
        "/admin/plans/standard", data={"csrf": csrf, "max_partition_size": "48"}, follow_redirects=False
    )
    assert r.status_code == 422 and "power of two" in r.text, r.text[:500]
    assert largest() == 128
