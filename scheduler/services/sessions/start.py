"""Starting a session: admitting its holder job (its whole duration reserved from the grant), and
holding the partition the scheduling pass placed it on (`activate_many`, in the pass's transaction)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.errors import InvalidRequest, LimitExceeded, QuotaExceeded, TenantInactive
from scheduler.ids import new_id
from scheduler.jobspec import SessionSpec
from scheduler.models import (
    Attempt,
    AttemptState,
    IpuSession,
    Job,
    JobState,
    Partition,
    Plan,
    SessionState,
    Tenant,
    utcnow,
)
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import add_event
from scheduler.services.capacity import fleet
from scheduler.services.tenancy import rates

SESSION_TASK = "session"  # the holder job's task: not a workload, never handed to an agent
HOLD_GCD = -1  # the holding attempt's GCD: beside the session's jobs' 0.., under the same unique index


def start_session(
    *, session: Session, tenant_id: str, spec: SessionSpec, member_id: str | None = None
) -> IpuSession:
    """Admit a session: its holder job queued with its whole duration reserved, and its row."""
    plan, tenant = session.execute(
        select(Plan, Tenant).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == tenant_id)
    ).one()
    max_duration = spec.max_duration_s or int(plan.max_session_s)
    if max_duration > plan.max_session_s:
        raise LimitExceeded(
            f"The {plan.name} plan holds a session for at most {plan.max_session_s} s; "
            f"this one asks for {max_duration} s.",
            limit="max_session_s",
        )
    idle = spec.idle_timeout_s or int(plan.idle_timeout_s)
    options = _options(session, plan, spec, max_duration)
    reserve = max(billing.option_cost_ipu_ms(o) for o in options.values())
    now = utcnow()
    _reserve(session, tenant_id, tenant, spec, max_duration, reserve, now)
    sid = new_id("ses")
    fastest = next(iter(options))
    job = Job(
        id=new_id("job"),
        tenant_id=tenant_id,
        name=f"session {sid}",
        submitted_by=member_id,  # whom its mail goes to
        spec={"session": sid, "ipus": spec.ipus, "machine": spec.machine or "any"},
        model=SESSION_TASK,
        task=SESSION_TASK,
        ipus=spec.ipus,
        ipus_requested=str(spec.ipus),
        machine_type=spec.machine if spec.machine not in (None, "any") else None,
        options=options,
        prefer="time",
        partition_name=None,
        priority=0,
        max_runtime_s=max_duration,
        predicted_runtime_s=options[fastest]["predicted_runtime_s"],
        reserved_ipu_ms=reserve,
        state=JobState.QUEUED,
        attempts=0,
        cancel_requested=False,
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    session.flush()
    row = IpuSession(
        id=sid,
        tenant_id=tenant_id,
        name=spec.name or "",
        state=SessionState.STARTING,
        ipus=spec.ipus,
        machine=spec.machine or "any",
        gcds=spec.gcds,
        max_duration_s=max_duration,
        idle_timeout_s=idle,
        job_id=job.id,
        created_at=now,
    )
    session.add(row)
    add_event(
        session,
        job.id,
        "state",
        f"session starting: waiting for {spec.ipus} IPUs ({spec.machine or 'any'}); up to {max_duration} s, "
        f"ends after {idle} s idle; {billing.ipu_hours(reserve):.4f} IPU-hours reserved",
        data={"state": SessionState.STARTING},
        at=now,
    )
    session.flush()
    return row


def _options(
    session: Session, plan: Plan, spec: SessionSpec, max_duration: int
) -> dict[str, dict[str, float]]:
    """Holding the session on each machine type the plan offers and the fleet can ever host it on
    (its predicted run time, rate and cost, as a job's options); refused when there is none."""
    pods = fleet.pods_by_type(session=session, max_age_s=fleet.PODS_CACHE_S)
    offered = rates.offers(plan=plan, machine=spec.machine, present=pods, what="sessions")
    offered.check_size(None, spec.ipus, "this session asks for")
    options: dict[str, dict[str, float]] = {}
    refusals: list[str] = []
    for kind in offered.kinds:
        try:
            fleet.check_fleet_can_ever_host(session=session, size=spec.ipus, machine_type=kind, pods=pods)
        except Exception as exc:  # a DomainError saying why this type cannot
            refusals.append(f"{kind}: {getattr(exc, 'detail', exc)}")
            continue
        options[kind] = offered.option(kind, spec.ipus, float(max_duration))
    if not options:
        raise InvalidRequest(
            "No partition of this size can ever be held: " + "; ".join(refusals), field="ipus"
        )
    return options


def _reserve(
    session: Session,
    tenant_id: str,
    tenant: Tenant,
    spec: SessionSpec,
    max_duration: int,
    reserve: int,
    now: datetime,
) -> None:
    """Reserve the session's whole cost from the tenant's grant, or refuse it (inactive, expired, too
    little left)."""
    # The tenant's row first, so the reservation is judged on exact figures (as job admission does).
    locked = session.execute(
        select(Tenant)
        .where(Tenant.id == tenant_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    if locked.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {locked.status}.")
    if locked.expires_at is not None and locked.expires_at <= now:
        raise TenantInactive(f"The trial of {tenant.name} ended on {locked.expires_at:%Y-%m-%d}.")
    left = billing.left_ipu_ms(locked)
    if reserve > left:
        raise QuotaExceeded(
            f"Holding {spec.ipus} IPUs for {max_duration} s costs up to {billing.ipu_hours(reserve):.3f} "
            f"IPU-hours but only {billing.ipu_hours(max(0, left)):.3f} of the grant are left; ask for a "
            "shorter max_duration_s.",
            cost_ipu_hours=billing.ipu_hours(reserve),
            remaining_ipu_hours=billing.ipu_hours(max(0, left)),
        )
    locked.reserved_ipu_ms += reserve


def activate_many(
    *, session: Session, starts: Sequence[tuple[Job, attempts.PlacedPartition]], now: datetime
) -> list[str]:
    """The scheduler placed these holder jobs: hold their partitions. Called in the pass's
    transaction with the jobs locked; returns the sessions made active."""
    if not starts:
        return []
    # The pass locked the holder jobs first, against this module's order (sessions, then jobs) that
    # changing or ending a session follows: a session row locked by one of those is skipped, not
    # waited for, so the two can never deadlock. Its job stays queued for the next pass, which
    # frees the partition made for it (scheduler/loop.py).
    by_job = {
        s.job_id: s
        for s in session.execute(
            select(IpuSession)
            .where(IpuSession.job_id.in_([j.id for j, _ in starts]))
            .order_by(IpuSession.id)
            .with_for_update(skip_locked=True)
        ).scalars()
    }
    active: list[str] = []
    for job, partition in starts:
        row = by_job.get(job.id)
        if row is None or row.state != SessionState.STARTING:
            continue
        # A session partition is not a job's (released by the session's end, not its jobs' ends),
        # nor an orphan, and runs one job per GCD.
        session.execute(
            update(Partition).where(Partition.pk == partition.pk).values(kind="session", gcds=row.gcds)
        )
        job.attempts += 1
        job.state = JobState.RUNNING
        job.started_at = now
        job.updated_at = now
        job.wait = None
        fields = rates.attempt_fields(job, partition.machine_type, now)
        attempt = Attempt(
            job_id=job.id,
            tenant_id=job.tenant_id,
            number=job.attempts,
            state=AttemptState.RUNNING,
            epoch=1,
            partition_pk=partition.pk,
            gcd=HOLD_GCD,
            size=partition.size,
            machine_type=partition.machine_type,
            placed_at=now,
            started_at=now,
            worker=None,
            **fields,
        )
        session.add(attempt)
        session.flush()
        row.state = SessionState.ACTIVE
        row.started_at = now
        row.idle_since = now
        row.partition_pk = partition.pk
        row.attempt_id = attempt.id
        add_event(
            session,
            job.id,
            "state",
            f"session active on partition {partition.name} ({partition.size} x {partition.machine_type}"
            + (f", {row.gcds} graph compile domains" if row.gcds > 1 else "")
            + ")",
            attempt=attempt.number,
            data={"state": SessionState.ACTIVE, "partition": partition.name, "ipus": list(partition.ipu_ids)},
            at=now,
        )
        active.append(row.id)
    return active
