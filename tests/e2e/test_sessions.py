"""Sessions on real processes (API, scheduler, a Celery host agent, Redis): a held partition that
runs its owner's jobs at once, billed per held IPU-second, culled when idle or at its maximum."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from scheduler.models import Attempt, IpuSession, Job, MeterEvent, Partition, Tenant
from tests.support import services
from tests.support.cloud import RunningCloud, start_shared

pytestmark = pytest.mark.e2e

# 100 cluster seconds per wall second: a 200 s idle timeout is two seconds of the test, long enough
# for the scheduler (a pass every 0.2 s) to see the warning window of 100 s before it.
SCALE = 100.0
WARNING_S = 100
JOB = {"name": "r50", "workload": {"model": "resnet50", "batch_size": 64, "steps": 20}, "ipus": 4}


SLOW = {"IPUCLOUD_TIME_SCALE": str(SCALE), "IPUCLOUD_SESSION_WARNING_S": str(WARNING_S)}


@pytest.fixture
def slow_cloud(env: dict[str, str], db: object, tmp_path: Path) -> Iterator[RunningCloud]:
    """A cloud of the test's own: for the tests that fill the fleet or fail a machine."""
    seeded = services.seed(db, pods=2)
    with RunningCloud.start(env, tmp_path, admin_key=seeded.admin_key, extra_env=SLOW) as running:
        yield running


@pytest.fixture(scope="class")
def shared_slow_cloud(
    database_url: str, redis_url: str, secret_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningCloud]:
    """`slow_cloud`, started once for TestOneCloud's tests (docs/architecture.md, "Tests"): each holds
    sessions of a tenant of its own and asserts only on them, their jobs and their tenant."""
    with start_shared(database_url, redis_url, secret_key, tmp_path_factory, extra_env=SLOW) as running:
        yield running


