"""Admin routes: fleet, machines, partitions (tenants, plans, trials: admin_tenants; usage: usage)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.deps import Admin, DbDep, SettingsDep
from api.schemas import IntCursorParam, Page, PartitionOut, PowerOfTwoQuery, decode_int_cursor, encode_cursor
from api.views import partition_out
from scheduler import bus
from scheduler.services import fleet, machines, partitions
from scheduler.services import tenants as tenant_service
from scheduler.services.scope import ALL_TENANTS, OneTenant, Scope
from scheduler.text import TEXT

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])

PartitionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
MachineId = Annotated[str, Path(min_length=1, max_length=32)]


# Fleet and machines -------------------------------------------------------------------------------------


@router.get("/fleet", summary="The fleet: pods, machines and IPUs with who holds them, and fragmentation")
def get_fleet(
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    pod_from: Annotated[int, Query(ge=0, le=1023)] = 0,
    pods: Annotated[int, Query(ge=1, le=1024)] = 64,
    head_size: PowerOfTwoQuery = None,
) -> dict[str, Any]:
    with db.read() as s:
        view = partitions.fleet_view(session=s, pod_from=pod_from, pods=pods)
        view["summary"] = partitions.fleet_summary(
            session=s, head_size=head_size, policy=settings.placement_policy
        )
    return view


class HealthChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(max_length=500, pattern=TEXT)] | None = None


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


@router.post("/machines/{machine_id}/drain", summary="Drain: finish what runs, take nothing new")
def drain_machine(
    machine_id: MachineId,
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    body: HealthChange | None = None,
) -> dict[str, Any]:
    return _set_health(db, settings, machine_id, "draining", body)


@router.post("/machines/{machine_id}/fail", summary="Mark failed: never allocated until restored")
def fail_machine(
    machine_id: MachineId,
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    body: HealthChange | None = None,
) -> dict[str, Any]:
    return _set_health(db, settings, machine_id, "failed", body)


@router.post("/machines/{machine_id}/restore", summary="Restore: allocatable again")
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
    machine_type: Literal["m2000", "bow"] | None = None
    tenant: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, description="Reserve it for this tenant: only its jobs may run in it."
    )
    gcds: int = Field(1, ge=1, le=65536)
    reconfigurable: bool = False


@router.post("/partitions", status_code=201, response_model=PartitionOut, summary="Create a partition")
def create_partition(
    body: PartitionCreate, principal: Admin, db: DbDep, settings: SettingsDep
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


@router.post("/partitions/{partition_id}/reset", summary="Reset a partition's IPUs (and split it anew)")
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
