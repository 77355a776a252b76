"""Metering: every IPU-second of an attempt, billed once.

An attempt is metered as its rate x partition size x cluster time (the rate of its machine type
under the tenant's plan, fixed when it was placed: `scheduler.services.tenancy.rates`): in ticks while it
runs (so a running job burns quota as it goes; its host agent bills many attempts per transaction,
every `IPUCLOUD_METER_INTERVAL_S`) and settled once at its end. Every meter event has a deterministic id
(`att:<attempt>:tick:<seq>`, `att:<attempt>:settle`), and counters move only when the event row
is actually inserted, so replaying a tick or a finish changes nothing. Usage never passes the
grant: a tick that would overspend is cut to what is left, and the job is stopped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.billing import charged_ipu_ms, raw_ipu_ms
from scheduler.db import changed
from scheduler.models import Attempt, Job, MeterEvent, Tenant, utcnow


def insert_ignore(session: Session, values: dict[str, Any]) -> bool:
    """INSERT the meter event unless its id exists. True if this call inserted it."""
    dialect = session.get_bind().dialect.name
    table = MeterEvent.__table__
    ins = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
    # RETURNING, not rowcount: it says unambiguously, on both databases, whether a row was written.
    stmt = ins.values(**values).on_conflict_do_nothing(index_elements=["id"]).returning(table.c.id)
    return session.execute(stmt).first() is not None


def _insert_new(session: Session, rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """Insert the meter events whose ids do not exist yet; returns the ids inserted.

    Every caller holds the row locks of the events' attempts, and only a transaction holding an
    attempt's lock writes its events, so the ids found missing here cannot appear before this
    insert: a plain pipelined executemany then does what `ON CONFLICT DO NOTHING RETURNING` would,
    without the huge multi-row statements the database driver would parse anew each time. The
    conflict clause stays as a guard.
    """
    if not rows:
        return set()
    ids = [r["id"] for r in rows]
    existing = set(session.execute(select(MeterEvent.id).where(MeterEvent.id.in_(ids))).scalars())
    new = [r for r in rows if r["id"] not in existing]
    if new:
        table = MeterEvent.__table__
        dialect = session.get_bind().dialect.name
        ins = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
        session.execute(ins.on_conflict_do_nothing(index_elements=["id"]), new)
    return {r["id"] for r in new}


def _rate(attempt: Attempt | Metered) -> float:
    return attempt.rate if attempt.rate is not None else 1.0


def _charged(attempt: Attempt | Metered, cluster_s: float) -> int:
    """What the attempt owes for `cluster_s` of its partition: its rate x IPU-milliseconds, less the
    restore of a checkpoint at its start (`unbilled_s`), which is the platform's cost."""
    billable = max(0.0, cluster_s - (attempt.unbilled_s or 0.0))
    return charged_ipu_ms(attempt.size, billable, _rate(attempt))


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
    done = changed(session, stmt.execution_options(synchronize_session=False))
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


class MeterEventRow(TypedDict):
    """A `meter_events` row as it is inserted: one tick or settle of an attempt."""

    id: str
    tenant_id: str
    job_id: str
    attempt_id: int
    kind: str
    ipu_ms: int
    machine_type: str | None
    rate: float
    raw_ipu_ms: int | None
    partition_size: int
    cluster_s: float
    workload: str
    outcome: str | None
    at: datetime


