"""200 concurrent submissions against a real, two-process API: the grant admits exactly 50.

The trial tenant is made the way a real one is (application, approval) and its grant is set to
cover exactly 50 of the jobs. Nothing runs while they are submitted, so admission alone decides;
then a scheduler and a worker run the admitted jobs and the ledger is checked against the grant.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from scheduler import billing, emulation
from scheduler.jobspec import JobSpec
from scheduler.models import Job, JobArray, MeterEvent, Tenant
from tests.support.cloud import FAST, RunningCloud, free_port

pytestmark = pytest.mark.e2e

JOB = {"name": "sample", "workload": {"model": "mcmc", "task": "infer", "steps": 50}, "ipus": 1}
ADMITTED = 50
SUBMISSIONS = 200


def job_cost_ipu_ms(max_runtime_s: int) -> int:
    """What admission reserves for JOB: the same emulator prediction the API makes."""
    spec = JobSpec.model_validate(JOB)
    resolved = emulation.resolve(spec.workload, spec.ipus, None)
    return billing.ipu_ms(resolved.ipus, min(resolved.predicted_runtime_s, float(max_runtime_s)))


def test_concurrent_submissions_never_overspend_the_grant(
    env: Any, db: Any, seeded: Any, tmp_path: Path
) -> None:
    cloud = RunningCloud(env={**env, **FAST}, workdir=tmp_path, admin_key=seeded.admin_key, port=free_port())
    try:
        cloud.spawn("api", "--port", str(cloud.port), "--host", "127.0.0.1", "--workers", "2")
        cloud.wait_ready()
        with cloud.admin() as admin:
            receipt = httpx.post(
                f"{cloud.url}/api/v1/trials",
                json={
                    "name": "Grace",
                    "email": "grace@example.org",
                    "organisation": "Compilers Inc",
                    "category": "individual",
                    "intended_use": "Sampling posteriors with MCMC on one IPU.",
                },
            ).json()
            decision = admin.post(
                f"/api/v1/admin/trials/{receipt['id']}/approve", json={"hand_over_key": True}
            ).json()
            tenant_id, key = decision["tenant"]["id"], decision["api_key"]
            plan = admin.patch(
                "/api/v1/admin/plans/trial", json={"max_queued_jobs": 1000, "max_concurrent_jobs": 8}
            ).json()
            cost = job_cost_ipu_ms(plan["max_runtime_s"])
            grant_ms = ADMITTED * cost + cost // 2  # room for 50 and half of a 51st
            r = admin.patch(f"/api/v1/admin/tenants/{tenant_id}", json={"quota_ipu_hours": grant_ms / 3.6e6})
            assert r.status_code == 200, r.text
        with db.read() as s:
            grant_ms = s.get(Tenant, tenant_id).quota_ipu_ms
        assert ADMITTED * cost <= grant_ms < (ADMITTED + 1) * cost

        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        with httpx.Client(
            base_url=cloud.url, headers={"Authorization": f"Bearer {key}"}, limits=limits, timeout=60
        ) as c:

            def submit(i: int) -> httpx.Response:
                return c.post("/api/v1/jobs", json={**JOB, "name": f"sample-{i}"})

            with ThreadPoolExecutor(max_workers=48) as pool:
                responses = list(pool.map(submit, range(SUBMISSIONS)))
        codes = [r.status_code for r in responses]
        assert codes.count(202) == ADMITTED, {code: codes.count(code) for code in set(codes)}
        refused = [r for r in responses if r.status_code != 202]
        assert len(refused) == SUBMISSIONS - ADMITTED
        for r in refused:
            assert r.status_code == 403 and r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["type"] == "/problems/quota-exceeded", r.text
        with db.read() as s:
            t = s.get(Tenant, tenant_id)
            assert t.reserved_ipu_ms == ADMITTED * cost <= t.quota_ipu_ms
            assert s.execute(
                select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id)
            ).scalar_one() == (ADMITTED)

        # Now run them: what the ledger bills never exceeds the grant, and matches the counters.
        cloud.start_scheduler()
        cloud.start_worker(concurrency=4)
        ids = [r.json()["id"] for r in responses if r.status_code == 202]
        final = cloud.wait_jobs(key, ids, timeout=240)
        assert {j["state"] for j in final.values()} == {"succeeded"}
        with db.read() as s:
            t = s.get(Tenant, tenant_id)
            billed = s.execute(
                select(func.coalesce(func.sum(MeterEvent.ipu_ms), 0)).where(MeterEvent.tenant_id == tenant_id)
            ).scalar_one()
            assert 0 < billed == t.used_ipu_ms <= t.quota_ipu_ms
            assert t.reserved_ipu_ms == 0
    finally:
        cloud.stop_all()


def test_concurrent_retries_with_one_idempotency_key_make_one_job(
    env: Any, db: Any, seeded: Any, tmp_path: Path
) -> None:
    """A client retrying a submission on 20 connections at once: one job, twenty identical answers."""
    cloud = RunningCloud(env={**env, **FAST}, workdir=tmp_path, admin_key=seeded.admin_key, port=free_port())
    try:
        cloud.spawn("api", "--port", str(cloud.port), "--host", "127.0.0.1", "--workers", "2")
        cloud.wait_ready()
        tenant_id, key = cloud.create_tenant("retrier", quota_ipu_hours=1000)
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "nightly-build-42"}
        with (
            httpx.Client(base_url=cloud.url, headers=headers, timeout=60) as c,
            ThreadPoolExecutor(max_workers=20) as pool,
        ):
            responses = list(pool.map(lambda _: c.post("/api/v1/jobs", json=JOB), range(20)))
        assert {r.status_code for r in responses} == {202}, [
            r.text for r in responses if r.status_code != 202
        ]
        assert len({r.content for r in responses}) == 1, "every retry replays the first response"
        assert sum(r.headers.get("idempotent-replayed") == "true" for r in responses) == 19
        with db.read() as s:
            assert (
                s.execute(
                    select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id)
                ).scalar_one()
                == 1
            )
            t = s.get(Tenant, tenant_id)
            assert t.reserved_ipu_ms == s.execute(select(Job.reserved_ipu_ms)).scalar_one(), "reserved once"
    finally:
        cloud.stop_all()


def test_concurrent_retries_of_an_array_with_one_idempotency_key_make_one_array(
    env: Any, db: Any, seeded: Any, tmp_path: Path
) -> None:
    """The same for an array (migration 0016_array_idem): 20 connections to two API processes send
    one sweep with one key at once; one array is admitted and reserved once, every answer names it."""
    cloud = RunningCloud(env={**env, **FAST}, workdir=tmp_path, admin_key=seeded.admin_key, port=free_port())
    try:
        cloud.spawn("api", "--port", str(cloud.port), "--host", "127.0.0.1", "--workers", "2")
        cloud.wait_ready()
        tenant_id, key = cloud.create_tenant("sweeper", quota_ipu_hours=1000)
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": "grid-2026-12-06"}
        body = {
            **JOB,
            "sweep": {"method": "grid", "parameters": {"workload.steps": {"values": [10, 20, 30, 40]}}},
        }
        with (
            httpx.Client(base_url=cloud.url, headers=headers, timeout=60) as c,
            ThreadPoolExecutor(max_workers=20) as pool,
        ):
            responses = list(pool.map(lambda _: c.post("/api/v1/jobs", json=body), range(20)))
        assert {r.status_code for r in responses} == {202}, [
            r.text for r in responses if r.status_code != 202
        ]
        assert len({r.json()["id"] for r in responses}) == 1, "every retry names the first array"
        assert sum(r.headers.get("idempotent-replayed") == "true" for r in responses) == 19
        with db.read() as s:
            assert (
                s.execute(
                    select(func.count()).select_from(JobArray).where(JobArray.tenant_id == tenant_id)
                ).scalar_one()
                == 1
            )
            assert (
                s.execute(
                    select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id)
                ).scalar_one()
                == 4
            )
            t = s.get(Tenant, tenant_id)
            assert t.reserved_ipu_ms == s.execute(select(JobArray.reserved_at_submit_ipu_ms)).scalar_one()
    finally:
        cloud.stop_all()
