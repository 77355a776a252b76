"""Replicas: an endpoint's holder jobs (task `serve`), queued with their window of cost reserved,
placed like any job, and drained through the cancel path.

A replica's state is derived, never reported: its job queued (or its attempt placed) is `queued`;
its running attempt at cluster time t (since started_at, on the clock recorded in its timeline,
timeline["scale"]) is `compiling` before timeline["compile_s"], `loading` until compile_s + load_s,
then `ready`; a cancel requested is `draining`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.clock import Clock
from scheduler.ids import new_id
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    SERVE_TASK,
    Attempt,
    AttemptState,
    Endpoint,
    Job,
    JobState,
    Partition,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.tenancy import rates

# The cluster seconds of a replica's cost its holder job reserves from the grant (capped by what is
# left): what the scheduler plans it around, as a job's predicted run time. A replica runs until it is
# drained; past the window it is billed from the grant directly, as any tick is.
WINDOW_S = 3600.0


def _lock_tenant(session: Session, tenant_id: str) -> Tenant:
    return session.execute(
        select(Tenant)
        .where(Tenant.id == tenant_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()


def _replica_options(ep: Endpoint, plan: Plan) -> dict[str, dict[str, float]]:
    offered = rates.offers(plan=plan, preemptible=ep.preemptible)
    return {kind: offered.option(kind, int(f["ipus"]), WINDOW_S) for kind, f in ep.serve.items()}


def _add_replicas(session: Session, ep: Endpoint, plan: Plan, tenant: Tenant, n: int, now: datetime) -> int:
    """Queue `n` replica holder jobs (the tenant's row locked by the caller), each reserving its window
    of cost or what is left of the grant; returns how many were made (fewer once the grant is spent)."""
    options = _replica_options(ep, plan)
    window = max(billing.option_cost_ipu_ms(o) for o in options.values())
    fastest = next(iter(options))
    named = ep.machine if ep.machine != "any" else None
    made = 0
    for _ in range(n):
        left = billing.left_ipu_ms(tenant)
        if left <= 0:
            break
        reserve = min(window, left)
        tenant.reserved_ipu_ms += reserve
        job = Job(
            id=new_id("job"),
            tenant_id=ep.tenant_id,
            name=f"endpoint {ep.name} replica",
            spec={
                "workload": dict(ep.workload),
                "ipus": int(options[fastest]["ipus"]),
                "machine": ep.machine,
                "endpoint": ep.id,
            },
            model=ep.model,
            task=SERVE_TASK,
            ipus=int(options[fastest]["ipus"]),
            ipus_requested=ep.ipus_requested,
            machine_type=named,
            options=options,
            prefer="time",
            partition_name=None,
            endpoint_id=ep.id,
            priority=0,
            max_runtime_s=None,
            preemptible=ep.preemptible,
            predicted_runtime_s=WINDOW_S,
            reserved_ipu_ms=reserve,
            state=JobState.QUEUED,
            attempts=0,
            cancel_requested=False,
            created_at=now,
            updated_at=now,
        )
        session.add(job)
        session.flush()
        add_event(
            session,
            job.id,
            "state",
            f"replica of endpoint {ep.name} queued: {job.ipus} IPUs ({ep.machine}); "
            f"{billing.ipu_hours(reserve):.4f} IPU-hours reserved",
            data={"state": JobState.QUEUED, "endpoint": ep.id},
            at=now,
        )
        made += 1
    return made


@dataclass(frozen=True)
class Replica:
    job: Job
    attempt: Attempt | None
    state: str
    ready_at: datetime | None
    partition: str | None = None


def replica_state(job: Job, attempt: Attempt | None, now: datetime) -> tuple[str, datetime | None]:
    """A replica's state, derived from its holder job and attempt (module docstring), and when it was or
    will be ready (wall clock) once its attempt runs."""
    if job.cancel_requested and job.state not in FINAL_JOB_STATES:
        return "draining", None
    if job.state in FINAL_JOB_STATES:
        return "stopped", None
    if (
        attempt is None
        or attempt.state != AttemptState.RUNNING
        or attempt.started_at is None
        or job.state != JobState.RUNNING
    ):
        return "queued", None
    timeline = attempt.timeline or {}
    if "compile_s" not in timeline or "load_s" not in timeline:
        return "compiling", None
    clock = Clock(float(timeline.get("scale", 1.0)) or 1.0)  # the one its attempt was taken at
    warm = float(timeline["compile_s"]) + float(timeline["load_s"])
    ready_at = clock.wall_after(attempt.started_at, warm)
    t = clock.cluster_since(attempt.started_at, now)
    if t < float(timeline["compile_s"]):
        return "compiling", ready_at
    if t < warm:
        return "loading", ready_at
    return "ready", ready_at


def replicas_of(
    *, session: Session, endpoint_ids: Sequence[str], now: datetime, live_only: bool = True
) -> dict[str, list[Replica]]:
    """Each endpoint's replicas (its holder jobs not ended, oldest first) with their derived states."""
    out: dict[str, list[Replica]] = {e: [] for e in endpoint_ids}
    if not endpoint_ids:
        return out
    stmt = select(Job).where(Job.endpoint_id.in_(list(endpoint_ids)), Job.task == SERVE_TASK)
    if live_only:
        stmt = stmt.where(Job.state.in_((JobState.QUEUED, JobState.RUNNING)))
    jobs = list(session.execute(stmt.order_by(Job.id)).scalars())
    current = (
        {
            a.job_id: a
            for a in session.execute(
                select(Attempt).where(
                    Attempt.job_id.in_([j.id for j in jobs if j.attempts]),
                    Attempt.state.in_(LIVE_ATTEMPT_STATES),
                )
            ).scalars()
        }
        if jobs
        else {}
    )
    names = (
        dict(
            session.execute(
                select(Partition.pk, Partition.name).where(
                    Partition.pk.in_({a.partition_pk for a in current.values()})
                )
            )
            .tuples()
            .all()
        )
        if current
        else {}
    )
    for job in jobs:
        attempt = current.get(job.id)
        state, ready_at = replica_state(job, attempt, now)
        assert job.endpoint_id is not None
        where = names.get(attempt.partition_pk) if attempt is not None else None
        out[job.endpoint_id].append(Replica(job, attempt, state, ready_at, where))
    return out


def billed_ipu_ms(*, session: Session, endpoint_ids: Sequence[str]) -> dict[str, int]:
    """What each endpoint's replicas were billed so far (meter ticks and settles)."""
    if not endpoint_ids:
        return {}
    rows = session.execute(
        select(Job.endpoint_id, func.coalesce(func.sum(Attempt.metered_ipu_ms), 0))
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Job.endpoint_id.in_(list(endpoint_ids)))
        .group_by(Job.endpoint_id)
    ).tuples()
    return {str(e): int(v) for e, v in rows}


