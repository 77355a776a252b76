"""`POST /jobs/{id}/resume` joins the queue as a submission does: held to the plan's queued-job limit,
and a refusal changes nothing (scheduler/services/batch/jobs/changes.py, resume_job)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from scheduler.jobspec import JobSpec
from scheduler.models import Job, JobState, Plan, Tenant
from scheduler.services.batch import jobs
from scheduler.services.tenancy import keys
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.faults.harness import make_tenant
from tests.support import agentkit

JOB = {"name": "r50", "workload": {"model": "resnet50", "batch_size": 64, "steps": 20}, "ipus": 4}


def submit(db: Any, tenant: str) -> str:
    with db.write() as s:
        return jobs.submit_job(session=s, tenant_id=tenant, spec=JobSpec.model_validate(JOB)).job.id


def stopped_by_its_time_limit(db: Any, tenant: str) -> str:
    job_id = submit(db, tenant)
    agentkit.stop_at_time_limit(db, job_id)
    return job_id


def test_a_resume_is_held_to_the_queued_job_limit_and_a_refusal_changes_nothing(
    db: Any, seeded: Any, client: Any
) -> None:
    tenant = make_tenant(db, "resumer", plan="trial")
    with db.write() as s:
        s.execute(update(Plan).where(Plan.name == "trial").values(max_queued_jobs=2))
    stopped = stopped_by_its_time_limit(db, tenant)
    queued = [submit(db, tenant) for _ in range(2)]  # the plan's limit
    with db.read() as s:
        before = s.get(Tenant, tenant)
        reserved, bound = before.reserved_ipu_ms, before.queued_jobs_bound
    with db.write() as s:
        _, key = keys.create_key(session=s, secret=get_settings().secret(), tenant_id=tenant, name="k")
    headers = {"Authorization": f"Bearer {key}"}

    r = client.post(f"/api/v1/jobs/{stopped}/resume", headers=headers)
    assert r.status_code == 409, r.text
    assert "2 queued jobs" in r.json()["detail"] and r.json().get("limit") == "max_queued_jobs"
    with db.read() as s:
        assert s.get(Job, stopped).state == JobState.FAILED
        after = s.get(Tenant, tenant)
        assert (after.reserved_ipu_ms, after.queued_jobs_bound) == (reserved, bound)

    # One of the queue leaves it (cancelled): the resume now fits, and the bound counts it.
    with db.write() as s:
        jobs.request_cancel(session=s, job_id=queued[0], scope=OneTenant(tenant))
    r = client.post(f"/api/v1/jobs/{stopped}/resume", headers=headers)
    assert r.status_code == 202, r.text
    with db.read() as s:
        assert s.get(Job, stopped).state == JobState.QUEUED
        assert s.get(Tenant, tenant).queued_jobs_bound >= 2