def _event(
    event_id: str,
    attempt: Attempt,
    job: Job,
    kind: str,
    amount: int,
    cluster_s: float,
    outcome: str | None = None,
) -> MeterEventRow:
    return MeterEventRow(
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


@dataclass(slots=True)
class Metered:
    """What billing a running attempt reads and writes of its row (locked by the caller): a tick
    needs no ORM object, and a host agent bills thousands of them a minute."""

    id: int
    tenant_id: str
    job_id: str
    size: int
    metered_ipu_ms: int
    reservation_used_ipu_ms: int
    cluster_s: float
    ticks: int
    # What it is billed at (scheduler.services.tenancy.rates): its type's rate, fixed when it was placed.
    machine_type: str | None = None
    rate: float = 1.0
    unbilled_s: float = 0.0


@dataclass(frozen=True)
class TickDue:
    """A running attempt to bill up to `cluster_s` as its tick number `seq`; the attempt's row is
    locked by the caller, and `job_reserved_ipu_ms`/`workload` are its job's (the job's row is not
    written while an attempt runs, so ticks never wait on it)."""

    attempt: Metered | Attempt
    seq: int
    cluster_s: float
    job_reserved_ipu_ms: int
    workload: str


def meter_ticks(*, session: Session, ticks: list[TickDue]) -> set[int]:
    """Bill many running attempts at once: their events in one statement, each tenant's counters in
    one guarded UPDATE. Returns the attempts whose tenant's grant ran out (billed what was left).

    While an attempt runs, what its ticks consume of the job's reservation is kept on the attempt
    (`reservation_used_ipu_ms`); its settle moves it to the job.
    """
    due: list[tuple[TickDue, int]] = []
    for t in ticks:
        amount = _charged(t.attempt, t.cluster_s) - t.attempt.metered_ipu_ms
        if amount > 0:
            due.append((t, amount))
    if not due:
        return set()
    now = utcnow()
    rows = [
        dict(
            id=f"att:{t.attempt.id}:tick:{t.seq}",
            tenant_id=t.attempt.tenant_id,
            job_id=t.attempt.job_id,
            attempt_id=t.attempt.id,
            kind="tick",
            ipu_ms=amount,
            machine_type=t.attempt.machine_type,
            rate=_rate(t.attempt),
            raw_ipu_ms=raw_ipu_ms(amount, _rate(t.attempt)),
            partition_size=t.attempt.size,
            cluster_s=t.cluster_s,
            workload=t.workload,
            outcome=None,
            at=now,
        )
        for t, amount in due
    ]
    # A replayed tick (a retried transaction whose first commit went through) was billed when it
    # was first written.
    written = _insert_new(session, rows)
    by_tenant: dict[str, list[tuple[TickDue, int]]] = {}
    for t, amount in due:
        if f"att:{t.attempt.id}:tick:{t.seq}" in written:
            by_tenant.setdefault(t.attempt.tenant_id, []).append((t, amount))
    exhausted: set[int] = set()

    def consume(t: TickDue, amount: int) -> int:
        a = t.attempt
        consumed = max(0, min(amount, t.job_reserved_ipu_ms - a.reservation_used_ipu_ms))
        a.reservation_used_ipu_ms += consumed
        a.metered_ipu_ms += amount
        a.cluster_s = max(a.cluster_s, t.cluster_s)
        a.ticks = max(a.ticks, t.seq)
        return consumed

    # Tenants in a fixed order: two agents billing the same tenants take their rows in one order.
    for tenant_id in sorted(by_tenant):
        items = by_tenant[tenant_id]
        used = sum(amount for _, amount in items)
        consumed = sum(
            max(0, min(amount, t.job_reserved_ipu_ms - t.attempt.reservation_used_ipu_ms))
            for t, amount in items
        )
        if _move_counters(session, tenant_id, used, -consumed, guard=True):
            for t, amount in items:
                consume(t, amount)
            continue
        # The grant would be passed: bill what is left of it, in order, and stop whoever it runs out on.
        left = _left_under_lock(session, tenant_id)
        used = consumed = 0
        for t, amount in items:
            billed = min(amount, left)
            left -= billed
            event_id = f"att:{t.attempt.id}:tick:{t.seq}"
            if billed < amount:
                exhausted.add(t.attempt.id)
                if billed == 0:
                    session.execute(delete(MeterEvent).where(MeterEvent.id == event_id))
                    continue
                _set_event_amount(session, event_id, billed, _rate(t.attempt))
            # Only the time billed counts as run: the attempt's clock stops where its grant did.
            cluster_s = t.cluster_s if billed == amount else t.attempt.cluster_s
            t_billed = TickDue(t.attempt, t.seq, cluster_s, t.job_reserved_ipu_ms, t.workload)
            consumed += consume(t_billed, billed)
            used += billed
        _move_counters(session, tenant_id, used, -consumed, guard=False)
    settled = [t.attempt for items in by_tenant.values() for t, _ in items if isinstance(t.attempt, Metered)]
    if settled:
        table = Attempt.__table__
        session.execute(
            update(table)
            .where(table.c.id == bindparam("a_id"))
            .values(
                metered_ipu_ms=bindparam("a_metered"),
                reservation_used_ipu_ms=bindparam("a_used"),
                cluster_s=bindparam("a_cluster_s"),
                ticks=bindparam("a_ticks"),
            ),
            [
                {
                    "a_id": a.id,
                    "a_metered": a.metered_ipu_ms,
                    "a_used": a.reservation_used_ipu_ms,
                    "a_cluster_s": a.cluster_s,
                    "a_ticks": a.ticks,
                }
                for a in settled
            ],
        )
    return exhausted


@dataclass(frozen=True)
class Settle:
    """An attempt's settle: bill what ran (`billable`), or refund its ticks (a platform fault).
    `job_ends`: the job ends with this attempt, so whatever it still reserves goes back too.

    `kept_s`: a platform fault after a checkpoint: the work up to that checkpoint (cluster time of the
    attempt) is kept, since the next attempt resumes from it, and is billed, once; the rest is refunded.
    """

    attempt: Attempt
    job: Job
    billable: bool
    outcome: str
    job_ends: bool = False
    kept_s: float | None = None

    @property
    def keeps(self) -> bool:
        return not self.billable and self.kept_s is not None


def settle(
    *, session: Session, attempt: Attempt, job: Job, billable: bool, outcome: str, job_ends: bool = False
) -> int:
    """One attempt's settle record; returns its amount (negative for a refund, 0 for a replay)."""
    return settle_many(session=session, items=[Settle(attempt, job, billable, outcome, job_ends)]).get(
        attempt.id, 0
    )


def _settle_bill(item: Settle, amount: int) -> int:
    """Apply a settle of `amount` to the job and the attempt; returns the change to the tenant's
    reserved counter."""
    attempt, job = item.attempt, item.job
    if item.billable:
        consumed = min(amount, job.reserved_ipu_ms)
        job.reserved_ipu_ms -= consumed
        attempt.metered_ipu_ms += amount
        reserved = -consumed
    elif item.keeps:
        # As a refund of every tick followed by a bill of the work kept: the quota the ticks had
        # consumed is held again, then the kept work consumes the job's reservation.
        keep = attempt.metered_ipu_ms + amount
        consumed = max(0, min(keep, job.reserved_ipu_ms))
        job.reserved_ipu_ms -= consumed
        reserved = attempt.reservation_used_ipu_ms - consumed
        attempt.reservation_used_ipu_ms = 0
        attempt.metered_ipu_ms = keep
    else:
        # The job will run again: hold the quota its lost ticks had consumed, as before they ran
        # (the job's own reservation was never lowered while the attempt ran).
        reserved = attempt.reservation_used_ipu_ms
        attempt.reservation_used_ipu_ms = 0
        attempt.metered_ipu_ms = 0
    if item.job_ends:
        reserved -= job.reserved_ipu_ms
        job.reserved_ipu_ms = 0
    return reserved


def settle_many(*, session: Session, items: Sequence[Settle]) -> dict[int, int]:
    """Settle many attempts: their records in one statement, each tenant's counters in one guarded
    UPDATE, tenants in one order. Returns each written record's amount by attempt (a replay, whose
    record exists already, is left out: it was settled when its end was first written).

    Only when a tenant's guarded update refuses (billing all that ran would pass its grant) is its
    row locked and read, and its attempts settled one by one: refunds first, then each bill cut to
    what is left of the grant.
    """
    prepared = []
    for item in items:
        a = item.attempt
        if item.keeps:
            assert item.kept_s is not None
            kept = _charged(a, min(item.kept_s, a.cluster_s))
            due, amount = kept - a.metered_ipu_ms, kept - a.metered_ipu_ms
        else:
            due = max(0, _charged(a, a.cluster_s) - a.metered_ipu_ms)
            amount = due if item.billable else -a.metered_ipu_ms
        prepared.append((item, due, amount))
    if not prepared:
        return {}
    written = _insert_new(
        session,
        [
            _event(f"att:{i.attempt.id}:settle", i.attempt, i.job, "settle", amount, i.attempt.cluster_s)
            | {"outcome": i.outcome}
            for i, _, amount in prepared
        ],
    )
    by_tenant: dict[str, list[tuple[Settle, int, int, tuple[int, int, int], int]]] = {}
    for item, due, amount in prepared:
        if f"att:{item.attempt.id}:settle" not in written:
            continue
        a, j = item.attempt, item.job
        if item.billable:
            # What the ticks consumed of the job's reservation was kept on the attempt while it ran.
            j.reserved_ipu_ms -= a.reservation_used_ipu_ms
        baseline = (j.reserved_ipu_ms, a.metered_ipu_ms, a.reservation_used_ipu_ms)
        reserved = _settle_bill(item, amount)
        by_tenant.setdefault(a.tenant_id, []).append((item, due, amount, baseline, reserved))
    session.flush()
    amounts: dict[int, int] = {}
    for tenant_id in sorted(by_tenant):
        entries = by_tenant[tenant_id]
        used = sum(amount for _, _, amount, _, _ in entries)
        reserved = sum(r for _, _, _, _, r in entries)
        guard = any((item.billable or item.keeps) and amount > 0 for item, _, amount, _, _ in entries)
        if _move_counters(session, tenant_id, used, reserved, guard=guard):
            amounts.update({item.attempt.id: amount for item, _, amount, _, _ in entries})
            continue
        # Billing all that ran would pass the grant: refunds first, then bill what is left, in order.
        for item, _, _, (job_reserved, metered, used_reservation), _ in entries:
            item.job.reserved_ipu_ms = job_reserved
            item.attempt.metered_ipu_ms = metered
            item.attempt.reservation_used_ipu_ms = used_reservation
        ordered = sorted(entries, key=lambda e: (e[0].billable or e[0].keeps) and e[2] > 0)
        for item, due, amount, _, _ in ordered:
            if (item.billable or item.keeps) and amount > 0:
                amount = min(due, _left_under_lock(session, tenant_id))
                _set_event_amount(session, f"att:{item.attempt.id}:settle", amount, _rate(item.attempt))
            _move_counters(session, tenant_id, amount, _settle_bill(item, amount), guard=False)
            amounts[item.attempt.id] = amount
    return amounts


@dataclass(frozen=True)
class HoldRefund:
    """IPU-seconds of a session's hold that a platform fault made useless: `ipus` of its partition
    (the faulted job's) for `cluster_s` cluster seconds (`att:<attempt>:fault-refund`, the faulted
    job attempt's id, so a replay refunds nothing)."""

    hold: Attempt
    attempt_id: int
    ipus: int
    cluster_s: float
    workload: str
    outcome: str


def refund_holds(*, session: Session, refunds: Sequence[HoldRefund]) -> dict[int, int]:
    """Refund sessions' holds for time a platform fault wasted, as a batch job is refunded what the
    same fault wasted of it (billed only up to its last checkpoint). Each hold's attempt row is
    locked by the caller and still running.

    The wasted IPU-seconds become the hold's `unbilled_s` (in seconds of its whole partition), so
    the ticks still to come bill less and those already billed are refunded now; the quota the
    refunded ticks had consumed of the session's reservation is held again, as a refunded
    attempt's is. Returns the amount refunded by faulted attempt (positive IPU-milliseconds)."""
    done: dict[int, int] = {}
    by_tenant: dict[str, tuple[int, int]] = {}
    for r in refunds:
        hold = r.hold
        if r.cluster_s <= 0 or r.ipus <= 0 or hold.size <= 0:
            continue
        event_id = f"att:{r.attempt_id}:fault-refund"
        hold.unbilled_s = (hold.unbilled_s or 0.0) + r.cluster_s * r.ipus / hold.size
        amount = max(0, hold.metered_ipu_ms - _charged(hold, hold.cluster_s))
        row = {
            "id": event_id,
            "tenant_id": hold.tenant_id,
            "job_id": hold.job_id,
            "attempt_id": hold.id,
            "kind": "refund",
            "ipu_ms": -amount,
            "machine_type": hold.machine_type,
            "rate": _rate(hold),
            "raw_ipu_ms": -raw_ipu_ms(amount, _rate(hold)),
            "partition_size": r.ipus,
            "cluster_s": r.cluster_s,
            "workload": r.workload,
            "outcome": r.outcome,
            "at": utcnow(),
        }
        if event_id not in _insert_new(session, [row]):
            hold.unbilled_s -= r.cluster_s * r.ipus / hold.size  # refunded when it was first written
            continue
        held_again = min(amount, hold.reservation_used_ipu_ms)
        hold.metered_ipu_ms -= amount
        hold.reservation_used_ipu_ms -= held_again
        used, reserved = by_tenant.get(hold.tenant_id, (0, 0))
        by_tenant[hold.tenant_id] = (used - amount, reserved + held_again)
        done[r.attempt_id] = amount
    session.flush()
    for tenant_id in sorted(by_tenant):
        used, reserved = by_tenant[tenant_id]
        _move_counters(session, tenant_id, used, reserved, guard=False)
    return done
