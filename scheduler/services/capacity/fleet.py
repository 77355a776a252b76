"""The fleet in the database: machines, IPUs, partitions and their live IPU assignments.

The database holds the truth; `vipu.Allocator` is the in-memory index that finds placements. A
placement is only real once its assignment rows are inserted: the primary key on
`ipu_assignments.ipu_id` refuses any IPU that some other live partition holds.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler import runtime
from scheduler.clock import UNSCALED, Clock
from scheduler.db import changed, insert_columns, insert_returning_keys
from scheduler.errors import Conflict, InvalidRequest, NotFound
from scheduler.models import Ipu, IpuAssignment, Job, Machine, Partition, utcnow
from scheduler.services.tenancy.scope import Scope, restrict
from vipu.allocator import AllocationConflict, Allocator, Placement
from vipu.machine_types import LAYOUTS, MACHINE_TYPE_NAMES, MAX_UNITS, SERVER_MODELS, get_machine
from vipu.topology import (
    Fleet,
    Health,
    MachineType,
    Unit,
    UnitGroup,
    machine_id,
    machine_of_ipu,
    parse_machine_id,
    parse_rack_id,
    parse_unit_id,
    pod_id,
    pod_ipu_ids,
    rack_id,
    server_id,
    server_ipu_ids,
)

MACHINE_TYPES = MACHINE_TYPE_NAMES
log = logging.getLogger("ipucloud.fleet")


class PlacementConflict(Exception):
    """The IPUs chosen are taken in the database (another process placed there first), or their
    machines left the fleet since the placement was chosen."""


# The fleet's shape as stored: one row per machine; a unit's rows share its index (`pod`).


def seed_fleet(*, session: Session, pods: int, machine_type: str = "m2000") -> int:
    """Make sure the fleet has at least `pods` POD64s of `machine_type`; add the missing ones.
    Returns pods added."""
    if machine_type not in MACHINE_TYPES or "pod64" not in get_machine(machine_type).layouts:
        names = ", ".join(t for t in MACHINE_TYPES if "pod64" in get_machine(t).layouts)
        raise InvalidRequest(f"POD64s are of machine type {names}")
    return ensure_fleet(session=session, groups=[UnitGroup(MachineType(machine_type), "pod64", pods)])


def ensure_fleet(*, session: Session, groups: Sequence[UnitGroup]) -> int:
    """Make sure the fleet has at least each group's count of live units of that type, layout and
    model; add what is missing (never retires). Returns units added."""
    have: dict[tuple[str, str, str | None], int] = {}
    for kind, layout, model, n in session.execute(
        select(Machine.machine_type, Machine.layout, Machine.model, func.count())
        .where(Machine.slot == 0, Machine.retired_at.is_(None))
        .group_by(Machine.machine_type, Machine.layout, Machine.model)
    ).tuples():
        have[(kind, layout, model)] = int(n)
    added = 0
    for group in groups:
        key = (group.machine_type.value, group.layout, group.model)
        missing = max(0, group.count - have.get(key, 0))
        if missing:
            added += len(add_units(session=session, group=replace(group, count=missing)))
            have[key] = group.count
    return added


def add_pods(*, session: Session, count: int, machine_type: str) -> int:
    if count < 0 or machine_type not in MACHINE_TYPES:
        raise InvalidRequest(f"count must be >= 0 and machine type one of {MACHINE_TYPES}")
    if count == 0:
        return 0
    return len(add_units(session=session, group=UnitGroup(MachineType(machine_type), "pod64", count)))


def _next_indices(session: Session) -> tuple[int, int]:
    """The next unit index and rack index: retired ones are never reused, so old ids stay unique."""
    unit, rack = session.execute(
        select(func.coalesce(func.max(Machine.pod) + 1, 0), func.coalesce(func.max(Machine.rack) + 1, 0))
    ).one()
    return int(unit), int(rack)


def add_units(*, session: Session, group: UnitGroup, new_rack: bool = False) -> list[int]:
    """Add `group.count` units. They fill the fleet's last rack while it holds live units of their
    layout and has room (two POD64s, one POD16, eight servers), then new racks; `new_rack` starts
    one at once (an admin adding a rack). Returns the new unit indices."""
    layout = LAYOUTS[group.layout]
    Unit(group.machine_type, group.layout, 0, group.model)  # checks type, layout and model agree
    first, next_rack = _next_indices(session)
    if first + group.count > MAX_UNITS:
        raise InvalidRequest(
            f"A fleet holds at most {MAX_UNITS:,} PODs and servers (retired ones keep their numbers); "
            f"{first:,} are numbered already."
        )
    rack: int | None = None  # the rack being filled; None: the first unit opens a new one
    filled = 0
    if not new_rack and next_rack:
        rows = session.execute(
            select(Machine.layout, func.count())
            .where(Machine.rack == next_rack - 1, Machine.slot == 0, Machine.retired_at.is_(None))
            .group_by(Machine.layout)
        ).all()
        if len(rows) == 1 and rows[0][0] == group.layout:
            rack, filled = next_rack - 1, int(rows[0][1])
    runtime.current().capacity.forget()
    machines: list[dict[str, object]] = []
    ipus: list[dict[str, object]] = []
    now = utcnow()
    added = []
    for unit in range(first, first + group.count):
        if rack is None or filled >= layout.per_rack:
            rack, next_rack, filled = next_rack, next_rack + 1, 0
        filled += 1
        added.append(unit)
        for slot in range(layout.machines):
            mid = server_id(unit) if layout.name == "server" else machine_id(unit, slot)
            machines.append(
                dict(
                    id=mid,
                    pod=unit,
                    rack=rack,
                    slot=slot,
                    machine_type=group.machine_type.value,
                    layout=group.layout,
                    model=group.model,
                    health="up",
                    updated_at=now,
                    retired_at=None,
                )
            )
            for i in range(layout.ipus_per_machine):
                pos = slot * layout.ipus_per_machine + i
                iid = server_ipu_ids(unit)[i] if layout.name == "server" else pod_ipu_ids(unit)[pos]
                ipus.append(dict(id=iid, machine_id=mid, position=pos, health="up"))
    try:
        with session.begin_nested():
            for chunk in range(0, len(machines), 2000):
                session.execute(insert(Machine), machines[chunk : chunk + 2000])
            for chunk in range(0, len(ipus), 5000):
                session.execute(insert(Ipu), ipus[chunk : chunk + 5000])
    except IntegrityError:
        # Another admin's addition took these numbers first (both read the same next index).
        raise Conflict("The fleet changed while these units were added; retry.")
    return added


def add_rack(*, session: Session, machine_type: str, layout: str, units: int = 1) -> int:
    """A new rack of `units` PODs (a rack holds at most two POD64s, or one POD16). Returns its index."""
    if machine_type not in MACHINE_TYPES:
        raise InvalidRequest(f"machine type must be one of {', '.join(MACHINE_TYPES)}")
    spec = get_machine(machine_type)
    if layout not in spec.layouts or layout == "server":
        pods = [name for name in spec.layouts if name != "server"]
        raise InvalidRequest(
            f"{machine_type} racks are {', '.join(pods)}"
            if pods
            else f"{machine_type} comes in servers: add servers"
        )
    most = LAYOUTS[layout].per_rack
    if not 1 <= units <= most:
        raise InvalidRequest(f"a rack holds 1 to {most} {LAYOUTS[layout].label}s")
    added = add_units(
        session=session, group=UnitGroup(MachineType(machine_type), layout, units), new_rack=True
    )
    return int(session.execute(select(Machine.rack).where(Machine.pod == added[0]).limit(1)).scalar_one())


def add_servers(*, session: Session, model: str, count: int = 1) -> list[int]:
    """Add `count` IPU servers of `model`, filling the last server rack first. Returns their indices."""
    kinds = [kind for kind in MachineType if model in get_machine(kind).models]
    if not kinds:
        raise InvalidRequest(f"server model must be one of {', '.join(SERVER_MODELS)}")
    if not 1 <= count <= 64:
        raise InvalidRequest("add 1 to 64 servers at a time")
    return add_units(session=session, group=UnitGroup(kinds[0], "server", count, model))


def _live_units(session: Session, where: Any) -> dict[int, list[Machine]]:
    machines = session.execute(
        select(Machine)
        .where(where, Machine.retired_at.is_(None))
        .order_by(Machine.pod, Machine.slot)
        .with_for_update()
    ).scalars()
    units: dict[int, list[Machine]] = {}
    for m in machines:
        units.setdefault(m.pod, []).append(m)
    return units


def retire(*, session: Session, rack: int | None = None, unit: int | None = None) -> list[str]:
    """Take a rack (all its units) or one unit out of the fleet for good. Its machines must be drained
    (or failed) first and no live partition may hold any of its IPUs: nothing running is stranded.
    Returns the retired units' ids."""
    where = Machine.rack == rack if rack is not None else Machine.pod == unit
    what = rack_id(rack) if rack is not None else f"unit {unit}"
    # Locking the rows first: a placement that checks these machines (_check_machines_live) either
    # committed before (its assignments are seen below) or waits and then sees them retired.
    units = _live_units(session, where)
    if not units:
        raise NotFound(f"No {what} in the fleet.")
    names = {pod: (server_id(pod) if ms[0].layout == "server" else pod_id(pod)) for pod, ms in units.items()}
    up = [m.id for ms in units.values() for m in ms if m.health == "up"]
    if up:
        raise Conflict(
            f"Drain {what} first: {len(up)} machine(s) are up ({', '.join(up[:4])}"
            + (", ..." if len(up) > 4 else "")
            + "); drained machines finish what they run and take nothing new.",
            machines_up=up[:100],
        )
    machine_ids = [m.id for ms in units.values() for m in ms]
    held = sorted(
        set(
            session.execute(
                select(Partition.name)
                .join(IpuAssignment, IpuAssignment.partition_pk == Partition.pk)
                .join(Ipu, Ipu.id == IpuAssignment.ipu_id)
                .where(Ipu.machine_id.in_(machine_ids))
            ).scalars()
        )
    )
    if held:
        raise Conflict(
            f"{what} still holds live partitions ({', '.join(held[:5])}"
            + (", ..." if len(held) > 5 else "")
            + "); wait for their jobs to end, or remove them, before retiring it.",
            partitions=held[:100],
        )
    runtime.current().capacity.forget()
    now = utcnow()
    session.execute(update(Machine).where(Machine.id.in_(machine_ids)).values(retired_at=now, updated_at=now))
    return [names[pod] for pod in sorted(units)]


