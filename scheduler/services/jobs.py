"""Jobs: submit (with admission and quota reservation), read, list, cancel."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler import emulation
from scheduler.errors import (
    Conflict,
    IdempotencyConflict,
    LimitExceeded,
    NotFound,
    QuotaExceeded,
    TenantInactive,
)
from scheduler.ids import new_id
from scheduler.jobspec import JobSpec
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    Job,
    JobEvent,
    JobState,
    Partition,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services import attempts, fleet
from scheduler.services.job_state import add_event, finalize_job


class IdempotencyRace(Exception):
    """Another request with the same Idempotency-Key committed first; retry to replay it."""


@dataclass
class Submitted:
    job: Job
    replayed: bool


def request_hash(spec: JobSpec) -> str:
    return hashlib.sha256(orjson.dumps(spec.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)).hexdigest()


def cost_ipu_ms(ipus: int, seconds: float) -> int:
    return round(ipus * seconds * 1000)


def submit_job(
    *,
    session: Session,
    tenant_id: str,
    spec: JobSpec,
    idempotency_key: str | None = None,
    render: Any = None,
) -> Submitted:
    """Admit a job: validate it against the emulator and the fleet, reserve its predicted cost.

    The quota reservation is one guarded UPDATE, so concurrent submissions can never reserve more
    than the grant. It also locks the tenant's row, which makes the queued-job count below exact.
    """
    digest = request_hash(spec)
    if idempotency_key is not None:
        existing = session.execute(
            select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == idempotency_key)
        ).scalar_one_or_none()
        if existing is not None:
            if existing.request_hash != digest:
                raise IdempotencyConflict(
                    "This Idempotency-Key was used for a different request body.",
                    job_id=existing.id,
                )
            return Submitted(existing, replayed=True)

    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("No such tenant.")
    plan = session.get(Plan, tenant.plan_name)
    assert plan is not None
    now = utcnow()
    if tenant.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {tenant.status}.")
    if tenant.expires_at is not None and tenant.expires_at <= now:
        raise TenantInactive(f"The trial of {tenant.name} ended on {tenant.expires_at:%Y-%m-%d}.")

    reserved_partition = None
    if spec.partition is not None:
        reserved_partition = fleet.get_live_partition(session=session, name=spec.partition)
        if (
            reserved_partition is None
            or reserved_partition.kind != "reserved"
            or (reserved_partition.tenant_id != tenant_id)
        ):
            raise NotFound(f"No reserved partition {spec.partition!r} for this tenant.")
    machine = spec.machine or (reserved_partition.machine_type if reserved_partition else None)

    resolved = emulation.resolve(spec.workload, spec.ipus, machine)
    if reserved_partition is not None and resolved.ipus > reserved_partition.size:
        raise LimitExceeded(
            f"The job needs {resolved.ipus} IPUs but partition {reserved_partition.name} has "
            f"{reserved_partition.size}."
        )
    size = reserved_partition.size if reserved_partition is not None else resolved.ipus
    if size > plan.max_partition_size:
        raise LimitExceeded(
            f"The {plan.name} plan allows partitions of at most {plan.max_partition_size} IPUs; "
            f"this job needs {size}.",
            limit="max_partition_size",
        )
    if reserved_partition is None:
        fleet.check_fleet_can_ever_host(session=session, size=size, machine_type=machine)

    max_runtime = min(spec.max_runtime_s or plan.max_runtime_s, plan.max_runtime_s)
    predicted = min(resolved.predicted_runtime_s, float(max_runtime))
    cost = cost_ipu_ms(size, predicted)

    reserved = session.execute(
        update(Tenant)
        .where(
            Tenant.id == tenant_id,
            Tenant.used_ipu_ms + Tenant.reserved_ipu_ms + cost <= Tenant.quota_ipu_ms,
        )
        .values(reserved_ipu_ms=Tenant.reserved_ipu_ms + cost)
    ).rowcount
    if reserved != 1:
        session.refresh(tenant)
        left = max(0, tenant.quota_ipu_ms - tenant.used_ipu_ms - tenant.reserved_ipu_ms)
        raise QuotaExceeded(
            f"This job is predicted to cost {cost / 3.6e6:.3f} IPU-hours but only {left / 3.6e6:.3f} "
            "of the grant are left (after what running and queued jobs hold).",
            cost_ipu_hours=round(cost / 3.6e6, 6),
            remaining_ipu_hours=round(left / 3.6e6, 6),
        )
    queued = session.execute(
        select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id, Job.state == JobState.QUEUED)
    ).scalar_one()
    if queued >= plan.max_queued_jobs:
        raise LimitExceeded(
            f"The {plan.name} plan allows {plan.max_queued_jobs} queued jobs; wait for some to start.",
            limit="max_queued_jobs",
        )

    job = Job(
        id=new_id("job"),
        tenant_id=tenant_id,
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        model=spec.workload.model,
        task=spec.workload.task,
        ipus=size,
        ipus_requested=str(spec.ipus),
        machine_type=machine,
        partition_name=spec.partition,
        priority=spec.priority + plan.priority * 1000,
        max_runtime_s=max_runtime,
        predicted_runtime_s=predicted,
        reserved_ipu_ms=cost,
        state=JobState.QUEUED,
        idempotency_key=idempotency_key,
        request_hash=digest,
        created_at=now,
        updated_at=now,
    )
    if idempotency_key is not None:
        try:
            with session.begin_nested():
                session.add(job)
                session.flush()
        except IntegrityError:
            raise IdempotencyRace()
    else:
        session.add(job)
    add_event(
        session,
        job.id,
        "state",
        f"queued: {size} IPUs, predicted {predicted:.1f} s, {cost / 3.6e6:.4f} IPU-hours reserved",
        data={"state": "queued", "ipus": size, "predicted_runtime_s": predicted},
        at=now,
    )
    session.flush()
    if render is not None:
        job.submit_response = render(job)
    return Submitted(job, replayed=False)


def get_job(*, session: Session, job_id: str, tenant_id: str | None) -> Job:
    """A job by id; another tenant's job is indistinguishable from a missing one."""
    job = session.get(Job, job_id)
    if job is None or (tenant_id is not None and job.tenant_id != tenant_id):
        raise NotFound(f"No job {job_id}.")
    return job


