"""Plans (admin-editable, validated, applied to tenants) and members with roles."""

from __future__ import annotations

from typing import Any

from tests.tenancy.conftest import JOB, World, assert_problem, auth


def test_plans_are_listed_paged_and_edited(client: Any, world: World) -> None:
    admin = auth(world.admin_key)
    names = []
    cursor = None
    while True:
        page = client.get("/api/v1/admin/plans", params={"limit": 2, "cursor": cursor}, headers=admin).json()
        names += [p["name"] for p in page["items"]]
        if not (cursor := page["next_cursor"]):
            break
    assert names == ["internal", "standard", "trial", "trial-business", "trial-university"]
    trial = client.get("/api/v1/admin/plans/trial", headers=admin).json()
    assert trial["kind"] == "trial" and trial["trial_days"] == 30
    r = client.patch(
        "/api/v1/admin/plans/trial",
        json={"quota_ipu_hours": 50, "description": "Try it", "priority": None},
        headers=admin,
    )
    assert r.status_code == 200, r.text
    assert r.json()["quota_ipu_hours"] == 50 and r.json()["priority"] == trial["priority"]
    # A null leaves a field as it is: a trial keeps its length.
    r = client.patch("/api/v1/admin/plans/trial", json={"trial_days": None}, headers=admin)
    assert r.status_code == 200 and r.json()["trial_days"] == 30
    # The new grant is what the next trial tenant gets.
    created = client.post(
        "/api/v1/admin/tenants", json={"name": "newcomer", "plan": "trial"}, headers=admin
    ).json()
    assert created["quota_ipu_hours"] == 50 and created["expires_at"]
    assert_problem(client.get("/api/v1/admin/plans/gold", headers=admin), 404, "not-found")
    # A plan can opt every job of its tenants out of preemption (docs/scheduling.md).
    assert trial["never_preempt"] is False
    r = client.patch("/api/v1/admin/plans/trial", json={"never_preempt": True}, headers=admin)
    assert r.status_code == 200 and r.json()["never_preempt"] is True


BAD_PLAN_CHANGES: list[dict[str, Any]] = [
    {"quota_ipu_hours": -1},
    {"max_partition_size": 0},
    {"max_partition_size": 10**9},
    {"kind": "standard"},
    {"name": "renamed"},
    {"max_runtime_s": "soon"},
    {"description": "x" * 501},
    {"never_preempt": "yes"},
]


def test_bad_plan_changes_are_refused_and_change_nothing(client: Any, world: World, subtests: Any) -> None:
    admin = auth(world.admin_key)
    before = client.get("/api/v1/admin/plans/trial", headers=admin).json()
    for body in BAD_PLAN_CHANGES:
        with subtests.test(body=body):
            r = client.patch("/api/v1/admin/plans/trial", json=body, headers=admin)
            assert_problem(r, 422, "invalid-request")
    assert client.get("/api/v1/admin/plans/trial", headers=admin).json() == before


def test_plan_limits_apply_to_its_tenants_at_once(client: Any, world: World) -> None:
    admin = auth(world.admin_key)
    assert (
        client.post("/api/v1/jobs", json={**JOB, "ipus": 16}, headers=auth(world.a.owner_key)).status_code
        == 202
    )
    client.patch("/api/v1/admin/plans/standard", json={"max_partition_size": 8}, headers=admin)
    body = assert_problem(
        client.post("/api/v1/jobs", json={**JOB, "ipus": 16}, headers=auth(world.a.owner_key)),
        409,
        "limit-exceeded",
    )
    assert body["limit"] == "max_partition_size" and "8" in body["detail"]


