"""API keys: format, storage, scopes and roles, expiry, revocation, the cache, and never a log line."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from scheduler.errors import Unauthorized
from scheduler.models import ApiKey, utcnow
from scheduler.services.tenancy import keys
from scheduler.settings import get_settings
from tests.tenancy.conftest import JOB, World, assert_problem, auth


def test_key_format_checksum_and_storage(db: Any, world: World) -> None:
    key = world.a.owner_key
    assert key.startswith("ipuc_") and len(key) == keys.KEY_LEN
    secret_part = key[len("ipuc_") + keys.LOOKUP_LEN : -keys.CHECK_LEN]
    assert 62 ** len(secret_part) >= 2**256, "at least 32 random bytes"
    # Every single-character typo is caught by the checksum, before the database is asked.
    for i in range(len("ipuc_"), len(key)):
        typo = key[:i] + ("x" if key[i] != "x" else "y") + key[i + 1 :]
        with pytest.raises(Unauthorized, match=r"checksum|characters"):
            keys.parse_key(typo)
    with db.read() as s:
        rows = s.execute(select(ApiKey)).scalars().all()
        stored = " ".join(f"{r.lookup} {r.key_hash} {r.name}" for r in rows)
        assert key not in stored and secret_part not in stored, "only a keyed hash is stored"
        row = s.execute(select(ApiKey).where(ApiKey.id == world.a.owner_key_id)).scalar_one()
        assert row.key_hash == keys.hash_key(key, get_settings().secret()) != keys.hash_key(key, b"other")


def test_keys_are_shown_once_and_listed_by_role(client: Any, world: World) -> None:
    owner = client.get("/api/v1/keys", headers=auth(world.a.owner_key))
    assert owner.status_code == 200
    listed = owner.json()["items"]
    assert {k["id"] for k in listed} >= {world.a.owner_key_id, world.a.member_key_id}
    assert all("api_key" not in k and k["prefix"].startswith("ipuc_") for k in listed)
    assert world.a.owner_key not in owner.text
    # A member sees its own keys only; nobody sees another tenant's.
    member = client.get("/api/v1/keys", headers=auth(world.a.member_key)).json()["items"]
    assert [k["id"] for k in member] == [world.a.member_key_id]
    other = client.get("/api/v1/keys", headers=auth(world.b.owner_key)).json()["items"]
    assert not {k["id"] for k in other} & {k["id"] for k in listed}


def test_owner_creates_keys_members_cannot_and_no_key_outgrows_its_creator(client: Any, world: World) -> None:
    assert_problem(
        client.post("/api/v1/keys", json={"name": "mine"}, headers=auth(world.a.member_key)), 403, "forbidden"
    )
    r = client.post("/api/v1/keys", json={"name": "ci", "scopes": ["read"]}, headers=auth(world.a.owner_key))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["scopes"] == ["read"] and body["state"] == "active" and body["tenant_id"] == world.a.id
    ci_key = body["api_key"]
    assert client.get("/api/v1/jobs", headers=auth(ci_key)).status_code == 200
    assert_problem(client.post("/api/v1/jobs", json=JOB, headers=auth(ci_key)), 403, "forbidden")
    # Tenant keys never carry `admin`; a read-only key cannot mint a stronger one (nor manage keys).
    assert_problem(
        client.post("/api/v1/keys", json={"name": "x", "scopes": ["admin"]}, headers=auth(world.a.owner_key)),
        403,
    )
    assert_problem(client.post("/api/v1/keys", json={"name": "x"}, headers=auth(world.a.read_key)), 403)
    # A key that expires bounds the expiry of the keys it creates.
    soon = (utcnow() + timedelta(days=1)).isoformat()
    later = (utcnow() + timedelta(days=2)).isoformat()
    r = client.post(
        "/api/v1/keys", json={"name": "short", "expires_at": soon}, headers=auth(world.a.owner_key)
    )
    short = r.json()["api_key"]
    assert_problem(
        client.post("/api/v1/keys", json={"name": "long", "expires_at": later}, headers=auth(short)), 403
    )
    inherited = client.post("/api/v1/keys", json={"name": "same"}, headers=auth(short)).json()
    assert inherited["expires_at"] == r.json()["expires_at"]
    # An owner may give a member a key; a member id of another tenant is refused.
    r = client.post(
        "/api/v1/keys",
        json={"name": "for-mia", "member_id": world.a.member_id},
        headers=auth(world.a.owner_key),
    )
    assert r.status_code == 201 and r.json()["member_id"] == world.a.member_id
    assert_problem(
        client.post(
            "/api/v1/keys",
            json={"name": "x", "member_id": world.b.member_id},
            headers=auth(world.a.owner_key),
        ),
        422,
    )


BAD_KEY_BODIES: list[dict[str, Any]] = [
    {},
    {"name": ""},
    {"name": "x" * 101},
    {"name": "tab\there"},
    {"name": "x", "scopes": []},
    {"name": "x", "scopes": ["read", "read", "read", "read", "read"]},
    {"name": "x", "scopes": ["root"]},
    {"name": "x", "expires_at": "2030-01-01T00:00:00"},
    {"name": "x", "expires_at": "2001-01-01T00:00:00Z"},
    {"name": "x", "expires_at": "9999-12-31T23:59:59-14:00"},
    {"name": "x", "surprise": 1},
]


def test_bad_key_requests_are_refused(client: Any, world: World, subtests: Any) -> None:
    for body in BAD_KEY_BODIES:
        with subtests.test(body=body):
            assert_problem(client.post("/api/v1/keys", json=body, headers=auth(world.a.owner_key)), 422)


def test_revoked_key_is_refused_at_once_and_members_revoke_only_their_own(client: Any, world: World) -> None:
    assert client.get("/api/v1/jobs", headers=auth(world.a.member_key)).status_code == 200  # now cached
    assert_problem(
        client.delete(f"/api/v1/keys/{world.a.owner_key_id}", headers=auth(world.a.member_key)), 404
    )
    r = client.delete(f"/api/v1/keys/{world.a.member_key_id}", headers=auth(world.a.member_key))
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    assert_problem(client.get("/api/v1/jobs", headers=auth(world.a.member_key)), 401, "unauthorized")
    # Revoking again is harmless; the admin revokes any tenant's key.
    assert client.delete(f"/api/v1/keys/{world.a.member_key_id}", headers=auth(world.a.owner_key)).json()[
        "revoked_at"
    ]
    r = client.delete(
        f"/api/v1/admin/tenants/{world.b.id}/keys/{world.b.member_key_id}", headers=auth(world.admin_key)
    )
    assert r.status_code == 200
    assert_problem(client.get("/api/v1/usage", headers=auth(world.b.member_key)), 401)
    assert_problem(
        client.delete(
            f"/api/v1/admin/tenants/{world.a.id}/keys/{world.b.owner_key_id}", headers=auth(world.admin_key)
        ),
        404,
    )


def test_other_processes_stop_accepting_a_revoked_key_within_the_cache_ttl(db: Any, world: World) -> None:
    """Revocation written by another process (here: straight to the database) cannot clear our cache."""
    secret = get_settings().secret()
    # The cache's own clock, stepped by hand: a loaded machine cannot outlast the TTL between two calls.
    now = [1_000.0]
    keys.key_cache.clock = lambda: now[0]
    keys.key_cache.forget()
    try:
        with db.read() as s:
            keys.authenticate(session=s, secret=secret, key=world.a.member_key)
        with db.write() as s:
            s.execute(update(ApiKey).where(ApiKey.id == world.a.member_key_id).values(revoked_at=utcnow()))
        now[0] += keys.key_cache.ttl * 0.9
        with db.read() as s:
            keys.authenticate(session=s, secret=secret, key=world.a.member_key)  # still cached
        now[0] += keys.key_cache.ttl * 0.2
        with db.read() as s, pytest.raises(Unauthorized, match="revoked"):
            keys.authenticate(session=s, secret=secret, key=world.a.member_key)
    finally:
        keys.key_cache.clock = time.monotonic
        keys.key_cache.forget()


def test_a_key_expiring_while_cached_is_refused(db: Any, world: World) -> None:
    secret = get_settings().secret()
    with db.write() as s:
        _, key = keys.create_key(
            session=s,
            secret=secret,
            tenant_id=world.a.id,
            name="brief",
            expires_at=utcnow() + timedelta(seconds=1),
        )
    with db.read() as s:
        keys.authenticate(session=s, secret=secret, key=key)
    time.sleep(1.05)
    with db.read() as s, pytest.raises(Unauthorized, match="expired"):
        keys.authenticate(session=s, secret=secret, key=key)


def test_admin_manages_tenant_keys_and_global_keys(client: Any, world: World, db: Any) -> None:
    admin = auth(world.admin_key)
    r = client.post(
        f"/api/v1/admin/tenants/{world.a.id}/keys", json={"name": "ops", "scopes": ["read"]}, headers=admin
    )
    assert r.status_code == 201 and r.json()["tenant_id"] == world.a.id and r.json()["created_by"]
    assert client.get("/api/v1/usage", headers=auth(r.json()["api_key"])).status_code == 200
    assert_problem(
        client.post(
            f"/api/v1/admin/tenants/{world.a.id}/keys", json={"name": "x", "scopes": ["admin"]}, headers=admin
        ),
        422,
    )
    listed = client.get(f"/api/v1/admin/tenants/{world.a.id}/keys?limit=2", headers=admin).json()
    assert len(listed["items"]) == 2 and listed["next_cursor"]
    rest = client.get(
        f"/api/v1/admin/tenants/{world.a.id}/keys?cursor={listed['next_cursor']}", headers=admin
    )
    ids = [k["id"] for k in listed["items"] + rest.json()["items"]]
    assert len(ids) == len(set(ids)) >= 5
    # Global keys: the admin creates another admin key, and the last valid one cannot be revoked.
    second = client.post("/api/v1/keys", json={"name": "admin 2"}, headers=admin).json()
    assert set(second["scopes"]) == {"read", "submit", "invoke", "admin"} and second["tenant_id"] is None
    mine = [k for k in client.get("/api/v1/keys", headers=admin).json()["items"] if k["id"] != second["id"]]
    assert client.delete(f"/api/v1/keys/{mine[0]['id']}", headers=auth(second["api_key"])).status_code == 200
    assert_problem(client.delete(f"/api/v1/keys/{second['id']}", headers=auth(second["api_key"])), 409)


def test_keys_never_reach_the_logs(client: Any, world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client.get("/api/v1/jobs", headers=auth(world.a.owner_key))
    client.get("/api/v1/jobs", headers=auth(world.revoked_key))
    client.post("/api/v1/keys", json={"name": "x"}, headers=auth(world.a.owner_key))
    client.get("/api/v1/jobs", headers=auth(world.a.owner_key[:-2]))
    text = caplog.text
    for key in (world.a.owner_key, world.revoked_key, world.a.owner_key[:-2]):
        assert key not in text and key[5:20] not in text


def test_last_used_is_recorded_at_minute_resolution(client: Any, world: World, db: Any) -> None:
    with db.read() as s:
        assert s.get(ApiKey, world.a.owner_key_id).last_used_at is None
    client.get("/api/v1/jobs", headers=auth(world.a.owner_key))
    with db.read() as s:
        first = s.get(ApiKey, world.a.owner_key_id).last_used_at
    assert first is not None
    keys.key_cache.forget()
    client.get("/api/v1/jobs", headers=auth(world.a.owner_key))
    with db.read() as s:
        assert s.get(ApiKey, world.a.owner_key_id).last_used_at == first
