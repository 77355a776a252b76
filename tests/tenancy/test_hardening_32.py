"""Issue 32 (the third round of hardening): what a new user and an attacker met, each now answered
right, one test each (items with their own files are named in them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, text, update

from scheduler.models import OwnModel, Tenant, utcnow
from scheduler.services.tenancy import keys
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


def test_item_8_tenant_names_are_unique_whatever_their_case(client: Any, world: World, db: Any) -> None:
    from sqlalchemy.exc import IntegrityError

    from scheduler.ids import new_id

    def create(name: str) -> Any:
        return client.post(
            "/api/v1/admin/tenants",
            json={"name": name, "plan": "standard", "quota_ipu_hours": 1},
            headers=auth(world.admin_key),
        )

    assert create("Acme Labs").status_code == 201
    for same in ("acme labs", "ACME LABS", "Acme labs"):
        body = assert_problem(create(same), 409)
        assert "Acme Labs" in body["detail"], body
    with db.read() as s:
        names = [n for (n,) in s.execute(select(Tenant.name)).all() if n.lower() == "acme labs"]
    assert names == ["Acme Labs"]
    # The database holds the rule too (a service that forgot it, or two racing requests).
    try:
        with db.write() as s:
            s.add(Tenant(id=new_id("ten"), name="ACME LABS", plan_name="standard", quota_ipu_ms=0))
        raise AssertionError("a second ACME LABS was stored")
    except IntegrityError:
        pass


def test_item_8_the_migration_renames_names_alike_but_for_case(db: Any, seeded: Any) -> None:
    from tests.scheduler.test_migrations import _migration

    migration = _migration("0015_hardening")
    with db.engine.begin() as conn:
        conn.execute(text("DROP INDEX uq_tenants_name_lower"))
        for i, name in enumerate(["Zeta", "zeta", "ZETA", "zeta-2"]):
            conn.execute(
                text(
                    "INSERT INTO tenants (id, name, plan_name, status, quota_ipu_ms, used_ipu_ms, "
                    "reserved_ipu_ms, fairshare_weight, created_at, updated_at) VALUES (:id, :name, "
                    "'standard', 'active', 0, 0, 0, 1.0, :at, :at)"
                ),
                {"id": f"ten_z{i}", "name": name, "at": utcnow() + timedelta(seconds=i)},
            )
        renamed = dict(migration.rename_duplicates(conn))
        conn.execute(text("CREATE UNIQUE INDEX uq_tenants_name_lower ON tenants (lower(name))"))
        names = dict(conn.execute(text("SELECT id, name FROM tenants WHERE id LIKE 'ten_z%'")).all())
    assert names["ten_z0"] == "Zeta" and names["ten_z3"] == "zeta-2"
    assert renamed == {"ten_z1": "zeta-3", "ten_z2": "ZETA-4"}, renamed


def test_item_17_accept_text_csv_on_usage_answers_csv(client: Any, world: World) -> None:
    h = auth(world.a.owner_key)
    for path in ("/api/v1/usage", "/api/v1/admin/usage"):
        key = h if path == "/api/v1/usage" else auth(world.admin_key)
        r = client.get(path, headers={**key, "Accept": "text/csv"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), (path, r.text[:200])
        r = client.get(path, headers={**key, "Accept": "application/json, text/csv"})
        assert r.headers["content-type"].startswith("application/json"), path
        r = client.get(f"{path}?format=json", headers={**key, "Accept": "text/csv"})
        assert r.headers["content-type"].startswith("application/json"), path