def parse_unit(text: str) -> int:
    """A POD's or a server's id -> its index, as a 404 when malformed."""
    try:
        return parse_unit_id(text)
    except ValueError as exc:
        raise NotFound(f"No unit {text!r}: {exc}")


def fleet_shape(*, session: Session) -> Fleet:
    """The fleet as the allocator sees it: every unit ever added, retired ones as gaps."""
    rows = session.execute(
        select(
            Machine.pod, Machine.machine_type, Machine.layout, Machine.model, Machine.rack, Machine.retired_at
        )
        .where(Machine.slot == 0)
        .order_by(Machine.pod)
    ).all()
    units: list[Unit | None] = [None] * (rows[-1][0] + 1 if rows else 0)
    for pod, kind, layout, model, rack, retired in rows:
        if retired is None:
            units[pod] = Unit(MachineType(kind), layout, rack, model)
    return Fleet(units)


PODS_CACHE_S = 5.0


def largest_by_type(*, session: Session, max_age_s: float = 0.0) -> dict[str, int]:
    """The largest partition each machine type present can form: whole POD64s (a power of two of
    them), else its largest unit. Admission may accept an answer `max_age_s` old: units are added
    rarely, and the answer only bounds the largest partition a job may ask for.

    The answer is kept in the process's runtime (scheduler/runtime.py), which adding and retiring
    units forget: admission reaches it from deep inside a submission's transaction."""
    cache = runtime.current().capacity
    if max_age_s > 0:
        cached = cache.get(max_age_s)
        if cached is not None:
            return cached
    units: dict[str, dict[str, int]] = {}
    for kind, layout, n in session.execute(
        select(Machine.machine_type, Machine.layout, func.count())
        .where(Machine.slot == 0, Machine.retired_at.is_(None))
        .group_by(Machine.machine_type, Machine.layout)
    ).tuples():
        units.setdefault(kind, {})[layout] = int(n)
    largest: dict[str, int] = {}
    for kind, layouts in units.items():
        best = 0
        for layout, n in layouts.items():
            spec = LAYOUTS[layout]
            best = max(best, spec.ipus * (1 << (n.bit_length() - 1)) if spec.joins else spec.ipus)
        largest[kind] = best
    cache.put(largest)
    return dict(largest)


