"""Admin partitions with V-IPU's verbs: create, list, get, remove, reset; the fleet view.

Placement goes through the same allocator as the scheduler; the database's unique index on
live IPU assignments decides races between processes, and a loser retries on fresh state.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NotRequired, TypedDict

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.errors import Conflict, InvalidRequest, NoCapacity, NotFound
from scheduler.models import Attempt, AttemptState, Machine, Partition, Tenant
from scheduler.services.batch import attempts as attempt_service
from scheduler.services.capacity import fleet
from vipu.machine_types import LAYOUTS
from vipu.partitions import PartitionRuleError, check_gcds, check_size
from vipu.topology import rack_id


def _allocator(allocators: fleet.Allocators, session: Session, policy: str) -> Any:
    sync = allocators.sync(policy)
    return sync, sync.refresh(session)


def create_partition(
    *,
    session: Session,
    name: str,
    size: int,
    machine_type: str | None,
    tenant_id: str | None,
    gcds: int = 1,
    reconfigurable: bool = False,
    created_by: str | None = None,
    policy: str = "default",
    allocators: fleet.Allocators | None = None,
) -> Partition:
    """Carve a partition now (reserved for `tenant_id` when given), or raise NoCapacity (409).

    `allocators`: the process's (its runtime's), kept in step between calls; without them the
    allocator is loaded afresh from the database."""
    allocators = allocators or fleet.Allocators()
    try:
        check_size(size)
        check_gcds(size, gcds)
    except PartitionRuleError as exc:
        raise InvalidRequest(str(exc))
    if tenant_id is not None and session.get(Tenant, tenant_id) is None:
        raise NotFound(f"No tenant {tenant_id}.")
    if fleet.get_live_partition(session=session, name=name) is not None:
        raise Conflict(f"A partition named {name!r} already exists.")
    fleet.check_fleet_can_ever_host(session=session, size=size, machine_type=machine_type)
    for _ in range(5):
        with allocators.lock:
            sync, alloc = _allocator(allocators, session, policy)
            placement = alloc.find(size, machine_type=machine_type)
            if placement is None:
                largest = alloc.largest_free(machine_type)
                raise NoCapacity(
                    f"No free, healthy, link-connected {size}-IPU partition"
                    + (f" of {machine_type}" if machine_type else "")
                    + f" right now (largest free: {largest}).",
                    largest_free=largest,
                )
            try:
                part = fleet.insert_partition(
                    session=session,
                    name=name,
                    kind="reserved",
                    placement=placement,
                    tenant_id=tenant_id,
                    gcds=gcds,
                    reconfigurable=reconfigurable,
                    created_by=created_by,
                )
            except fleet.PlacementConflict:
                # The unique index on live names refuses the same way as the one on IPUs. A create of
                # this name that committed while we waited on it is final: retrying cannot help.
                if fleet.get_live_partition(session=session, name=name) is not None:
                    raise Conflict(f"A partition named {name!r} already exists.")
                # Another process holds those IPUs; by the time the database said so, it has
                # committed, so a refresh sees it and the next try places elsewhere.
                sync.invalidate()
                continue
            # Registered at once so that this process's other requests place around it; if this
            # transaction rolls back, the next refresh finds the row gone and frees it again.
            alloc.observe_request(size)
            alloc.occupy(name, placement.ipu_ids)
            sync.known[part.pk] = name
            return part
    raise Conflict("The fleet is changing too fast to place this partition; retry.")


def get_partition(*, session: Session, name: str) -> Partition:
    part = fleet.get_live_partition(session=session, name=name)
    if part is None:
        raise NotFound(f"No live partition {name!r}.")
    return part


def _live_attempts(session: Session, part: Partition) -> list[Attempt]:
    return list(
        session.execute(
            select(Attempt)
            .where(
                Attempt.partition_pk == part.pk,
                Attempt.state.in_([AttemptState.PLACED, AttemptState.RUNNING]),
            )
            .order_by(Attempt.gcd)
        ).scalars()
    )


def running_jobs(*, session: Session, partition_pks: list[int]) -> dict[int, list[str]]:
    """The jobs each partition runs now (one per graph compile domain), for its view."""
    out: dict[int, list[str]] = {}
    if not partition_pks:
        return out
    for pk, job_id in session.execute(
        select(Attempt.partition_pk, Attempt.job_id)
        .where(
            Attempt.partition_pk.in_(partition_pks),
            Attempt.state.in_([AttemptState.PLACED, AttemptState.RUNNING]),
        )
        .order_by(Attempt.partition_pk, Attempt.gcd)
    ).tuples():
        out.setdefault(pk, []).append(job_id)
    return out


def remove_partition(*, session: Session, name: str) -> Partition:
    part = get_partition(session=session, name=name)
    live = _live_attempts(session, part)
    if live:
        jobs = ", ".join(a.job_id for a in live)
        raise Conflict(
            f"Partition {name} runs {jobs}; cancel them or wait for them to end.", job=live[0].job_id
        )
    fleet.release_partition(session=session, partition=part)
    return part


def reset_partition(
    *, session: Session, name: str, max_attempts: int, gcds: int | None = None
) -> tuple[Partition, list[str]]:
    """Reset the partition's IPUs; every job running on it loses its attempt (unbilled, not held
    against its retries) and goes again. With `gcds`, a reconfigurable partition is also split anew
    into that many graph compile domains (V-IPU's reconfigurable partitions), once nothing runs on it."""
    part = get_partition(session=session, name=name)
    live = _live_attempts(session, part)
    if gcds is not None and gcds != part.gcds:
        if not part.reconfigurable:
            raise Conflict(
                f"Partition {name} is not reconfigurable: its graph compile domains are fixed at "
                f"{part.gcds}; create it with --reconfigurable to split it anew."
            )
        if live:
            jobs = ", ".join(a.job_id for a in live)
            raise Conflict(f"Partition {name} runs {jobs}; split it anew once nothing runs on it.")
        try:
            check_gcds(part.size, gcds)
        except PartitionRuleError as exc:
            raise InvalidRequest(str(exc), field="gcds")
        part.gcds = gcds
    attempt_service.stop_running(
        session=session,
        attempt_ids=[a.id for a in live],
        outcome=AttemptState.INTERRUPTED,
        reason=f"partition {name} was reset by an admin",
        max_attempts=max_attempts,
    )
    session.flush()
    return part, [a.job_id for a in live]


class FleetIpuView(TypedDict):
    """One IPU of the fleet and the live partition (its kind and tenant) holding it, if any."""

    id: str
    partition: str | None
    tenant: str | None
    kind: str | None


class FleetMachineView(TypedDict):
    """One machine of a unit: its slot, health and IPUs."""

    id: str
    slot: int
    health: str
    reason: str | None
    ipus: list[FleetIpuView]


class FleetUnitView(TypedDict):
    """A unit of the fleet (a POD or an IPU server) with its machines."""

    id: str
    index: int
    rack: str
    machine_type: str
    layout: str
    model: str | None
    machines: list[FleetMachineView]


class TypeCapacityView(TypedDict):
    """One machine type's IPUs: in all, free, and the largest partition that could form now."""

    machine_type: str
    ipus: int
    free_ipus: int
    largest_free: int


class FragmentationView(TypedDict):
    """How much free capacity a request of `head_size` IPUs cannot use now (vipu.allocator)."""

    head_size: int | None
    stranded_ipus: int
    stranded_share: float
    largest_free_by_type: dict[str, int]


class FleetSummaryView(TypedDict):
    """The fleet in figures: units, racks, IPUs, free IPUs by type, live partitions, fragmentation."""

    pods: int | None
    units: int
    racks: int
    ipus: int | None
    free_ipus: int
    by_machine_type: list[TypeCapacityView]
    live_partitions: int
    fragmentation: FragmentationView


class FleetView(TypedDict):
    """`GET /admin/fleet`: the selected units; the route adds the summary."""

    pods: list[FleetUnitView]
    summary: NotRequired[FleetSummaryView]


def fleet_view(*, session: Session, pod_from: int = 0, pods: int = 64) -> FleetView:
    """Units (PODs and servers), machines and IPUs, each IPU with the live partition and tenant
    holding it. `pod_from` and `pods` select units by index; retired units are left out."""
    machines = list(
        session.execute(
            select(Machine)
            .where(Machine.pod >= pod_from, Machine.pod < pod_from + pods, Machine.retired_at.is_(None))
            .order_by(Machine.pod, Machine.slot)
        ).scalars()
    )
    holder: dict[str, tuple[str, str | None, str]] = {}
    for name, tenant, ipus, kind in session.execute(
        select(Partition.name, Partition.tenant_id, Partition.ipu_ids, Partition.kind).where(
            Partition.released_at.is_(None)
        )
    ).tuples():
        for i in ipus:
            holder[i] = (name, tenant, kind)
    by_pod: dict[int, list[Machine]] = defaultdict(list)
    for m in machines:
        by_pod[m.pod].append(m)
    out_pods: list[FleetUnitView] = []
    nobody = (None, None, None)
    for pod, ms in sorted(by_pod.items()):
        layout = LAYOUTS[ms[0].layout]
        width = 2 if layout.ipus_per_machine > 9 else 1  # a server's IPUs are numbered i00 .. i15
        out_pods.append(
            {
                "id": fleet.unit_name(pod, layout.name),
                "index": pod,
                "rack": rack_id(ms[0].rack),
                "machine_type": ms[0].machine_type,
                "layout": layout.name,
                "model": ms[0].model,
                "machines": [
                    {
                        "id": m.id,
                        "slot": m.slot,
                        "health": m.health,
                        "reason": m.health_reason,
                        "ipus": [
                            {
                                "id": (ipu := f"{m.id}-i{i:0{width}d}"),
                                "partition": holder.get(ipu, nobody)[0],
                                "tenant": holder.get(ipu, nobody)[1],
                                "kind": holder.get(ipu, nobody)[2],
                            }
                            for i in range(layout.ipus_per_machine)
                        ],
                    }
                    for m in ms
                ],
            }
        )
    return {"pods": out_pods}


def fleet_summary(
    *,
    session: Session,
    head_size: int | None,
    policy: str = "default",
    allocators: fleet.Allocators | None = None,
) -> FleetSummaryView:
    allocators = allocators or fleet.Allocators()
    with allocators.lock:
        _, alloc = _allocator(allocators, session, policy)
        report = alloc.fragmentation(head_size)
        total = alloc.fleet.ipus if hasattr(alloc, "fleet") else None
        return {
            "pods": alloc.fleet.pods if hasattr(alloc, "fleet") else None,
            "units": sum(1 for pod in range(alloc.fleet.pods) if alloc.fleet.has_pod(pod)),
            "racks": alloc.fleet.racks,
            "ipus": total,
            "free_ipus": alloc.free_ipus(),
            "by_machine_type": [
                {
                    "machine_type": c.machine_type,
                    "ipus": c.total_ipus,
                    "free_ipus": c.free_ipus,
                    "largest_free": c.largest_free,
                }
                for c in fleet.capacity(session=session, allocator=alloc)
            ],
            "live_partitions": len(alloc.partitions()),
            "fragmentation": {
                "head_size": report.head_size,
                "stranded_ipus": report.stranded_ipus,
                "stranded_share": report.stranded_share,
                "largest_free_by_type": report.largest_free_by_type,
            },
        }