def test_members_are_added_changed_and_removed(client: Any, world: World) -> None:
    admin = auth(world.admin_key)
    base = f"/api/v1/admin/tenants/{world.a.id}/members"
    r = client.post(base, json={"email": "Kim@Example.org", "name": "Kim", "role": "owner"}, headers=admin)
    assert r.status_code == 201 and r.json()["email"] == "kim@example.org"
    kim = r.json()["id"]
    assert_problem(client.post(base, json={"email": "kim@example.org", "name": "Kim"}, headers=admin), 409)
    assert_problem(
        client.post(base, json={"email": "x@example.org", "name": "X", "role": "admin"}, headers=admin), 422
    )
    listed = client.get(base, headers=admin).json()["items"]
    assert {m["role"] for m in listed} == {"owner", "member"} and len(listed) == 3
    assert_problem(client.get(f"/api/v1/admin/tenants/{world.b.id}/members/{kim}", headers=admin), 405)
    assert_problem(client.delete(f"/api/v1/admin/tenants/{world.b.id}/members/{kim}", headers=admin), 404)

    # Promoting the member makes its existing key an owner's key at once: it can now create keys.
    assert_problem(client.post("/api/v1/keys", json={"name": "k"}, headers=auth(world.a.member_key)), 403)
    r = client.patch(f"{base}/{world.a.member_id}", json={"role": "owner"}, headers=admin)
    assert r.status_code == 200 and r.json()["role"] == "owner"
    assert (
        client.post("/api/v1/keys", json={"name": "k"}, headers=auth(world.a.member_key)).status_code == 201
    )

    # Removing a member revokes its keys; the last owner can be neither removed nor demoted.
    r = client.delete(f"{base}/{world.a.member_id}", headers=admin)
    assert r.status_code == 200 and r.json()["revoked_keys"] == 2
    assert_problem(client.get("/api/v1/jobs", headers=auth(world.a.member_key)), 401)
    client.delete(f"{base}/{kim}", headers=admin)
    owners = [m for m in client.get(base, headers=admin).json()["items"] if m["role"] == "owner"]
    assert len(owners) == 1
    assert_problem(client.delete(f"{base}/{owners[0]['id']}", headers=admin), 409, "conflict")
    assert_problem(client.patch(f"{base}/{owners[0]['id']}", json={"role": "member"}, headers=admin), 409)
    assert client.get("/api/v1/jobs", headers=auth(world.a.owner_key)).status_code == 200


def test_tenants_are_created_paged_and_changed(client: Any, world: World) -> None:
    admin = auth(world.admin_key)
    assert_problem(client.post("/api/v1/admin/tenants", json={"name": "alpha"}, headers=admin), 409)
    assert_problem(
        client.post("/api/v1/admin/tenants", json={"name": "x", "plan": "gold"}, headers=admin), 422
    )
    assert_problem(
        client.post(
            "/api/v1/admin/tenants", json={"name": "x", "expires_at": "2030-01-01T00:00:00"}, headers=admin
        ),
        422,
    )
    page = client.get("/api/v1/admin/tenants?limit=1", headers=admin).json()
    rest = client.get(f"/api/v1/admin/tenants?cursor={page['next_cursor']}", headers=admin).json()
    assert {t["id"] for t in page["items"] + rest["items"]} == {world.a.id, world.b.id}
    r = client.patch(
        f"/api/v1/admin/tenants/{world.a.id}",
        json={"status": "suspended", "plan": None, "expires_at": "2031-01-01T00:00:00+02:00"},
        headers=admin,
    )
    assert r.status_code == 200 and r.json()["plan"] == "standard"
    assert r.json()["expires_at"].startswith("2030-12-31T22:00:00")
    # A suspended tenant's keys do nothing at all, reading included, until it is active again.
    for method, path in (("POST", "/api/v1/jobs"), ("GET", "/api/v1/usage"), ("POST", "/api/v1/keys")):
        body = {"json": JOB if path.endswith("jobs") else {"name": "k"}} if method == "POST" else {}
        r = client.request(method, path, headers=auth(world.a.owner_key), **body)
        assert_problem(r, 403, "tenant-inactive")
    client.patch(f"/api/v1/admin/tenants/{world.a.id}", json={"status": "active"}, headers=admin)
    assert client.get("/api/v1/usage", headers=auth(world.a.owner_key)).status_code == 200
    assert_problem(
        client.patch(f"/api/v1/admin/tenants/{world.a.id}", json={"plan": "gold"}, headers=admin), 422
    )


def test_a_job_opts_out_of_preemption_at_no_extra_charge(client: Any, world: World) -> None:
    owner = auth(world.a.owner_key)
    plain = client.post("/api/v1/jobs", json={**JOB, "name": "plain"}, headers=owner).json()
    r = client.post("/api/v1/jobs", json={**JOB, "name": "kept", "never_preempt": True}, headers=owner)
    assert r.status_code == 202, r.text
    kept = r.json()
    assert kept["never_preempt"] is True and plain["never_preempt"] is False
    assert kept["machine_options"] == plain["machine_options"], "the same rates: never charged more"
    assert client.get(f"/api/v1/jobs/{kept['id']}", headers=owner).json()["never_preempt"] is True
    both = {**JOB, "never_preempt": True, "preemptible": True}
    assert_problem(client.post("/api/v1/jobs", json=both, headers=owner), 422, "invalid-request")
