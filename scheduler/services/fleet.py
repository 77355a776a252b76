"""The fleet in the database: machines, IPUs, partitions and their live IPU assignments.

The database holds the truth; `vipu.Allocator` is the in-memory index that finds placements. A
placement is only real once its assignment rows are inserted: the primary key on
`ipu_assignments.ipu_id` refuses any IPU that some other live partition holds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.db import insert_returning_keys
from scheduler.errors import Conflict, InvalidRequest, NotFound
from scheduler.models import Ipu, IpuAssignment, Job, Machine, Partition, utcnow
from scheduler.services.scope import Scope, restrict
from vipu.allocator import Allocator, Placement
from vipu.topology import Fleet, Health, MachineType, machine_id, parse_machine_id, pod_ipu_ids

MACHINE_TYPES = tuple(t.value for t in MachineType)


class PlacementConflict(Exception):
    """The IPUs chosen are taken in the database (another process placed there first)."""


def seed_fleet(*, session: Session, pods: int, machine_type: str = "m2000") -> int:
    """Make sure the fleet has at least `pods` POD64s; add the missing ones. Returns pods added."""
    if machine_type not in MACHINE_TYPES:
        raise InvalidRequest(f"machine type must be one of {MACHINE_TYPES}")
    have = session.execute(select(func.count(func.distinct(Machine.pod)))).scalar_one()
    return add_pods(session=session, count=max(0, pods - have), machine_type=machine_type)


def add_pods(*, session: Session, count: int, machine_type: str) -> int:
    if count < 0 or machine_type not in MACHINE_TYPES:
        raise InvalidRequest(f"count must be >= 0 and machine type one of {MACHINE_TYPES}")
    global _pods_cache
    _pods_cache = None
    first = session.execute(select(func.coalesce(func.max(Machine.pod) + 1, 0))).scalar_one()
    if first + count > 1024:
        raise InvalidRequest("A fleet holds at most 1,024 POD64s (65,536 IPUs).")
    machines: list[dict[str, object]] = []
    ipus: list[dict[str, object]] = []
    now = utcnow()
    for pod in range(first, first + count):
        ids = pod_ipu_ids(pod)
        for slot in range(16):
            mid = machine_id(pod, slot)
            machines.append(
                dict(
                    id=mid,
                    pod=pod,
                    rack=pod // 2,
                    slot=slot,
                    machine_type=machine_type,
                    health="up",
                    updated_at=now,
                )
            )
            for i in range(4):
                pos = slot * 4 + i
                ipus.append(dict(id=ids[pos], machine_id=mid, position=pos, health="up"))
    if machines:
        for chunk in range(0, len(machines), 2000):
            session.execute(insert(Machine), machines[chunk : chunk + 2000])
        for chunk in range(0, len(ipus), 5000):
            session.execute(insert(Ipu), ipus[chunk : chunk + 5000])
    return count


def fleet_shape(*, session: Session) -> Fleet:
    rows = session.execute(
        select(Machine.pod, Machine.machine_type).where(Machine.slot == 0).order_by(Machine.pod)
    ).all()
    return Fleet([MachineType(t) for _, t in rows])


_pods_cache: tuple[float, dict[str, int]] | None = None
PODS_CACHE_S = 5.0


def pods_by_type(*, session: Session, max_age_s: float = 0.0) -> dict[str, int]:
    """POD64s per machine type. Admission may accept an answer `max_age_s` old: racks are added
    rarely, and the answer only bounds the largest partition a job may ask for."""
    global _pods_cache
    now = time.monotonic()
    if max_age_s > 0 and _pods_cache is not None and now - _pods_cache[0] < max_age_s:
        return dict(_pods_cache[1])
    stmt = select(Machine.machine_type, func.count()).where(Machine.slot == 0).group_by(Machine.machine_type)
    pods = dict(session.execute(stmt).tuples().all())
    _pods_cache = (now, pods)
    return dict(pods)


def check_fleet_can_ever_host(
    *, session: Session, size: int, machine_type: str | None, pods: dict[str, int] | None = None
) -> None:
    """Refuse at once a size no partition of this fleet could ever have, whatever it is running.

    `pods` (from `pods_by_type`) spares the query when a caller checks many jobs at once."""
    if pods is None:
        pods = pods_by_type(session=session)
    have = pods.get(machine_type, 0) if machine_type else max(pods.values(), default=0)
    largest = 64 if have else 0
    if have > 1:
        largest = 64 * (1 << (have.bit_length() - 1))
    if size > largest:
        kind = f"{machine_type} " if machine_type else ""
        raise InvalidRequest(
            f"A partition of {size} IPUs is larger than any this fleet can form "
            f"(largest {kind}partition: {largest} IPUs).",
            largest=largest,
        )


@dataclass
class AllocatorSync:
    """An allocator kept in step with the database by cheap incremental reads.

    Live partitions are diffed by primary key and unhealthy machines by id, so a pass costs a few
    indexed queries when nothing changed rather than a reload of the fleet. (Health is kept per
    machine: the admin verbs drain, fail and restore whole machines, and their IPUs follow.)
    """

    policy: str
    allocator: Allocator | None = None
    fleet: Fleet | None = None
    known: dict[int, str] = field(default_factory=dict)  # partition pk -> name
    health_seen: dict[str, str] = field(default_factory=dict)
    # Cluster seconds per wall second: a job partition's expected end (the placement policy's
    # time hint) is its start plus its predicted run time, on the wall clock the planners use.
    time_scale: float = 1.0

    def refresh(self, session: Session) -> Allocator:
        shape = fleet_shape(session=session)
        if self.allocator is None or shape != self.fleet:
            self.fleet = shape
            self.allocator = Allocator(shape, policy=self.policy)
            self.known = {}
            self.health_seen = {}
        alloc = self.allocator
        health = dict(
            session.execute(select(Machine.id, Machine.health).where(Machine.health != "up")).tuples().all()
        )
        for mid in set(self.health_seen) - set(health):
            alloc.set_machine_health(mid, Health.UP)
        for mid, h in health.items():
            if self.health_seen.get(mid) != h:
                alloc.set_machine_health(mid, Health(h))
        self.health_seen = health
        live = dict(
            session.execute(select(Partition.pk, Partition.name).where(Partition.released_at.is_(None)))
            .tuples()
            .all()
        )
        # A name that changed under a known key is a row we registered, saw roll back, and whose key
        # SQLite handed to someone else's partition (it reuses the highest rowid): drop ours too.
        for pk in [pk for pk, name in self.known.items() if live.get(pk) != name]:
            alloc.release(self.known.pop(pk))
        new = [pk for pk in live if pk not in self.known]
        if new:
            for chunk in range(0, len(new), 1000):
                rows = session.execute(
                    select(
                        Partition.pk,
                        Partition.name,
                        Partition.ipu_ids,
                        Partition.created_at,
                        Job.predicted_runtime_s,
                    )
                    .outerjoin(Job, Job.id == Partition.job_id)
                    .where(Partition.pk.in_(new[chunk : chunk + 1000]))
                ).tuples()
                for pk, name, ipu_ids, created, predicted in rows:
                    end = None if predicted is None else created.timestamp() + predicted / self.time_scale
                    alloc.occupy(name, ipu_ids, expected_end=end)
                    self.known[pk] = name
        return alloc

    def invalidate(self) -> None:
        self.allocator = None


def load_allocator(*, session: Session, policy: str = "default") -> Allocator:
    return AllocatorSync(policy).refresh(session)


def insert_partition(
    *,
    session: Session,
    name: str,
    kind: str,
    placement: Placement,
    tenant_id: str | None,
    job_id: str | None = None,
    gcds: int = 1,
    reconfigurable: bool = False,
    created_by: str | None = None,
) -> Partition:
    """Make a placement real. Raises PlacementConflict if any IPU is already assigned."""
    part = Partition(
        name=name,
        kind=kind,
        size=placement.size,
        machine_type=str(placement.machine_type),
        gcds=gcds,
        reconfigurable=reconfigurable,
        tenant_id=tenant_id,
        job_id=job_id,
        ipu_ids=list(placement.ipu_ids),
        created_by=created_by,
        created_at=utcnow(),
    )
    try:
        with session.begin_nested():
            session.add(part)
            session.flush()
            session.execute(
                insert(IpuAssignment), [{"ipu_id": i, "partition_pk": part.pk} for i in placement.ipu_ids]
            )
    except IntegrityError as exc:
        raise PlacementConflict(str(exc.orig)) from exc
    return part


def insert_job_partitions(
    *, session: Session, placements: Sequence[tuple[Placement, str, str]]
) -> list[NewPartition]:
    """`insert_partition` for many job partitions ((placement, tenant, job) each) in one savepoint
    and a few batched statements. Raises PlacementConflict, inserting none, if any IPU is taken."""
    now = utcnow()
    rows = [
        {
            "name": placement.partition_id,
            "kind": "job",
            "size": placement.size,
            "machine_type": str(placement.machine_type),
            "gcds": 1,
            "reconfigurable": False,
            "tenant_id": tenant_id,
            "job_id": job_id,
            "ipu_ids": list(placement.ipu_ids),
            "created_by": None,
            "created_at": now,
            "released_at": None,
        }
        for placement, tenant_id, job_id in placements
    ]
    table = Partition.__table__
    try:
        with session.begin_nested():
            # Batched, keys in the order given: a pass that starts thousands of jobs skips the
            # ORM's per-object bookkeeping for rows it only writes.
            pks = insert_returning_keys(session, table, rows)
            parts = [
                NewPartition(pk, row["name"], row["size"], row["machine_type"], row["ipu_ids"], row["job_id"])
                for pk, row in zip(pks, rows, strict=True)
            ]
            session.execute(
                insert(IpuAssignment.__table__),
                [{"ipu_id": i, "partition_pk": part.pk} for part in parts for i in part.ipu_ids],
            )
    except IntegrityError as exc:
        raise PlacementConflict(str(exc.orig)) from exc
    return parts


@dataclass(frozen=True)
class NewPartition:
    """A job partition just written by `insert_job_partitions` (what placing its attempt needs)."""

    pk: int
    name: str
    size: int
    machine_type: str
    ipu_ids: list[str]
    job_id: str
    gcds: int = 1


def release_partition(*, session: Session, partition: Partition) -> bool:
    """Free a partition's IPUs. Returns False if it was already released (safe to call twice)."""
    done = session.execute(
        update(Partition)
        .where(Partition.pk == partition.pk, Partition.released_at.is_(None))
        .values(released_at=utcnow())
    ).rowcount
    session.execute(delete(IpuAssignment).where(IpuAssignment.partition_pk == partition.pk))
    if done != 1:
        # Released by someone else: what this session holds of it may be out of date. (When this
        # call released it, the UPDATE already set `released_at` on the object.)
        session.refresh(partition)
    return done == 1


