"""Session admission through the API (no scheduler running): validation, plan limits, quota, and
what a job naming a session is told when it cannot run in it."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import IpuSession, Job, Tenant
from tests.support.services import Seeded

JOB = {"name": "r50", "workload": {"model": "resnet50", "batch_size": 64, "steps": 20}, "ipus": 4}


def tenant(client: Any, seeded: Seeded, name: str, plan: str = "trial", hours: float = 100) -> dict[str, str]:
    r = client.post(
        "/api/v1/admin/tenants",
        json={"name": name, "plan": plan, "quota_ipu_hours": hours},
        headers={"Authorization": f"Bearer {seeded.admin_key}"},
    )
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def problem(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return dict(r.json())


@pytest.mark.parametrize(
    "body",
    [
        {"ipus": 3},
        {"ipus": 0},
        {"ipus": 131072},
        {"ipus": "4"},
        {"ipus": 4, "gcds": 8},
        {"ipus": 4, "gcds": 3},
        {"ipus": 4, "max_duration_s": 0},
        {"ipus": 4, "max_duration_s": 10**12},
        {"ipus": 4, "idle_timeout_s": -1},
        {"ipus": 4, "machine": "gpu"},
        {"ipus": 4, "name": "x" * 101},
        {"ipus": 4, "colour": "blue"},
        {},
    ],
)
def test_bad_session_requests_are_422_and_start_nothing(
    client: Any, seeded: Seeded, db: Any, body: dict[str, Any]
) -> None:
    h = tenant(client, seeded, "validator")
    problem(client.post("/api/v1/sessions", json=body, headers=h), 422)
    with db.read() as s:
        assert s.execute(select(IpuSession)).first() is None


def test_plan_ceilings_quota_and_defaults(client: Any, seeded: Seeded, db: Any) -> None:
    h = tenant(client, seeded, "trialist", hours=1)
    # Trial plans hold a session six hours at most, and partitions of 16 IPUs.
    body = problem(
        client.post("/api/v1/sessions", json={"ipus": 1, "max_duration_s": 6 * 3600 + 1}, headers=h), 409
    )
    assert body["limit"] == "max_session_s"
    problem(client.post("/api/v1/sessions", json={"ipus": 32}, headers=h), 409)
    # Holding 4 IPUs for six hours is 24 IPU-hours: more than this grant of one.
    problem(client.post("/api/v1/sessions", json={"ipus": 4}, headers=h), 403)
    r = client.post("/api/v1/sessions", json={"ipus": 1, "max_duration_s": 1800}, headers=h)
    assert r.status_code == 202, r.text
    started = r.json()
    assert started["state"] == "starting" and started["idle_timeout_s"] == 3600  # the plan's default
    assert r.headers["location"] == f"/api/v1/sessions/{started['id']}"
    with db.read() as s:
        row = s.get(IpuSession, started["id"])
        t = s.get(Tenant, row.tenant_id)
        holder = s.get(Job, row.job_id)
        # Its whole duration is reserved, as a job's predicted cost is.
        assert (
            t.reserved_ipu_ms
            == holder.reserved_ipu_ms
            == round(1 * 1800 * 1000 * holder.options["m2000"]["rate"])
        )
    # A job cannot run in a session that has no partition yet; the holder is not one of the jobs.
    problem(client.post("/api/v1/jobs", json={**JOB, "session": started["id"]}, headers=h), 409)
    assert client.get("/api/v1/jobs", headers=h).json()["items"] == []
    listed = client.get("/api/v1/sessions", headers=h).json()["items"]
    assert [x["id"] for x in listed] == [started["id"]]
    ended = client.delete(f"/api/v1/sessions/{started['id']}", headers=h).json()
    assert ended["state"] == "ended" and ended["ended_reason"] == "owner"
    with db.read() as s:
        assert s.get(Tenant, row.tenant_id).reserved_ipu_ms == 0
        assert s.get(Tenant, row.tenant_id).used_ipu_ms == 0
    # An admin sets the plan's ceiling; it applies to the next session at once.
    admin = {"Authorization": f"Bearer {seeded.admin_key}"}
    plan = client.patch("/api/v1/admin/plans/trial", json={"max_session_s": 600}, headers=admin)
    assert plan.status_code == 200 and plan.json()["max_session_s"] == 600, plan.text
    problem(client.post("/api/v1/sessions", json={"ipus": 1, "max_duration_s": 601}, headers=h), 409)
    assert client.post("/api/v1/sessions", json={"ipus": 1}, headers=h).json()["max_duration_s"] == 600


def test_jobs_naming_sessions_badly_are_refused(client: Any, seeded: Seeded) -> None:
    h = tenant(client, seeded, "namer")
    problem(client.post("/api/v1/jobs", json={**JOB, "session": "not-a-session"}, headers=h), 422)
    problem(
        client.post("/api/v1/jobs", json={**JOB, "session": "ses_" + "0" * 26, "partition": "p"}, headers=h),
        422,
    )
    problem(client.post("/api/v1/jobs", json={**JOB, "session": "ses_" + "0" * 26}, headers=h), 404)
    problem(client.get("/api/v1/sessions/ses_" + "0" * 26, headers=h), 404)
    problem(client.get("/api/v1/sessions?limit=0", headers=h), 422)
    problem(client.get("/api/v1/sessions?state=asleep", headers=h), 422)


def test_a_session_is_given_more_time_reserved_from_the_grant(client: Any, seeded: Seeded, db: Any) -> None:
    h = tenant(client, seeded, "extender", hours=2)
    sid = client.post("/api/v1/sessions", json={"ipus": 1, "max_duration_s": 1800}, headers=h).json()["id"]

    def reserved() -> tuple[int, int, float]:
        with db.read() as s:
            row = s.get(IpuSession, sid)
            holder = s.get(Job, row.job_id)
            return (
                s.get(Tenant, row.tenant_id).reserved_ipu_ms,
                holder.reserved_ipu_ms,
                holder.predicted_runtime_s,
            )

    assert client.get(f"/api/v1/sessions/{sid}", headers=h).json()["state"] == "starting"
    before = reserved()
    r = client.patch(
        f"/api/v1/sessions/{sid}", json={"max_duration_s": 3600, "idle_timeout_s": 600}, headers=h
    )
    assert r.status_code == 200, r.text
    assert r.json()["max_duration_s"] == 3600 and r.json()["idle_timeout_s"] == 600
    after = reserved()
    # The whole new duration is reserved, on tenant and holder alike, and the scheduler plans with it.
    assert after[0] - before[0] == after[1] - before[1] == before[1] > 0
    assert after[2] == 3600
    # The same change again is no change: nothing more is reserved.
    assert (
        client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 3600}, headers=h).status_code == 200
    )
    assert reserved() == after
    # A duration never shrinks; the plan's ceiling holds (six hours on trials); the grant (2 IPU-hours,
    # one reserved) cannot pay for a second hour and a half. Each refusal changes nothing.
    assert problem(client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 60}, headers=h), 422)
    body = problem(
        client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 6 * 3600 + 1}, headers=h), 409
    )
    assert body["limit"] == "max_session_s"
    problem(client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 9000}, headers=h), 403)
    for bad in (
        {"max_duration_s": True},
        {"max_duration_s": 3600.5},
        {"max_duration_s": 0},
        {"max_duration_s": "7200"},
        {"idle_timeout_s": -1},
        {"ipus": 2},
    ):
        problem(client.patch(f"/api/v1/sessions/{sid}", json=bad, headers=h), 422)
    assert reserved() == after
    # 3600.0 is an integer to JSON Schema, and to the API.
    assert (
        client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 3600.0}, headers=h).status_code == 200
    )
    # An empty change changes nothing, as in the API's other PATCH bodies.
    same = client.patch(f"/api/v1/sessions/{sid}", json={}, headers=h)
    assert same.status_code == 200 and same.json()["max_duration_s"] == 3600, same.text
    assert reserved() == after
    events = client.get(f"/api/v1/sessions/{sid}", headers=h).json()["events"]
    assert any("session changed: maximum duration 3600 s" in e["message"] for e in events), events
    # An admin lowers the plan's ceiling below the session's: its idle timeout can still be changed.
    admin = {"Authorization": f"Bearer {seeded.admin_key}"}
    assert (
        client.patch("/api/v1/admin/plans/trial", json={"max_session_s": 600}, headers=admin).status_code
        == 200
    )
    r = client.patch(
        f"/api/v1/sessions/{sid}", json={"idle_timeout_s": 900, "max_duration_s": 3600}, headers=h
    )
    assert r.status_code == 200 and r.json()["idle_timeout_s"] == 900, r.text
    problem(client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 3601}, headers=h), 409)
    # Another tenant's session is not there for it; an ended session cannot be changed.
    other = tenant(client, seeded, "neighbour")
    problem(client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 4000}, headers=other), 404)
    client.delete(f"/api/v1/sessions/{sid}", headers=h)
    problem(client.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 4000}, headers=h), 409)
    assert reserved()[0] == 0
