"""Changing a session: a longer maximum duration (reserved from the grant) or another idle timeout."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.errors import InvalidRequest, LimitExceeded, QuotaExceeded, TenantInactive
from scheduler.models import (
    Attempt,
    IpuSession,
    Job,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services.batch.job_state import add_event
from scheduler.services.sessions.views import lock_unended
from scheduler.services.tenancy.scope import Scope


def change_session(
    *,
    session: Session,
    session_id: str,
    scope: Scope,
    max_duration_s: int | None = None,
    idle_timeout_s: int | None = None,
) -> IpuSession:
    """Give a starting or active session a longer maximum duration, or another idle timeout.

    The added time is reserved from the grant as the start reserved the rest (at the rate of the
    type it holds, or of its dearest option while it queues), so a session never holds more than its
    grant can pay for. A duration is never shortened: the part of the reservation already billed is
    not the part that would be given back, and ending the session is the way to stop sooner. The
    sweep's warnings follow the new deadline by themselves (`warned_for` names the old one)."""
    row = lock_unended(session, session_id, scope)
    job = session.execute(
        select(Job)
        .where(Job.id == row.job_id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    ).scalar_one()
    plan, tenant = session.execute(
        select(Plan, Tenant).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == row.tenant_id)
    ).one()
    changes: list[str] = []
    extra = 0
    new_max = max_duration_s if max_duration_s is not None else row.max_duration_s
    if new_max < row.max_duration_s:
        raise InvalidRequest(
            f"Session {session_id} may hold its partition for {row.max_duration_s} s; a maximum duration "
            "can only grow. End the session to stop sooner.",
            field="max_duration_s",
        )
    # Only a longer duration is held to the ceiling: an admin may have lowered it since the start.
    if new_max > row.max_duration_s and new_max > plan.max_session_s:
        raise LimitExceeded(
            f"The {plan.name} plan holds a session for at most {plan.max_session_s} s; "
            f"this change asks for {new_max} s.",
            limit="max_session_s",
        )
    if new_max > row.max_duration_s:
        extra, change = _lengthen(session, row, job, tenant, new_max)
        changes.append(change)
    if idle_timeout_s is not None and idle_timeout_s != row.idle_timeout_s:
        row.idle_timeout_s = idle_timeout_s
        changes.append(f"idle timeout {idle_timeout_s} s")
    if changes:
        add_event(
            session,
            row.job_id,
            "log",
            "session changed: " + "; ".join(changes),
            data={
                "max_duration_s": row.max_duration_s,
                "idle_timeout_s": row.idle_timeout_s,
                "reserved_ipu_hours": billing.ipu_hours(extra),
            },
        )
    session.flush()
    return row


def _lengthen(session: Session, row: IpuSession, job: Job, tenant: Tenant, new_max: int) -> tuple[int, str]:
    """Give the session (its holder ``job`` locked) the longer maximum duration ``new_max``, reserving
    what the added time costs from the tenant's grant; what it reserved, and the change as its history
    says it."""
    added = new_max - row.max_duration_s
    options = {kind: dict(o) for kind, o in (job.options or {}).items()}
    hold = session.get(Attempt, row.attempt_id) if row.attempt_id is not None else None
    if hold is not None:
        # Holding: the added seconds cost the rate of the type it holds.
        extra = billing.charged_ipu_ms(row.ipus, float(new_max), hold.rate) - billing.charged_ipu_ms(
            row.ipus, float(row.max_duration_s), hold.rate
        )
        for option in options.values():
            option["predicted_runtime_s"] = float(new_max)
    else:
        # Queued: what the whole new duration costs on its dearest option, less what is reserved.
        for option in options.values():
            option["predicted_runtime_s"] = float(new_max)
        full = max((billing.option_cost_ipu_ms(o) for o in options.values()), default=0)
        extra = max(0, full - int(job.reserved_ipu_ms))
    locked = session.execute(
        select(Tenant)
        .where(Tenant.id == row.tenant_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    if locked.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {locked.status}.")
    left = billing.left_ipu_ms(locked)
    if extra > left:
        raise QuotaExceeded(
            f"Holding {row.ipus} IPUs {added} s longer costs up to {billing.ipu_hours(extra):.3f} "
            f"IPU-hours but only {billing.ipu_hours(max(0, left)):.3f} of the grant are left.",
            cost_ipu_hours=billing.ipu_hours(extra),
            remaining_ipu_hours=billing.ipu_hours(max(0, left)),
        )
    locked.reserved_ipu_ms += extra
    job.reserved_ipu_ms += extra
    job.options = options
    # The scheduler plans the rest of the fleet around the holder's predicted end.
    job.max_runtime_s = new_max
    job.predicted_runtime_s = float(new_max)
    job.updated_at = utcnow()
    row.max_duration_s = new_max
    return (
        extra,
        f"maximum duration {new_max} s (+{added} s, {billing.ipu_hours(extra):.4f} IPU-hours reserved)",
    )