def release_job_partition(*, session: Session, partition_pk: int) -> bool:
    """Free a job's partition when its attempt ends, without loading it (a reserved partition
    outlives its jobs and is left alone). False if there was nothing to release."""
    return bool(release_job_partitions(session=session, partition_pks=[partition_pk]))


def release_job_partitions(*, session: Session, partition_pks: Sequence[int]) -> set[int]:
    """`release_job_partition` for many at once, in two statements; returns those released."""
    if not partition_pks:
        return set()
    released = set(
        session.execute(
            update(Partition)
            .where(
                Partition.pk.in_(sorted(set(partition_pks))),
                Partition.kind == "job",
                Partition.released_at.is_(None),
            )
            .values(released_at=utcnow())
            .returning(Partition.pk)
            .execution_options(synchronize_session="evaluate")  # a loaded Partition learns it in memory
        ).scalars()
    )
    if released:
        session.execute(delete(IpuAssignment).where(IpuAssignment.partition_pk.in_(sorted(released))))
    return released


def get_live_partition(*, session: Session, name: str) -> Partition | None:
    return session.execute(
        select(Partition).where(Partition.name == name, Partition.released_at.is_(None))
    ).scalar_one_or_none()


def list_partitions(
    *,
    session: Session,
    scope: Scope,
    after: int | None = None,
    limit: int = 100,
    include_released: bool = False,
) -> list[Partition]:
    """Partitions by creation; a tenant's scope holds the partitions reserved for it."""
    stmt = restrict(select(Partition).order_by(Partition.pk).limit(limit), Partition.tenant_id, scope)
    if not include_released:
        stmt = stmt.where(Partition.released_at.is_(None))
    if after is not None:
        stmt = stmt.where(Partition.pk > after)
    return list(session.execute(stmt).scalars())