def pods_by_type(*, session: Session, max_age_s: float = 0.0) -> dict[str, int]:
    """The largest partition per machine type (`largest_by_type`), under its former name."""
    return largest_by_type(session=session, max_age_s=max_age_s)


def check_fleet_can_ever_host(
    *, session: Session, size: int, machine_type: str | None, pods: dict[str, int] | None = None
) -> None:
    """Refuse at once a size no partition of this fleet could ever have, whatever it is running.

    `pods` (from `largest_by_type`) spares the query when a caller checks many jobs at once."""
    if pods is None:
        pods = largest_by_type(session=session)
    largest = pods.get(machine_type, 0) if machine_type else max(pods.values(), default=0)
    if size > largest:
        kind = f"{machine_type} " if machine_type else ""
        raise InvalidRequest(
            f"A partition of {size} IPUs is larger than any this fleet can form "
            f"(largest {kind}partition: {largest} IPUs).",
            largest=largest,
        )


# An IPU id's machine, remembered: a pass placing 5,000 jobs at the seeds' scale names some 37,000 IPUs,
# and parsing each id anew (a regular expression and range checks) was 0.2 s of the pass's CPU. A pure
# function of the id, so nothing invalidates it; a fleet has at most MAX_UNITS x 64 IPUs.
_machine_of = functools.lru_cache(maxsize=MAX_UNITS * 64)(machine_of_ipu)


