"""Fleet figures for `/metrics`, read from the database at scrape time: IPUs per machine type (all,
free), machines by type and health, and how long jobs waited in the queue.

Free IPUs are those of live machines that are up, on an IPU that is up, and in no live partition:
what a new partition could take now. Queue waits are wall-clock seconds from a job's submission to
its first placement, recorded on its first attempt.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from scheduler.models import Attempt, Ipu, IpuAssignment, Machine

# Seconds; the last bucket of the histogram is +Inf.
QUEUE_WAIT_BUCKETS: tuple[float, ...] = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)


@dataclass(frozen=True)
class TypeIpus:
    total: int
    free: int


def ipus_by_type(session: Session) -> dict[str, TypeIpus]:
    live = Machine.retired_at.is_(None)
    totals = dict(
        session.execute(
            select(Machine.machine_type, func.count(Ipu.id))
            .join(Ipu, Ipu.machine_id == Machine.id)
            .where(live)
            .group_by(Machine.machine_type)
        )
        .tuples()
        .all()
    )
    free = dict(
        session.execute(
            select(Machine.machine_type, func.count(Ipu.id))
            .join(Ipu, Ipu.machine_id == Machine.id)
            .outerjoin(IpuAssignment, IpuAssignment.ipu_id == Ipu.id)
            .where(live, Machine.health == "up", Ipu.health == "up", IpuAssignment.ipu_id.is_(None))
            .group_by(Machine.machine_type)
        )
        .tuples()
        .all()
    )
    return {kind: TypeIpus(int(n), int(free.get(kind, 0))) for kind, n in sorted(totals.items())}


def machines_by_health(session: Session) -> dict[tuple[str, str], int]:
    """(machine type, health) -> live machines."""
    return {
        (kind, health): int(n)
        for kind, health, n in session.execute(
            select(Machine.machine_type, Machine.health, func.count())
            .where(Machine.retired_at.is_(None))
            .group_by(Machine.machine_type, Machine.health)
        ).tuples()
    }


@dataclass(frozen=True)
class WaitHistogram:
    buckets: tuple[tuple[float, int], ...]  # (upper bound, cumulative count), the last bound +Inf
    count: int
    total_s: float


def queue_wait_histogram(session: Session) -> WaitHistogram:
    """Jobs' waits from submission to first placement, as a cumulative histogram (one scan)."""
    first = and_(Attempt.number == 1, Attempt.queue_wait_s.is_not(None))
    columns = [func.count().filter(Attempt.queue_wait_s <= bound) for bound in QUEUE_WAIT_BUCKETS]
    row = session.execute(
        select(*columns, func.count(), func.coalesce(func.sum(Attempt.queue_wait_s), 0.0)).where(first)
    ).one()
    counts = [int(n) for n in row[: len(QUEUE_WAIT_BUCKETS)]]
    total = int(row[len(QUEUE_WAIT_BUCKETS)])
    buckets = (*zip(QUEUE_WAIT_BUCKETS, counts, strict=True), (float("inf"), total))
    return WaitHistogram(buckets=tuple(buckets), count=total, total_s=float(row[-1]))
