"""Changing a job its owner asked to: cancel, resume."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.db import changed
from scheduler.errors import (
    Conflict,
    LimitExceeded,
    QuotaExceeded,
)
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    AttemptState,
    Job,
    JobState,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services.batch import attempts, checkpoints
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.batch.jobs.reads import current_attempt, get_job
from scheduler.services.tenancy.scope import Scope

if TYPE_CHECKING:
    pass


def request_cancel(*, session: Session, job_id: str, scope: Scope) -> Job:
    """Cancel: a queued job ends now, and so does a placed or running one: the control plane ends its
    attempt itself (billed up to now) and the host agent driving it is told to stop over the bus
    (`stopped_agents`), or finds out at its next look."""
    get_job(session=session, job_id=job_id, scope=scope)  # 404 before any lock
    # FOR NO KEY UPDATE, as `attempts` locks jobs: a checkpoint or event row of the job, whose foreign
    # key takes a KEY SHARE lock, must not wait for it (see `_lock_jobs`).
    job = session.execute(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    ).scalar_one()
    if job.state in FINAL_JOB_STATES:
        raise Conflict(f"Job {job_id} already ended ({job.state}).", state=job.state)
    if job.cancel_requested:
        return job
    job.cancel_requested = True
    job.updated_at = utcnow()
    attempt = current_attempt(session=session, job=job)
    if attempt is not None and attempt.state in LIVE_ATTEMPT_STATES:
        reason = (
            "cancelled by user"
            if attempt.state == AttemptState.RUNNING
            else "cancelled by user before it started"
        )
        attempts.stop_running(
            session=session,
            attempt_ids=[attempt.id],
            outcome=AttemptState.CANCELLED,
            reason=reason,
            max_attempts=1,
        )
    if job.state not in FINAL_JOB_STATES:
        finalize_job(session=session, job=job, state=JobState.CANCELLED, reason="cancelled by user")
    session.flush()
    return job


def resume_job(*, session: Session, job_id: str, scope: Scope) -> Job:
    """Queue a job that its time limit stopped again, from its last checkpoint, with a new time limit.

    Only the owner's tenant sees it (another tenant's job is 404), only a job that failed by its
    time limit with a checkpoint, and only within its plan's `checkpoint_retention_s`. Its quota
    reservation is taken again for the steps it has left, by a guarded update like admission's."""
    get_job(session=session, job_id=job_id, scope=scope)  # 404 before any lock
    job = session.execute(
        select(Job)
        .where(Job.id == job_id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    ).scalar_one()
    attempt = current_attempt(session=session, job=job)
    if job.state != JobState.FAILED or attempt is None or attempt.state != AttemptState.TIMED_OUT:
        raise Conflict(
            f"Job {job_id} is {job.state}: only a job stopped by its time limit (max_runtime_s) can be "
            "resumed.",
            state=job.state,
        )
    checkpoint = checkpoints.latest_by_job(session=session, job_ids=[job.id]).get(job.id)
    if checkpoint is None:
        raise Conflict(f"Job {job_id} has no checkpoint to resume from.", state=job.state)
    tenant = session.get(Tenant, job.tenant_id)
    assert tenant is not None
    plan = session.get(Plan, tenant.plan_name)
    assert plan is not None
    until = checkpoints.resumable_until(job=job, plan=plan)
    now = utcnow()
    if until is None or now > until:
        raise Conflict(
            f"Job {job_id}'s checkpoints were kept {int(plan.checkpoint_retention_s):,} s after it stopped "
            f"(the {plan.name} plan's retention); it can no longer be resumed.",
            state=job.state,
        )
    # What is left, timed as its last attempt ran (restoring the checkpoint is not billed).
    step_s = float((attempt.timeline or {}).get("step_s", 0.0))
    left_s = max(0, checkpoint.steps - checkpoint.step) * step_s
    if left_s <= 0:
        left_s = job.predicted_runtime_s * max(0.0, 1.0 - checkpoint.step / max(1, checkpoint.steps))
    predicted = min(left_s, float(job.max_runtime_s or left_s))
    options = {
        kind: {**option, "predicted_runtime_s": predicted} for kind, option in (job.options or {}).items()
    }
    job.options = options or None
    job.predicted_runtime_s = predicted
    reserve = (
        billing.reserve_ipu_ms(options, job.prefer or "time")
        if options
        else billing.charged_ipu_ms(job.ipus, predicted, 1.0)
    )
    if tenant.status != "active":
        raise Conflict(f"Tenant {tenant.name} is {tenant.status}.", state=job.state)
    done = changed(
        session,
        update(Tenant)
        .where(
            Tenant.id == tenant.id,
            Tenant.used_ipu_ms + Tenant.reserved_ipu_ms + reserve <= Tenant.quota_ipu_ms,
        )
        # The queued-job bound stays an upper bound (scheduler/services/batch/jobs/submit.py, submit_jobs).
        .values(
            reserved_ipu_ms=Tenant.reserved_ipu_ms + reserve,
            queued_jobs_bound=Tenant.queued_jobs_bound + 1,
        )
        .execution_options(synchronize_session=False),
    )
    if done != 1:
        cost = billing.ipu_hours(reserve)
        raise QuotaExceeded(
            f"Resuming this job is predicted to cost {cost:.3f} IPU-hours, more than is left of the grant.",
            cost_ipu_hours=cost,
        )
    # Counted under the tenant's row lock the update took, as admission counts: a resume joins the
    # queue like a submission and is held to the plan's limit like one.
    queued = session.execute(
        select(func.count()).select_from(
            select(Job.id)
            .where(Job.tenant_id == tenant.id, Job.state == JobState.QUEUED)
            .limit(plan.max_queued_jobs)
            .subquery()
        )
    ).scalar_one()
    if queued >= plan.max_queued_jobs:
        raise LimitExceeded(
            f"The {plan.name} plan allows {plan.max_queued_jobs} queued jobs; wait for some to start.",
            limit="max_queued_jobs",
        )
    job.reserved_ipu_ms = reserve
    # Its time limit counts again from here: what it had run is behind it.
    job.runtime_base_s = checkpoint.run_s
    job.state = JobState.QUEUED
    job.reason = None
    job.wait = None
    job.finished_at = None
    job.updated_at = now
    add_event(
        session,
        job.id,
        "state",
        f"resumed by its owner from the checkpoint after step {checkpoint.step:,} of {checkpoint.steps:,}",
        data={"state": "queued", "resumed": True, "step": checkpoint.step},
        at=now,
    )
    session.flush()
    return job