def wait_session(c: httpx.Client, sid: str, states: tuple[str, ...], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = c.get(f"/api/v1/sessions/{sid}")
        assert r.status_code == 200, r.text
        body = r.json()
        if body["state"] in states:
            return body
        time.sleep(0.1)
    raise AssertionError(f"session {sid} is {body.get('state')}, not {states}: {body}")


def wait_job(c: httpx.Client, jid: str, states: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = c.get(f"/api/v1/jobs/{jid}").json()
        if body["state"] in states:
            return body
        time.sleep(0.05)
    raise AssertionError(f"job {jid} is {body.get('state')}, not {states}")


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return dict(r.json())


def test_session_jobs_never_queue_behind_other_tenants(slow_cloud: RunningCloud, db: Any) -> None:
    _, key = slow_cloud.create_tenant("in-session")
    _, crowd_key = slow_cloud.create_tenant("crowd")
    with slow_cloud.http(key) as c:
        sid = c.post("/api/v1/sessions", json={"ipus": 4, "machine": "m2000"}).json()["id"]
        wait_session(c, sid, ("active",))
    long_job = {**JOB, "workload": {"model": "resnet50", "batch_size": 64, "steps": 1_000_000}, "ipus": 16}
    with slow_cloud.http(crowd_key) as o:
        crowd = []
        for n in range(12):  # 124 IPUs free: seven run, the rest queue
            r = o.post("/api/v1/jobs", json={**long_job, "name": f"crowd-{n}"})
            assert r.status_code == 202, r.text
            crowd.append(r.json()["id"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [o.get(f"/api/v1/jobs/{j}").json()["state"] for j in crowd]
            if states.count("running") >= 7:
                break
            time.sleep(0.2)
        assert states.count("queued") >= 5, states
    with slow_cloud.http(key) as c:
        r = c.post("/api/v1/jobs", json={**JOB, "name": "jumps-nothing", "session": sid})
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"], ("running", "succeeded"), timeout=10)
        assert job["wait"] is None
    with slow_cloud.http(crowd_key) as o:
        assert [o.get(f"/api/v1/jobs/{j}").json()["state"] for j in crowd].count("queued") >= 5
    with db.read() as s:
        queued = s.execute(select(func.count()).select_from(Job).where(Job.state == "queued")).scalar_one()
        assert queued >= 5


def test_a_session_whose_machine_fails_ends_as_a_fault(slow_cloud: RunningCloud, db: Any) -> None:
    _, key = slow_cloud.create_tenant("unlucky")
    with slow_cloud.http(key) as c:
        sid = c.post(
            "/api/v1/sessions", json={"ipus": 4, "machine": "m2000", "idle_timeout_s": 100_000}
        ).json()["id"]
        active = wait_session(c, sid, ("active",))
        machine = active["partition"]["ipus"][0].rsplit("-", 1)[0]
        with slow_cloud.admin() as a:
            r = a.post(f"/api/v1/admin/machines/{machine}/fail", json={"reason": "fan"})
            assert r.status_code == 200, r.text
        ended = wait_session(c, sid, ("ended",))
        assert ended["ended_reason"] == "fault", ended
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert s.get(Partition, row.partition_pk).released_at is not None
        # Its holder job does not queue again for another partition.
        assert s.get(Job, row.job_id).state in ("cancelled", "succeeded", "failed")


class TestOneCloud:
    """Sessions of tenants of their own on one running cloud (`shared_slow_cloud`)."""

    def test_session_lifecycle_jobs_billing_and_isolation(self, shared_slow_cloud: RunningCloud) -> None:
        slow_cloud = shared_slow_cloud
        db = slow_cloud.database
        _, key = slow_cloud.create_tenant("holder")
        _, other_key = slow_cloud.create_tenant("neighbour")
        with slow_cloud.http(key) as c:
            r = c.post(
                "/api/v1/sessions",
                json={"ipus": 4, "machine": "m2000", "max_duration_s": 20_000, "idle_timeout_s": 5_000},
            )
            assert r.status_code == 202, r.text
            sid = r.json()["id"]
            assert r.json()["state"] in ("starting", "active")
            active = wait_session(c, sid, ("active",))
            assert active["partition"]["size"] == 4 and len(active["partition"]["ipus"]) == 4
            assert active["idle_left_s"] is not None and active["time_left_s"] <= 20_000

            # Two jobs back to back: each starts at once; the second finds its executable compiled.
            ran = []
            for n in range(2):
                r = c.post("/api/v1/jobs", json={**JOB, "name": f"in-session-{n}", "session": sid})
                assert r.status_code == 202, r.text
                job = r.json()
                assert job["session"] == sid
                done = wait_job(c, job["id"], ("succeeded", "failed", "cancelled"))
                assert done["state"] == "succeeded", done
                assert done["partition"] == active["partition"]["id"]
                ran.append(job["id"])
            busy = c.get(f"/api/v1/sessions/{sid}").json()
            assert {j["id"] for j in busy["jobs"]} == set(ran)
            # The session is not one of the tenant's jobs.
            assert {j["id"] for j in c.get("/api/v1/jobs").json()["items"]} == set(ran)

            # Another tenant sees nothing of it and cannot run in it.
            with slow_cloud.http(other_key) as o:
                assert_problem(o.get(f"/api/v1/sessions/{sid}"), 404)
                assert_problem(o.delete(f"/api/v1/sessions/{sid}"), 404)
                assert_problem(o.post("/api/v1/jobs", json={**JOB, "session": sid}), 404)
                assert o.get("/api/v1/sessions").json()["items"] == []

            # The dashboard: the session in the tenant's list (linked from its nav) and its page with its
            # jobs, time left and idle countdown.
            with httpx.Client(base_url=slow_cloud.url, timeout=30) as browser:
                page = browser.get("/login")
                token = re.search(r'name="form_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
                signed = browser.post("/login", data={"api_key": key, "form_token": token})
                assert signed.status_code in (200, 303), signed.text
                listing = browser.get("/sessions")
                assert listing.status_code == 200 and f'href="/sessions/{sid}"' in listing.text
                assert 'href="/sessions"' in listing.text
                shown = browser.get(f"/sessions/{sid}")
                assert shown.status_code == 200
                assert all(j in shown.text for j in ran) and "Idle countdown" in shown.text
                assert "Time left" in shown.text and active["partition"]["id"] in shown.text
                # The submit form offers the session (preselected from its page's link) and runs a job in it.
                assert f'href="/jobs/new?session={sid}"' in shown.text
                form = browser.get(f"/jobs/new?session={sid}")
                assert f'<option value="{sid}" selected>' in form.text, form.text
                csrf = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
                sent = browser.post(
                    "/jobs/new",
                    data={
                        "csrf": csrf,
                        "action": "submit",
                        "model": "resnet50",
                        "task": "train",
                        "batch_size": "64",
                        "steps": "20",
                        "ipus": "4",
                        "precision": "fp16",
                        "prefer": "time",
                        "session": sid,
                    },
                    follow_redirects=False,
                )
                assert sent.status_code == 303, sent.text
                from_form = sent.headers["location"].rsplit("/", 1)[1]
                done = wait_job(c, from_form, ("succeeded", "failed", "cancelled"))
                assert done["state"] == "succeeded" and done["session"] == sid, done
                assert done["partition"] == active["partition"]["id"]
                ran.append(from_form)

            # A job larger than the session is refused, and so is a job in a session that is not active.
            assert_problem(c.post("/api/v1/jobs", json={**JOB, "ipus": 8, "session": sid}), 409)

            r = c.delete(f"/api/v1/sessions/{sid}")
            assert r.status_code == 200, r.text
            ended = r.json()
            assert ended["state"] == "ended" and ended["ended_reason"] == "owner"
            assert_problem(c.post("/api/v1/jobs", json={**JOB, "session": sid}), 409)
            assert_problem(c.delete(f"/api/v1/sessions/{sid}"), 409)

        with db.read() as s:
            row = s.get(IpuSession, sid)
            hold = s.get(Attempt, row.attempt_id)
            assert hold.state == "succeeded" and hold.gcd == -1
            held_wall = (row.ended_at - row.started_at).total_seconds()
            assert hold.cluster_s == pytest.approx(held_wall * SCALE, rel=0.05, abs=2 * SCALE * 0.3)
            # Billed per held IPU-second at the plan's rate, exactly, and the jobs inside not again.
            billed = s.execute(
                select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.attempt_id == hold.id)
            ).scalar_one()
            assert billed == round(hold.size * hold.cluster_s * 1000 * hold.rate)
            inside = s.execute(
                select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.job_id.in_(ran))
            ).scalar_one()
            assert not inside
            tenant = s.get(Tenant, row.tenant_id)
            assert (
                tenant.used_ipu_ms
                == s.execute(
                    select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.tenant_id == row.tenant_id)
                ).scalar_one()
            )
            assert tenant.reserved_ipu_ms == 0
            # The partition is free again; the second job's executable came from the cache.
            assert s.get(Partition, row.partition_pk).released_at is not None
            second = s.execute(select(Attempt).where(Attempt.job_id == ran[1])).scalar_one()
            assert second.timeline and second.timeline["cached"] is True

    def test_idle_session_is_warned_then_culled_and_a_busy_one_ends_at_its_maximum(
        self, shared_slow_cloud: RunningCloud
    ) -> None:
        slow_cloud = shared_slow_cloud
        db = slow_cloud.database
        _, key = slow_cloud.create_tenant("idler")
        with slow_cloud.http(key) as c:
            idle = c.post("/api/v1/sessions", json={"ipus": 1, "idle_timeout_s": 300}).json()["id"]
            spec = {"ipus": 2, "max_duration_s": 600, "idle_timeout_s": 100_000}
            short = c.post("/api/v1/sessions", json=spec).json()["id"]
            culled = wait_session(c, idle, ("ended",))
            assert culled["ended_reason"] == "idle_timeout", culled
            kinds = [(e["kind"], (e["data"] or {}).get("warning")) for e in culled["events"]]
            warning = kinds.index(("warning", "idle_timeout"))
            end = next(i for i, e in enumerate(culled["events"]) if (e["data"] or {}).get("state") == "ended")
            assert warning < end, culled["events"]
            maxed = wait_session(c, short, ("ended",))
            assert maxed["ended_reason"] == "max_duration", maxed
            assert any((e["data"] or {}).get("warning") == "max_duration" for e in maxed["events"])
        with db.read() as s:
            row = s.get(IpuSession, short)
            hold = s.get(Attempt, row.attempt_id)
            # Held, and billed, for exactly its maximum duration, not a tick longer.
            assert hold.cluster_s == 600
            billed = s.execute(
                select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.attempt_id == hold.id)
            ).scalar_one()
            assert billed == round(2 * 600 * 1000 * hold.rate)

    def test_an_extended_session_holds_and_bills_to_its_new_maximum(
        self, shared_slow_cloud: RunningCloud
    ) -> None:
        slow_cloud = shared_slow_cloud
        db = slow_cloud.database
        tid, key = slow_cloud.create_tenant("extender")
        with slow_cloud.http(key) as c:
            spec = {"ipus": 2, "max_duration_s": 400, "idle_timeout_s": 100_000}
            sid = c.post("/api/v1/sessions", json=spec).json()["id"]
            wait_session(c, sid, ("active",))
            r = c.patch(f"/api/v1/sessions/{sid}", json={"max_duration_s": 900})
            assert r.status_code == 200, r.text
            assert r.json()["time_left_s"] > 400
            ended = wait_session(c, sid, ("ended",))
            assert ended["ended_reason"] == "max_duration", ended
            warnings = [e for e in ended["events"] if (e["data"] or {}).get("warning") == "max_duration"]
            assert warnings, ended["events"]
        with db.read() as s:
            row = s.get(IpuSession, sid)
            hold = s.get(Attempt, row.attempt_id)
            # Held, and billed, for exactly its new maximum; the whole reservation given back at its end.
            assert hold.cluster_s == 900
            billed = s.execute(
                select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.attempt_id == hold.id)
            ).scalar_one()
            assert billed == round(2 * 900 * 1000 * hold.rate)
            tenant = s.get(Tenant, tid)
            assert tenant.reserved_ipu_ms == 0 and tenant.used_ipu_ms == billed
            # The last warning was about the new deadline, not the one the change replaced.
            assert row.started_at is not None
            deadline = row.started_at + timedelta(seconds=900 / SCALE)
            assert datetime.fromisoformat(warnings[-1]["data"]["ends_at"]) == deadline

    def test_a_session_ends_when_the_grant_runs_out_billing_no_more_than_the_grant(
        self, shared_slow_cloud: RunningCloud
    ) -> None:
        slow_cloud = shared_slow_cloud
        db = slow_cloud.database
        tid, key = slow_cloud.create_tenant("spender", quota_ipu_hours=10)
        with slow_cloud.http(key) as c:
            sid = c.post(
                "/api/v1/sessions", json={"ipus": 1, "max_duration_s": 3600, "idle_timeout_s": 100_000}
            ).json()["id"]
            wait_session(c, sid, ("active",))
            # An admin cuts the grant below what the session holds: 0.01 IPU-hours is 36 IPU-seconds,
            # less than one meter tick of this cloud (0.5 wall s x 100 = 50 cluster s). The session
            # may have been billed more than that before the cut lands (a busy machine answers the
            # admin late): what the cut promises is that nothing more is billed past the grant.
            with slow_cloud.admin() as a:
                r = a.patch(f"/api/v1/admin/tenants/{tid}", json={"quota_ipu_hours": 0.01})
                assert r.status_code == 200, r.text
            with db.read() as s:
                at_cut = s.get(Tenant, tid).used_ipu_ms
            ended = wait_session(c, sid, ("ended",))
            assert ended["ended_reason"] == "quota", ended
            with db.read() as s:
                at_end = s.get(Tenant, tid).used_ipu_ms
            # Two meter ticks on, an ended session has been billed nothing more.
            time.sleep(1.0)
            r = c.get("/api/v1/usage")
            assert r.status_code == 200, r.text
            usage = r.json()
        with db.read() as s:
            tenant = s.get(Tenant, tid)
            assert tenant.quota_ipu_ms == 36_000
            # Billing stops exactly at the grant, or where it stood at the cut if that was already
            # past it: a tick cut to what was left, or none at all.
            assert tenant.used_ipu_ms == at_end == max(tenant.quota_ipu_ms, at_cut), (
                tenant.used_ipu_ms,
                at_end,
                at_cut,
            )
            assert (
                tenant.used_ipu_ms
                == s.execute(
                    select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.tenant_id == tid)
                ).scalar_one()
            )
            assert tenant.reserved_ipu_ms == 0
            assert s.get(Partition, s.get(IpuSession, sid).partition_pk).released_at is not None
            assert usage["used_ipu_hours"] == round(tenant.used_ipu_ms / 3_600_000, 6)
            assert usage["remaining_ipu_hours"] == 0

    def test_a_job_finding_the_session_busy_runs_after_the_one_before_it(
        self, shared_slow_cloud: RunningCloud
    ) -> None:
        slow_cloud = shared_slow_cloud
        db = slow_cloud.database
        _, key = slow_cloud.create_tenant("queuer")
        with slow_cloud.http(key) as c:
            sid = c.post(
                "/api/v1/sessions", json={"ipus": 1, "machine": "m2000", "idle_timeout_s": 100_000}
            ).json()["id"]
            wait_session(c, sid, ("active",))
            spec = {**JOB, "ipus": 1, "session": sid, "workload": {**JOB["workload"], "steps": 2000}}
            first = c.post("/api/v1/jobs", json={**spec, "name": "first"}).json()["id"]
            second = c.post("/api/v1/jobs", json={**spec, "name": "second"}).json()["id"]
            done = [wait_job(c, j, ("succeeded", "failed", "cancelled"), timeout=90) for j in (first, second)]
            assert [d["state"] for d in done] == ["succeeded", "succeeded"], done
        with db.read() as s:
            a = s.execute(select(Attempt).where(Attempt.job_id == first)).scalar_one()
            b = s.execute(select(Attempt).where(Attempt.job_id == second)).scalar_one()
            assert a.partition_pk == b.partition_pk and a.gcd == b.gcd == 0
            assert b.started_at >= a.ended_at  # one job at a time on a session of one GCD
