"""Admin partitions with V-IPU's verbs: create, list, get, remove, reset; the fleet view.

Placement goes through the same allocator as the scheduler; the database's unique index on
live IPU assignments decides races between processes, and a loser retries on fresh state.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.errors import Conflict, InvalidRequest, NoCapacity, NotFound
from scheduler.models import Attempt, AttemptState, Job, Machine, Partition, Tenant
from scheduler.services import attempts as attempt_service
from scheduler.services import fleet
from vipu.machine_types import LAYOUTS
from vipu.partitions import PartitionRuleError, check_gcds
from vipu.topology import rack_id

_sync_lock = threading.Lock()
_syncs: dict[str, fleet.AllocatorSync] = {}


def _allocator(session: Session, policy: str) -> Any:
    sync = _syncs.setdefault(policy, fleet.AllocatorSync(policy))
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
) -> Partition:
    """Carve a partition now (reserved for `tenant_id` when given), or raise NoCapacity (409)."""
    if size < 1 or size & (size - 1):
        raise InvalidRequest("size must be a power of two (1, 2, 4, ... 65536).")
    try:
        check_gcds(size, gcds)
    except PartitionRuleError as exc:
        raise InvalidRequest(str(exc))
    if tenant_id is not None and session.get(Tenant, tenant_id) is None:
        raise NotFound(f"No tenant {tenant_id}.")
    if fleet.get_live_partition(session=session, name=name) is not None:
        raise Conflict(f"A partition named {name!r} already exists.")
    fleet.check_fleet_can_ever_host(session=session, size=size, machine_type=machine_type)
    for _ in range(5):
        with _sync_lock:
            sync, alloc = _allocator(session, policy)
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


def _live_attempt(session: Session, part: Partition) -> Attempt | None:
    return session.execute(
        select(Attempt).where(
            Attempt.partition_pk == part.pk, Attempt.state.in_([AttemptState.PLACED, AttemptState.RUNNING])
        )
    ).scalar_one_or_none()


def remove_partition(*, session: Session, name: str) -> Partition:
    part = get_partition(session=session, name=name)
    live = _live_attempt(session, part)
    if live is not None:
        raise Conflict(
            f"Partition {name} runs job {live.job_id}; cancel it or wait for it to end.", job=live.job_id
        )
    fleet.release_partition(session=session, partition=part)
    return part


def reset_partition(*, session: Session, name: str, max_attempts: int) -> tuple[Partition, str | None]:
    """Reset the partition's IPUs. A job running on it loses its attempt (unbilled) and goes again."""
    part = get_partition(session=session, name=name)
    live = _live_attempt(session, part)
    if live is None:
        return part, None
    job = session.get(Job, live.job_id)
    assert job is not None
    if live.state == AttemptState.PLACED:
        attempt_service.cancel_placed(session=session, attempt=live, job=job)
    else:
        attempt_service.end_attempt(
            session=session,
            attempt=live,
            job=job,
            outcome=AttemptState.LOST,
            reason=f"partition {name} was reset by an admin",
            max_attempts=max_attempts,
        )
    return part, job.id


def fleet_view(*, session: Session, pod_from: int = 0, pods: int = 64) -> dict[str, Any]:
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
    out_pods = []
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


def fleet_summary(*, session: Session, head_size: int | None, policy: str = "default") -> dict[str, Any]:
    with _sync_lock:
        _, alloc = _allocator(session, policy)
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