def set_machine_health(*, session: Session, machine: str, health: str, reason: str | None) -> Machine:
    try:
        parse_machine_id(machine)
    except ValueError as exc:
        raise NotFound(f"No machine {machine!r}: {exc}")
    row = session.get(Machine, machine)
    if row is None:
        raise NotFound(f"No machine {machine!r}.")
    if health not in ("up", "draining", "failed"):
        raise InvalidRequest("health must be up, draining or failed")
    row.health = health
    row.health_reason = reason
    row.updated_at = utcnow()
    session.execute(update(Ipu).where(Ipu.machine_id == machine).values(health=health))
    session.flush()
    return row


def list_machines(*, session: Session, pod: int | None = None) -> Sequence[Machine]:
    stmt = select(Machine).order_by(Machine.pod, Machine.slot)
    if pod is not None:
        stmt = stmt.where(Machine.pod == pod)
    return list(session.execute(stmt).scalars())


def machines_not_up(*, session: Session, limit: int = 1000) -> Sequence[Machine]:
    """Draining and failed machines, anywhere in the fleet (a page of the map shows only some pods)."""
    stmt = select(Machine).where(Machine.health != "up").order_by(Machine.pod, Machine.slot).limit(limit)
    return list(session.execute(stmt).scalars())


def assignment_count(*, session: Session) -> int:
    return session.execute(select(func.count()).select_from(IpuAssignment)).scalar_one()


def ensure_no_overlap(*, session: Session) -> None:
    """Raise Conflict if the live partitions' IPU lists overlap (a checker for tests and admins)."""
    seen: dict[str, str] = {}
    for name, ipus in session.execute(
        select(Partition.name, Partition.ipu_ids).where(Partition.released_at.is_(None))
    ).tuples():
        for i in ipus:
            if i in seen:
                raise Conflict(f"IPU {i} is in live partitions {seen[i]} and {name}")
            seen[i] = name
