"""Metering: every IPU-second of an attempt, billed once.

An attempt is metered as its rate x partition size x cluster time (the rate of its machine type
under the tenant's plan, fixed when it was placed: `scheduler.services.rates`): in ticks while it
runs (so a running job burns quota as it goes) and settled once at its end. Every meter event has a
deterministic id (`att:<attempt>:tick:<seq>`, `att:<attempt>:settle`), and counters move only when
the event row is actually inserted, so replaying a tick or a finish changes nothing. Usage never
passes the grant: a tick that would overspend is cut to what is left, and the job is stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.models import Attempt, Job, MeterEvent, Tenant, utcnow
from scheduler.services.rates import charged_ipu_ms, raw_ipu_ms


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


def _rate(attempt: Attempt) -> float:
    return attempt.rate if attempt.rate is not None else 1.0


def _charged(attempt: Attempt, cluster_s: float) -> int:
    return charged_ipu_ms(attempt.size, cluster_s, _rate(attempt))


# Every attempt of a tenant bills through the tenant's row, so its lock is the one place where a
# tenant's finishing jobs queue behind each other. The functions below therefore write everything
# else first (the meter event, the job, the attempt) and then move the tenant's counters with one
# guarded UPDATE, the last statement before the caller commits: the lock is held for that statement
# and the commit. Only when the guard refuses (the grant would be passed) is the row locked and
# read, the amount cut to what is left, and what was written corrected.


def _move_counters(session: Session, tenant_id: str, used: int, reserved: int, *, guard: bool) -> bool:
    """Add to the tenant's counters; with `guard`, only if `used` keeps it within its grant."""
    stmt = update(Tenant).where(Tenant.id == tenant_id)
    if guard:
        stmt = stmt.where(Tenant.used_ipu_ms + used <= Tenant.quota_ipu_ms)
    stmt = stmt.values(
        used_ipu_ms=Tenant.used_ipu_ms + used, reserved_ipu_ms=Tenant.reserved_ipu_ms + reserved
    )
    # Nothing of the row is read back: a Tenant object in this session keeps what it had loaded.
    done = session.execute(stmt.execution_options(synchronize_session=False)).rowcount
    return bool(done == 1)


def _left_under_lock(session: Session, tenant_id: str) -> int:
    """What is left of the tenant's grant, its row locked until commit (SQLite: the write lock)."""
    stmt = (
        select(Tenant.quota_ipu_ms, Tenant.used_ipu_ms)
        .where(Tenant.id == tenant_id)
        .with_for_update(key_share=True)
    )
    quota, used = session.execute(stmt).one()
    return max(0, quota - used)


def _event(
    event_id: str,
    attempt: Attempt,
    job: Job,
    kind: str,
    amount: int,
    cluster_s: float,
    outcome: str | None = None,
) -> dict[str, Any]:
    return dict(
        id=event_id,
        tenant_id=attempt.tenant_id,
        job_id=attempt.job_id,
        attempt_id=attempt.id,
        kind=kind,
        ipu_ms=amount,
        machine_type=attempt.machine_type,
        rate=_rate(attempt),
        raw_ipu_ms=raw_ipu_ms(amount, _rate(attempt)),
        partition_size=attempt.size,
        cluster_s=cluster_s,
        workload=job.model,
        outcome=outcome,
        at=utcnow(),
    )


def _set_event_amount(session: Session, event_id: str, amount: int, rate: float) -> None:
    session.execute(
        update(MeterEvent)
        .where(MeterEvent.id == event_id)
        .values(ipu_ms=amount, raw_ipu_ms=raw_ipu_ms(amount, rate))
    )


@dataclass
class Tick:
    billed_ipu_ms: int
    quota_exhausted: bool