def _drain(session: Session, jobs: Sequence[Job], reason: str) -> list[str]:
    """Stop these replicas through the cancel path: a queued one ends now, a running one's attempt is
    ended (billed up to now) and its agent told to stop. Returns the jobs drained."""
    ids = sorted(j.id for j in jobs)
    if not ids:
        return []
    # FOR NO KEY UPDATE, as attempts._lock_jobs: an agent's meter event (a foreign key to the job)
    # written while it holds the attempt must not wait for this lock while this waits for the attempt.
    locked = list(
        session.execute(
            select(Job)
            .where(Job.id.in_(ids))
            .order_by(Job.id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        ).scalars()
    )
    for job in locked:
        if job.state in FINAL_JOB_STATES:
            continue
        job.cancel_requested = True
        job.updated_at = utcnow()
    live = list(
        session.execute(
            select(Attempt.id).where(Attempt.job_id.in_(ids), Attempt.state.in_(LIVE_ATTEMPT_STATES))
        ).scalars()
    )
    attempts.stop_running(
        session=session, attempt_ids=live, outcome=AttemptState.CANCELLED, reason=reason, max_attempts=1
    )
    drained = []
    for job in locked:
        if job.state not in FINAL_JOB_STATES:
            finalize_job(session=session, job=job, state=JobState.CANCELLED, reason=reason)
        drained.append(job.id)
    return drained


def _matches(job: Job, ep: Endpoint) -> bool:
    """Whether a replica runs the endpoint's present layout (a batching change makes older ones stale)."""
    return bool(job.spec.get("workload") == ep.workload)


def _drain_order(r: Replica) -> tuple[int, str]:
    # Those not serving yet go first (nothing is lost), then the newest of those serving.
    rank = {"queued": 0, "compiling": 1, "loading": 2, "ready": 3}.get(r.state, 0)
    return rank, "".join(chr(0x10FFFF - ord(c)) for c in r.job.id)
