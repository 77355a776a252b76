"""Admin routes: fleet (racks, servers, machines), partitions (tenants, plans, trials: admin_tenants;
usage: usage).

The fleet changes while the cloud runs: racks of PODs and IPU servers are added and retired here,
and the scheduler picks the new shape up at its next pass. Retiring takes drained hardware only, and
never while a live partition holds any of its IPUs, so nothing running is stranded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.deps import Admin, DbDep, RuntimeDep, SettingsDep
from api.schemas import (
    FleetOut,
    IntCursorParam,
    MachineOut,
    Page,
    PartitionOut,
    PartitionResetOut,
    PowerOfTwoQuery,
    RackHealthOut,
    RackOut,
    RacksOut,
    RetiredOut,
    ServersAddedOut,
    decode_int_cursor,
    encode_cursor,
)
from api.views import partition_out
from scheduler import bus
from scheduler.services.capacity import fleet, machines, partitions
from scheduler.services.tenancy import tenants as tenant_service
from scheduler.services.tenancy.scope import ALL_TENANTS, OneTenant, Scope
from scheduler.text import TEXT
from vipu.machine_types import LAYOUTS, MACHINE_TYPE_NAMES, MACHINES, SERVER_MODELS

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])

PartitionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
MachineId = Annotated[str, Path(min_length=1, max_length=32)]
# From the registry (vipu/machine_types.py): a new type or model needs no edit here.
POD_TYPES = tuple(t.value for t, m in MACHINES.items() if any(n != "server" for n in m.layouts))
POD_LAYOUTS = tuple(name for name in LAYOUTS if name != "server")
SERVER_MODEL_NAMES = tuple(SERVER_MODELS)


# Fleet and machines -------------------------------------------------------------------------------------


@router.get(
    "/fleet",
    response_model=FleetOut,
    response_model_exclude_unset=True,
    summary="The fleet: PODs, servers, machines and IPUs with who holds them, and fragmentation",
)
def get_fleet(
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    pod_from: Annotated[int, Query(ge=0, le=1023)] = 0,
    pods: Annotated[int, Query(ge=1, le=1024)] = 64,
    head_size: PowerOfTwoQuery = None,
) -> partitions.FleetView:
    with db.read() as s:
        view = partitions.fleet_view(session=s, pod_from=pod_from, pods=pods)
        view["summary"] = partitions.fleet_summary(
            session=s,
            head_size=head_size,
            policy=settings.placement_policy,
            allocators=runtime.allocators,
        )
    return view


class HealthChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(max_length=500, pattern=TEXT)] | None = None


RackId = Annotated[str, Path(min_length=1, max_length=16, description="A rack, e.g. `rack0003`.")]
UnitId = Annotated[
    str, Path(min_length=1, max_length=16, description="A POD (`pod0003`) or a server (`srv0004`).")
]


class RackCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    machine_type: Literal[POD_TYPES] = Field(description="The machine type of its PODs.")  # type: ignore[valid-type]
    layout: Literal[POD_LAYOUTS] = Field(  # type: ignore[valid-type]
        "pod64", description="`pod64` (16 machines) or `pod16` (4 machines)."
    )
    pods: int = Field(1, ge=1, le=2, description="PODs in the rack: a rack holds two POD64s or one POD16.")


class ServersCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: Literal[SERVER_MODEL_NAMES] = Field(description="The server model.")  # type: ignore[valid-type]
    count: int = Field(1, ge=1, le=64, description="How many (they fill the last server rack first).")


@router.get(
    "/fleet/racks",
    response_model=RacksOut,
    response_model_exclude_unset=True,
    summary="The racks, their PODs and servers, and their machines' health",
)
def list_racks(principal: Admin, db: DbDep) -> dict[str, Any]:
    with db.read() as s:
        return {"racks": fleet.racks(session=s)}


@router.post(
    "/fleet/racks",
    status_code=201,
    response_model=RackOut,
    response_model_exclude_unset=True,
    summary="Add a rack of PODs to the running fleet",
)
def add_rack(body: RackCreate, principal: Admin, db: DbDep) -> fleet.RackView:
    with db.write() as s:
        rack = fleet.add_rack(session=s, machine_type=body.machine_type, layout=body.layout, units=body.pods)
        out = next(r for r in fleet.racks(session=s) if r["index"] == rack)
    bus.wake_scheduler("fleet")
    return out


@router.post(
    "/fleet/servers",
    status_code=201,
    response_model=ServersAddedOut,
    response_model_exclude_unset=True,
    summary="Add IPU servers to the running fleet",
)
def add_servers(body: ServersCreate, principal: Admin, db: DbDep) -> dict[str, Any]:
    with db.write() as s:
        added = fleet.add_servers(session=s, model=body.model, count=body.count)
        ids = {fleet.unit_name(unit, "server") for unit in added}
        units = [u for r in fleet.racks(session=s) for u in r["units"] if u["id"] in ids]
    bus.wake_scheduler("fleet")
    return {"servers": units}


@router.post(
    "/fleet/racks/{rack_id}/drain",
    response_model=RackHealthOut,
    response_model_exclude_unset=True,
    summary="Drain every machine of a rack, before retiring it",
)
def drain_rack(
    rack_id: RackId, principal: Admin, db: DbDep, body: HealthChange | None = None
) -> dict[str, Any]:
    return _rack_health(db, rack_id, "draining", body)


@router.post(
    "/fleet/racks/{rack_id}/restore",
    response_model=RackHealthOut,
    response_model_exclude_unset=True,
    summary="Restore every machine of a rack",
)
def restore_rack(
    rack_id: RackId, principal: Admin, db: DbDep, body: HealthChange | None = None
) -> dict[str, Any]:
    return _rack_health(db, rack_id, "up", body)


def _rack_health(db: DbDep, rack_id: str, health: str, body: HealthChange | None) -> dict[str, Any]:
    with db.write() as s:
        ids = fleet.drain_rack(
            session=s, rack=fleet.parse_rack(rack_id), health=health, reason=body.reason if body else None
        )
    bus.wake_scheduler("machine")
    return {"rack": rack_id, "health": health, "machines": ids}


@router.delete(
    "/fleet/racks/{rack_id}",
    response_model=RetiredOut,
    response_model_exclude_unset=True,
    summary="Retire a drained rack (409 while it holds live partitions)",
)
def retire_rack(rack_id: RackId, principal: Admin, db: DbDep) -> dict[str, Any]:
    with db.write() as s:
        retired = fleet.retire(session=s, rack=fleet.parse_rack(rack_id))
    bus.wake_scheduler("fleet")
    return {"rack": rack_id, "retired": retired}


@router.delete(
    "/fleet/units/{unit_id}",
    response_model=RetiredOut,
    response_model_exclude_unset=True,
    summary="Retire a drained POD or server (409 while it holds live partitions)",
)
def retire_unit(unit_id: UnitId, principal: Admin, db: DbDep) -> dict[str, Any]:
    with db.write() as s:
        retired = fleet.retire(session=s, unit=fleet.parse_unit(unit_id))
    bus.wake_scheduler("fleet")
    return {"retired": retired}


def _set_health(
    db: DbDep, settings: SettingsDep, machine: str, health: str, body: HealthChange | None
) -> dict[str, Any]:
    with db.write() as s:
        m, _ = machines.set_health(
            session=s,
            machine=machine,
            health=health,
            reason=body.reason if body else None,
            max_attempts=settings.max_attempts,
        )
        out = {
            "id": m.id,
            "pod": m.pod,
            "slot": m.slot,
            "machine_type": m.machine_type,
            "health": m.health,
            "reason": m.health_reason,
        }
    bus.wake_scheduler("machine")
    return out


@router.post(
    "/machines/{machine_id}/drain",
    response_model=MachineOut,
    response_model_exclude_unset=True,
    summary="Drain: finish what runs, take nothing new",
)
def drain_machine(
    machine_id: MachineId,
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    body: HealthChange | None = None,
) -> dict[str, Any]:
    return _set_health(db, settings, machine_id, "draining", body)


@router.post(
    "/machines/{machine_id}/fail",
    response_model=MachineOut,
    response_model_exclude_unset=True,
    summary="Mark failed: never allocated until restored",
)
def fail_machine(
    machine_id: MachineId,
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    body: HealthChange | None = None,
) -> dict[str, Any]:
    return _set_health(db, settings, machine_id, "failed", body)


@router.post(
    "/machines/{machine_id}/restore",
    response_model=MachineOut,
    response_model_exclude_unset=True,
    summary="Restore: allocatable again",
)
def restore_machine(
    machine_id: MachineId,
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    body: HealthChange | None = None,
) -> dict[str, Any]:
    return _set_health(db, settings, machine_id, "up", body)


# Partitions -----------------------------------------------------------------------------------------------


class PartitionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: PartitionName = Field(description="The partition's name (V-IPU: `vipu create partition NAME`).")
    size: int = Field(ge=1, le=65536)
    machine_type: Literal[MACHINE_TYPE_NAMES] | None = None  # type: ignore[valid-type]
    tenant: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, description="Reserve it for this tenant: only its jobs may run in it."
    )
    gcds: int = Field(1, ge=1, le=65536)
    reconfigurable: bool = False


@router.post("/partitions", status_code=201, response_model=PartitionOut, summary="Create a partition")
def create_partition(
    body: PartitionCreate, principal: Admin, db: DbDep, settings: SettingsDep, runtime: RuntimeDep
) -> PartitionOut:
    with db.write() as s:
        part = partitions.create_partition(
            session=s,
            name=body.id,
            size=body.size,
            machine_type=body.machine_type,
            tenant_id=body.tenant,
            gcds=body.gcds,
            reconfigurable=body.reconfigurable,
            created_by=principal.key_id,
            policy=settings.placement_policy,
            allocators=runtime.allocators,
        )
        out = partition_out(part)
    bus.wake_scheduler("partition")
    return out


@router.get("/partitions", response_model=Page[PartitionOut], summary="List live partitions")
def list_partitions(
    principal: Admin,
    db: DbDep,
    cursor: IntCursorParam = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    tenant: Annotated[str | None, Query(max_length=64)] = None,
) -> Page[PartitionOut]:
    with db.read() as s:
        scope: Scope = ALL_TENANTS
        if tenant is not None:
            scope = OneTenant(tenant_service.get_tenant(session=s, tenant_id=tenant).id)  # 404 if none
        rows = fleet.list_partitions(session=s, scope=scope, after=decode_int_cursor(cursor), limit=limit + 1)
        running = partitions.running_jobs(session=s, partition_pks=[p.pk for p in rows[:limit]])
        items = [partition_out(p, running.get(p.pk)) for p in rows[:limit]]
    return Page[PartitionOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].pk) if len(rows) > limit else None
    )


@router.get("/partitions/{partition_id}", response_model=PartitionOut, summary="A live partition")
def get_partition(
    partition_id: Annotated[str, Path(max_length=64)], principal: Admin, db: DbDep
) -> PartitionOut:
    with db.read() as s:
        part = partitions.get_partition(session=s, name=partition_id)
        return partition_out(part, partitions.running_jobs(session=s, partition_pks=[part.pk]).get(part.pk))


@router.delete("/partitions/{partition_id}", response_model=PartitionOut, summary="Remove a partition")
def remove_partition(
    partition_id: Annotated[str, Path(max_length=64)], principal: Admin, db: DbDep
) -> PartitionOut:
    with db.write() as s:
        out = partition_out(partitions.remove_partition(session=s, name=partition_id))
    bus.wake_scheduler("partition")
    return out


class PartitionReset(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    gcds: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Split a reconfigurable partition anew into this many graph compile domains "
        "(refused while a job runs in it).",
    )


@router.post(
    "/partitions/{partition_id}/reset",
    response_model=PartitionResetOut,
    response_model_exclude_unset=True,
    summary="Reset a partition's IPUs (and split it anew)",
)
def reset_partition(
    partition_id: Annotated[str, Path(max_length=64)],
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    body: PartitionReset | None = None,
) -> dict[str, Any]:
    with db.write() as s:
        part, jobs = partitions.reset_partition(
            session=s, name=partition_id, max_attempts=settings.max_attempts, gcds=body.gcds if body else None
        )
        out = {
            "partition": partition_out(part).model_dump(mode="json"),
            "interrupted_job": jobs[0] if jobs else None,
            "interrupted_jobs": jobs,
        }
    bus.wake_scheduler("partition")
    return out