def list_jobs(
    *,
    session: Session,
    tenant_id: str | None,
    after: str | None,
    limit: int,
    state: str | None = None,
) -> list[Job]:
    """Newest first; `after` is the id of the last job of the previous page."""
    stmt = select(Job).order_by(Job.id.desc()).limit(limit)
    if tenant_id is not None:
        stmt = stmt.where(Job.tenant_id == tenant_id)
    if state is not None:
        stmt = stmt.where(Job.state == state)
    if after is not None:
        stmt = stmt.where(Job.id < after)
    return list(session.execute(stmt).scalars())


def job_events(
    *, session: Session, job_id: str, after: int = 0, limit: int = 1000, kinds: tuple[str, ...] | None = None
) -> list[JobEvent]:
    stmt = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after)
    if kinds is not None:
        stmt = stmt.where(JobEvent.kind.in_(kinds))
    return list(session.execute(stmt.order_by(JobEvent.id).limit(limit)).scalars())


def wait_reason(*, session: Session, job: Job) -> dict[str, Any] | None:
    """Why a queued job is not running yet, as the scheduler last explained it."""
    if job.state != JobState.QUEUED:
        return None
    attempt = current_attempt(session=session, job=job)
    if attempt is not None and attempt.state == AttemptState.PLACED:
        return {"reason": "starting", "detail": "placed on a partition; waiting for a worker to take it"}
    return job.wait or {"reason": "pending", "detail": "waiting for the scheduler's next pass"}


def current_attempt(*, session: Session, job: Job) -> Attempt | None:
    if job.attempts == 0:
        return None
    return session.execute(
        select(Attempt).where(Attempt.job_id == job.id, Attempt.number == job.attempts)
    ).scalar_one_or_none()


def current_attempts(*, session: Session, jobs: list[Job]) -> dict[str, tuple[Attempt, Partition]]:
    """Each listed job's latest attempt and its partition, in one query for the whole page."""
    wanted = [(j.id, j.attempts) for j in jobs if j.attempts]
    if not wanted:
        return {}
    rows = session.execute(
        select(Attempt, Partition)
        .join(Partition, Partition.pk == Attempt.partition_pk)
        .where(Attempt.job_id.in_([j for j, _ in wanted]))
    ).tuples()
    latest = dict(wanted)
    return {a.job_id: (a, p) for a, p in rows if a.number == latest[a.job_id]}


def attempt_partition(*, session: Session, attempt: Attempt | None) -> Partition | None:
    return None if attempt is None else session.get(Partition, attempt.partition_pk)


def request_cancel(*, session: Session, job_id: str, tenant_id: str | None) -> Job:
    """Cancel: a queued job ends now; a placed or running one is stopped by the scheduler/worker."""
    job = get_job(session=session, job_id=job_id, tenant_id=tenant_id)
    if job.state in FINAL_JOB_STATES:
        raise Conflict(f"Job {job_id} already ended ({job.state}).", state=job.state)
    if job.cancel_requested:
        return job
    job.cancel_requested = True
    job.updated_at = utcnow()
    attempt = current_attempt(session=session, job=job)
    if (
        attempt is not None
        and attempt.state == AttemptState.PLACED
        and attempts.cancel_placed(session=session, attempt=attempt, job=job)
    ):
        return job
    if job.state == JobState.QUEUED and (attempt is None or attempt.state not in LIVE_ATTEMPT_STATES):
        finalize_job(session=session, job=job, state=JobState.CANCELLED, reason="cancelled by user")
    else:
        # A worker holds it: the next heartbeat tells the worker to stop.
        add_event(session, job.id, "state", "cancel requested", data={"cancel_requested": True})
    session.flush()
    return job