def meter_tick(*, session: Session, attempt: Attempt, job: Job, seq: int, cluster_s: float) -> Tick:
    """Bill the attempt up to `cluster_s`. Caller holds the attempt's lease (fenced by epoch)."""
    due = _charged(attempt, cluster_s) - attempt.metered_ipu_ms
    if due <= 0:
        return Tick(0, False)
    event_id = f"att:{attempt.id}:tick:{seq}"
    if not insert_ignore(session, _event(event_id, attempt, job, "tick", due, cluster_s)):
        return Tick(0, False)  # a replay: this tick was billed when it was first written

    def bill(amount: int) -> int:
        consumed = min(amount, job.reserved_ipu_ms)
        job.reserved_ipu_ms -= consumed
        attempt.reservation_used_ipu_ms += consumed
        attempt.metered_ipu_ms += amount
        attempt.ticks = max(attempt.ticks, seq)
        return consumed

    baseline = (job.reserved_ipu_ms, attempt.reservation_used_ipu_ms, attempt.metered_ipu_ms, attempt.ticks)
    consumed = bill(due)
    session.flush()
    if _move_counters(session, attempt.tenant_id, due, -consumed, guard=True):
        return Tick(due, False)
    # The grant would be passed: bill what is left of it, and the job is stopped.
    job.reserved_ipu_ms, attempt.reservation_used_ipu_ms, attempt.metered_ipu_ms, attempt.ticks = baseline
    billed = min(due, _left_under_lock(session, attempt.tenant_id))
    if billed == 0:
        session.execute(delete(MeterEvent).where(MeterEvent.id == event_id))
        return Tick(0, True)
    _set_event_amount(session, event_id, billed, _rate(attempt))
    consumed = bill(billed)
    _move_counters(session, attempt.tenant_id, billed, -consumed, guard=False)
    return Tick(billed, True)


def settle(
    *, session: Session, attempt: Attempt, job: Job, billable: bool, outcome: str, job_ends: bool = False
) -> int:
    """The attempt's one settle record: bill what ran, or refund every tick of a platform fault.

    `job_ends`: the job ends with this attempt, so whatever it still reserves goes back to the
    tenant in the same update. Returns the amount of the settle record (negative for a refund).
    """
    due = max(0, _charged(attempt, attempt.cluster_s) - attempt.metered_ipu_ms)
    amount = due if billable else -attempt.metered_ipu_ms
    event_id = f"att:{attempt.id}:settle"
    values = _event(event_id, attempt, job, "settle", amount, attempt.cluster_s, outcome=outcome)
    if not insert_ignore(session, values):
        return 0  # a replay: this attempt was settled when its end was first written

    def bill(amount: int) -> int:
        """Update the job and the attempt; returns the change to the tenant's reserved counter."""
        if billable:
            consumed = min(amount, job.reserved_ipu_ms)
            job.reserved_ipu_ms -= consumed
            attempt.metered_ipu_ms += amount
            reserved = -consumed
        else:
            # The job will run again: hold the quota its lost ticks had consumed, as before they ran.
            job.reserved_ipu_ms += attempt.reservation_used_ipu_ms
            reserved = attempt.reservation_used_ipu_ms
            attempt.reservation_used_ipu_ms = 0
            attempt.metered_ipu_ms = 0
        if job_ends:
            reserved -= job.reserved_ipu_ms
            job.reserved_ipu_ms = 0
        return reserved

    baseline = (job.reserved_ipu_ms, attempt.metered_ipu_ms, attempt.reservation_used_ipu_ms)
    reserved = bill(amount)
    session.flush()
    if _move_counters(session, attempt.tenant_id, amount, reserved, guard=billable and amount > 0):
        return amount
    # Billing all that ran would pass the grant: bill what is left of it.
    job.reserved_ipu_ms, attempt.metered_ipu_ms, attempt.reservation_used_ipu_ms = baseline
    amount = min(due, _left_under_lock(session, attempt.tenant_id))
    _set_event_amount(session, event_id, amount, _rate(attempt))
    reserved = bill(amount)
    _move_counters(session, attempt.tenant_id, amount, reserved, guard=False)
    return amount
