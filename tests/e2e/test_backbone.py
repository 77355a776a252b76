"""One job from HTTP to a metered finish, on real processes: API, scheduler, Celery worker, Redis.

The tests share one cloud (`shared_cloud`): each works as tenants of its own and counts
only their rows."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.models import Attempt, IpuAssignment, Job, MeterEvent, Partition
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e

JOB = {"name": "r50", "workload": {"model": "resnet50", "batch_size": 64, "steps": 20}, "ipus": 4}


def assert_problem(r: Any, status: int) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert (
        body["status"] == status
        and body["title"]
        and body["detail"]
        and body["type"].startswith("/problems/")
    )


class TestOneCloud:
    """The module's tests, on one running cloud (`shared_cloud`)."""

    def test_twenty_jobs_from_two_tenants_all_succeed_and_meter_once(
        self, shared_cloud: RunningCloud
    ) -> None:
        cloud, db = shared_cloud, shared_cloud.database
        tenants = [cloud.create_tenant(f"tenant-{i}") for i in range(2)]
        ours = [tid for tid, _ in tenants]
        submitted: dict[str, list[str]] = {}
        for _tid, key in tenants:
            with cloud.http(key) as c:
                for i in range(10):
                    size = [1, 2, 4, 8, 16][i % 5]
                    r = c.post("/api/v1/jobs", json={**JOB, "name": f"job-{i}", "ipus": size})
                    assert r.status_code == 202, r.text
                    assert r.json()["state"] == "queued"
                    submitted.setdefault(key, []).append(r.json()["id"])
        for key, ids in submitted.items():
            final = cloud.wait_jobs(key, ids, timeout=180)
            assert {j["state"] for j in final.values()} == {"succeeded"}, final
            for job in final.values():
                states = [h["state"] for h in job["history"] if h["state"]]
                assert states[0] == "queued" and "running" in states and states[-1] == "succeeded"
                assert job["partition"] and job["used_ipu_hours"] > 0
        with db.read() as s:
            held = select(Partition.pk).where(Partition.tenant_id.in_(ours))
            assert (
                s.execute(
                    select(func.count())
                    .select_from(IpuAssignment)
                    .where(IpuAssignment.partition_pk.in_(held))
                ).scalar_one()
                == 0
            )
            assert (
                s.execute(
                    select(func.count())
                    .select_from(Partition)
                    .where(Partition.tenant_id.in_(ours), Partition.released_at.is_(None))
                ).scalar_one()
                == 0
            )
            attempts = s.execute(select(Attempt.id).where(Attempt.tenant_id.in_(ours))).scalars().all()
            settles = (
                s.execute(
                    select(MeterEvent.attempt_id).where(
                        MeterEvent.kind == "settle", MeterEvent.tenant_id.in_(ours)
                    )
                )
                .scalars()
                .all()
            )
            assert sorted(settles) == sorted(attempts), "exactly one settled meter record per attempt"
            assert (
                s.execute(select(func.count()).select_from(Job).where(Job.tenant_id.in_(ours))).scalar_one()
                == 20
            )
        for _tid, key in tenants:
            with cloud.http(key) as c:
                usage = c.get("/api/v1/usage").json()
                assert usage["used_ipu_hours"] > 0
                assert usage["remaining_ipu_hours"] == pytest.approx(
                    usage["quota_ipu_hours"] - usage["used_ipu_hours"], abs=1e-5
                )

    def test_bad_requests_get_problems_and_change_nothing(self, shared_cloud: RunningCloud) -> None:
        cloud = shared_cloud
        with shared_cloud.database.read() as s:
            jobs_before = s.execute(select(func.count()).select_from(Job)).scalar_one()
        _, key = cloud.create_tenant("careful")
        with cloud.http(key) as c:
            assert_problem(c.post("/api/v1/jobs", json={**JOB, "workload": {"model": "gpt-17"}}), 422)
            assert_problem(c.post("/api/v1/jobs", json={**JOB, "ipus": 3}), 422)
            assert_problem(c.post("/api/v1/jobs", json={**JOB, "ipus": 4096}), 422)
            assert_problem(
                c.post(
                    "/api/v1/jobs", content=b'{"name": "x", ', headers={"content-type": "application/json"}
                ),
                400,
            )
            assert_problem(
                c.post("/api/v1/jobs", content=b"[1,2]", headers={"content-type": "application/json"}), 422
            )
        with cloud.http() as anon:
            assert_problem(anon.post("/api/v1/jobs", json=JOB), 401)
        with cloud.http("ipuc_" + "A" * 61) as wrong:
            assert_problem(wrong.post("/api/v1/jobs", json=JOB), 401)
        with cloud.http(key[:-1] + ("B" if key[-1] != "B" else "C")) as typo:
            assert_problem(typo.get("/api/v1/jobs"), 401)
        with cloud.http(key) as c:
            assert_problem(c.get("/api/v1/admin/tenants"), 403)
            assert_problem(c.get("/api/v1/jobs/job_doesnotexist"), 404)
        with shared_cloud.database.read() as s:
            assert s.execute(select(func.count()).select_from(Job)).scalar_one() == jobs_before

    def test_the_job_list_shows_partition_and_progress(self, shared_cloud: RunningCloud) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("lister")
        with cloud.http(key) as c:
            job_id = c.post("/api/v1/jobs", json=JOB).json()["id"]
            cloud.wait_jobs(key, [job_id])
            listed = c.get("/api/v1/jobs").json()["items"]
        assert [j["id"] for j in listed] == [job_id]
        assert listed[0]["partition"] and listed[0]["progress"]["phase"] == "done"
