"""Metering: every IPU-second of an attempt, billed once.

An attempt is metered as partition size x cluster time: in ticks while it runs (so a running job
burns quota as it goes) and settled once at its end. Every meter event has a deterministic id
(`att:<attempt>:tick:<seq>`, `att:<attempt>:settle`), and counters move only when the event row
is actually inserted, so replaying a tick or a finish changes nothing. Usage never passes the
grant: a tick that would overspend is cut to what is left, and the job is stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.models import Attempt, Job, MeterEvent, Tenant, utcnow


def insert_ignore(session: Session, values: dict[str, Any]) -> bool:
    """INSERT the meter event unless its id exists. True if this call inserted it."""
    dialect = session.get_bind().dialect.name
    table = MeterEvent.__table__
    ins = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    # RETURNING, not rowcount: it says unambiguously, on both databases, whether a row was written.
    stmt = ins.values(**values).on_conflict_do_nothing(index_elements=["id"]).returning(table.c.id)
    return session.execute(stmt).first() is not None


def ipu_ms(size: int, cluster_s: float) -> int:
    return round(size * cluster_s * 1000)


def _lock_tenant(session: Session, tenant_id: str) -> Tenant:
    # FOR UPDATE on PostgreSQL; SQLite's write transaction already holds the database lock.
    stmt = select(Tenant).where(Tenant.id == tenant_id).with_for_update(key_share=True)
    return session.execute(stmt.execution_options(populate_existing=True)).scalar_one()


@dataclass
class Tick:
    billed_ipu_ms: int
    quota_exhausted: bool


def meter_tick(*, session: Session, attempt: Attempt, job: Job, seq: int, cluster_s: float) -> Tick:
    """Bill the attempt up to `cluster_s`. Caller holds the attempt's lease (fenced by epoch)."""
    tenant = _lock_tenant(session, attempt.tenant_id)
    due = ipu_ms(attempt.size, cluster_s) - attempt.metered_ipu_ms
    left = max(0, tenant.quota_ipu_ms - tenant.used_ipu_ms)
    billed = max(0, min(due, left))
    exhausted = due > left
    if billed > 0:
        inserted = insert_ignore(
            session,
            dict(
                id=f"att:{attempt.id}:tick:{seq}",
                tenant_id=attempt.tenant_id,
                job_id=attempt.job_id,
                attempt_id=attempt.id,
                kind="tick",
                ipu_ms=billed,
                partition_size=attempt.size,
                cluster_s=cluster_s,
                workload=job.model,
                at=utcnow(),
            ),
        )
        if not inserted:
            return Tick(0, exhausted)
        consumed = min(billed, job.reserved_ipu_ms)
        job.reserved_ipu_ms -= consumed
        attempt.reservation_used_ipu_ms += consumed
        attempt.metered_ipu_ms += billed
        attempt.ticks = max(attempt.ticks, seq)
        tenant.used_ipu_ms += billed
        tenant.reserved_ipu_ms -= consumed
    return Tick(billed, exhausted)


def settle(*, session: Session, attempt: Attempt, job: Job, billable: bool, outcome: str) -> int:
    """The attempt's one settle record: bill what ran, or refund every tick of a platform fault.

    Returns the amount of the settle record (negative for a refund).
    """
    tenant = _lock_tenant(session, attempt.tenant_id)
    if billable:
        left = max(0, tenant.quota_ipu_ms - tenant.used_ipu_ms)
        amount = max(0, min(ipu_ms(attempt.size, attempt.cluster_s) - attempt.metered_ipu_ms, left))
    else:
        amount = -attempt.metered_ipu_ms
    inserted = insert_ignore(
        session,
        dict(
            id=f"att:{attempt.id}:settle",
            tenant_id=attempt.tenant_id,
            job_id=attempt.job_id,
            attempt_id=attempt.id,
            kind="settle",
            ipu_ms=amount,
            partition_size=attempt.size,
            cluster_s=attempt.cluster_s,
            workload=job.model,
            outcome=outcome,
            at=utcnow(),
        ),
    )
    if not inserted:
        return 0
    tenant.used_ipu_ms += amount
    if billable:
        consumed = min(amount, job.reserved_ipu_ms)
        job.reserved_ipu_ms -= consumed
        tenant.reserved_ipu_ms -= consumed
        attempt.metered_ipu_ms += amount
    else:
        # The job will run again: hold the quota its lost ticks had consumed, as before they ran.
        job.reserved_ipu_ms += attempt.reservation_used_ipu_ms
        tenant.reserved_ipu_ms += attempt.reservation_used_ipu_ms
        attempt.reservation_used_ipu_ms = 0
        attempt.metered_ipu_ms = 0
    return amount