def _check_machines_live(session: Session, ipu_ids: Iterable[str]) -> None:
    """Refuse a placement on machines retired since it was chosen. The rows are read FOR SHARE, so a
    retirement in flight either committed (seen here) or waits for this placement and then finds its
    partition (`retire` refuses)."""
    machines = sorted({_machine_of(ipu) for ipu in ipu_ids})
    for chunk in range(0, len(machines), 1000):
        wanted = machines[chunk : chunk + 1000]
        rows = session.execute(
            select(Machine.id, Machine.retired_at).where(Machine.id.in_(wanted)).with_for_update(read=True)
        ).all()
        gone = sorted(set(wanted) - {mid for mid, retired in rows if retired is None})
        if gone:
            raise PlacementConflict(f"machine(s) {', '.join(gone[:4])} left the fleet")


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
    # A job partition's expected end (the placement policy's time hint) is its start plus its
    # predicted run time (cluster seconds), on the wall clock the planners use.
    clock: Clock = UNSCALED

    def refresh(self, session: Session) -> Allocator:
        shape = fleet_shape(session=session)
        if self.allocator is None or shape != self.fleet:
            self.fleet = shape
            self.allocator = Allocator(shape, policy=self.policy)
            self.known = {}
            self.health_seen = {}
        alloc = self.allocator
        health = dict(
            session.execute(
                select(Machine.id, Machine.health).where(Machine.health != "up", Machine.retired_at.is_(None))
            )
            .tuples()
            .all()
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
                    end = None if predicted is None else created.timestamp() + self.clock.to_wall(predicted)
                    try:
                        alloc.occupy(name, ipu_ids, expected_end=end)
                    except AllocationConflict as exc:
                        # Only possible for rows written around the database's guards (retire checks
                        # for live partitions, placements for retired machines): keep scheduling
                        # the rest of the fleet rather than stop every pass on it.
                        log.error("live partition %s cannot be registered: %s", name, exc)
                    self.known[pk] = name
        return alloc

    def invalidate(self) -> None:
        self.allocator = None


class Allocators:
    """The admin partition verbs' allocators (one per placement policy), kept in step with the
    database incrementally (`AllocatorSync`). `lock` serialises their use: an allocator is not
    thread-safe, and the API serves admin requests from a thread pool. `clock` is the runtime's,
    so their time hints are the scheduler's (a hint at another scale places differently)."""

    def __init__(self, clock: Clock = UNSCALED) -> None:
        self.lock = threading.Lock()
        self.clock = clock
        self._syncs: dict[str, AllocatorSync] = {}

    def sync(self, policy: str) -> AllocatorSync:
        """The sync for `policy` (call with `lock` held)."""
        sync = self._syncs.get(policy)
        if sync is None:
            sync = self._syncs[policy] = AllocatorSync(policy, clock=self.clock)
        return sync


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
            _check_machines_live(session, placement.ipu_ids)
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
    rows: list[dict[str, Any]] = [
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
            _check_machines_live(session, (i for row in rows for i in row["ipu_ids"]))
            # Batched, keys in the order given: a pass that starts thousands of jobs skips the
            # ORM's per-object bookkeeping for rows it only writes.
            pks = insert_returning_keys(session, table, rows)
            parts = [
                NewPartition(pk, row["name"], row["size"], row["machine_type"], row["ipu_ids"], row["job_id"])
                for pk, row in zip(pks, rows, strict=True)
            ]
            # Tens of thousands of two-column rows at scale: one statement (db.insert_columns).
            insert_columns(
                session,
                IpuAssignment.__table__,
                {
                    "ipu_id": [i for part in parts for i in part.ipu_ids],
                    "partition_pk": [part.pk for part in parts for _ in part.ipu_ids],
                },
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
    done = changed(
        session,
        update(Partition)
        .where(Partition.pk == partition.pk, Partition.released_at.is_(None))
        .values(released_at=utcnow()),
    )
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
    if row is None or row.retired_at is not None:
        raise NotFound(f"No machine {machine!r}" + (" (it was retired)." if row is not None else "."))
    if health not in ("up", "draining", "failed"):
        raise InvalidRequest("health must be up, draining or failed")
    row.health = health
    row.health_reason = reason
    row.updated_at = utcnow()
    session.execute(update(Ipu).where(Ipu.machine_id == machine).values(health=health))
    session.flush()
    return row


def list_machines(*, session: Session, pod: int | None = None) -> Sequence[Machine]:
    stmt = select(Machine).where(Machine.retired_at.is_(None)).order_by(Machine.pod, Machine.slot)
    if pod is not None:
        stmt = stmt.where(Machine.pod == pod)
    return list(session.execute(stmt).scalars())


def machines_not_up(*, session: Session, limit: int = 1000) -> Sequence[Machine]:
    """Draining and failed machines, anywhere in the fleet (a page of the map shows only some pods)."""
    stmt = (
        select(Machine)
        .where(Machine.health != "up", Machine.retired_at.is_(None))
        .order_by(Machine.pod, Machine.slot)
        .limit(limit)
    )
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


def unit_name(pod: int, layout: str) -> str:
    return server_id(pod) if layout == "server" else pod_id(pod)


class RackUnitView(TypedDict):
    """A unit of a rack (a POD or an IPU server) and how many of its machines are in each health."""

    id: str
    index: int
    machine_type: str
    layout: str
    model: str | None
    ipus: int
    machines: dict[str, int]


class RackView(TypedDict):
    """A live rack: its units, their IPUs, and whether every machine is out of service."""

    id: str
    index: int
    units: list[RackUnitView]
    ipus: int
    drained: bool


def racks(*, session: Session) -> list[RackView]:
    """The live racks: each with its units (PODs and servers) and their machines' health."""
    rows = session.execute(
        select(Machine.rack, Machine.pod, Machine.machine_type, Machine.layout, Machine.model, Machine.health)
        .where(Machine.retired_at.is_(None))
        .order_by(Machine.rack, Machine.pod, Machine.slot)
    ).all()
    by_rack: dict[int, dict[int, RackUnitView]] = {}
    for rack, pod, kind, layout, model, health in rows:
        units = by_rack.setdefault(rack, {})
        unit = units.get(pod)
        if unit is None:
            unit = units[pod] = {
                "id": unit_name(pod, layout),
                "index": pod,
                "machine_type": kind,
                "layout": layout,
                "model": model,
                "ipus": LAYOUTS[layout].ipus,
                "machines": {"up": 0, "draining": 0, "failed": 0},
            }
        unit["machines"][health] = unit["machines"].get(health, 0) + 1
    return [
        {
            "id": rack_id(rack),
            "index": rack,
            "units": list(units.values()),
            "ipus": sum(u["ipus"] for u in units.values()),
            "drained": all(u["machines"]["up"] == 0 for u in units.values()),
        }
        for rack, units in sorted(by_rack.items())
    ]


def parse_rack(text: str) -> int:
    try:
        return parse_rack_id(text)
    except ValueError as exc:
        raise NotFound(f"No rack {text!r}: {exc}")


def drain_rack(*, session: Session, rack: int, health: str, reason: str | None) -> list[str]:
    """Drain (or restore) every machine of a rack; returns the machine ids."""
    ids = list(
        session.execute(
            select(Machine.id).where(Machine.rack == rack, Machine.retired_at.is_(None)).order_by(Machine.id)
        ).scalars()
    )
    if not ids:
        raise NotFound(f"No {rack_id(rack)} in the fleet.")
    for machine in ids:
        set_machine_health(session=session, machine=machine, health=health, reason=reason)
    return ids


@dataclass(frozen=True)
class TypeCapacity:
    machine_type: str
    total_ipus: int
    free_ipus: int
    largest_free: int


def capacity(*, session: Session, allocator: Allocator) -> list[TypeCapacity]:
    """Per machine type present: IPUs in all, free (healthy and in no partition), largest partition
    that could form now."""
    fleet = allocator.fleet
    out = []
    for kind in fleet.machine_types:
        total = sum(fleet.layout_of(pod).ipus for pod in fleet.pods_of_type(kind))
        out.append(TypeCapacity(kind.value, total, allocator.free_ipus(kind), allocator.largest_free(kind)))
    return out
