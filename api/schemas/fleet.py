"""The fleet as an admin sees it: partitions, PODs and servers, racks, machines."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.schemas.common import OpenOut


class PartitionOut(BaseModel):
    id: str
    size: int
    ipus: list[str]
    tenant: str | None = None
    kind: str
    machine_type: str
    gcds: int = Field(description="Graph compile domains: a reserved partition runs one job in each.")
    reconfigurable: bool
    job: str | None = Field(None, description="The job it was made for, or the first job running in it.")
    jobs: list[str] = Field(default_factory=list, description="Every job running in it, one per GCD.")
    state: Literal["active", "released"]
    created_at: datetime
    released_at: datetime | None = None


class FleetIpuOut(OpenOut):
    id: str
    partition: str | None = None
    tenant: str | None = None
    kind: str | None = None


class FleetMachineOut(OpenOut):
    id: str
    slot: int
    health: str
    reason: str | None = None
    ipus: list[FleetIpuOut] = Field(default_factory=list)


class FleetPodOut(OpenOut):
    """A unit of the fleet: a POD (layout `pod64` or `pod16`) or an IPU server (`server`)."""

    id: str
    index: int
    rack: str | None = None
    machine_type: str
    layout: str = "pod64"
    model: str | None = None
    machines: list[FleetMachineOut] = Field(default_factory=list)


class FleetOut(OpenOut):
    pods: list[FleetPodOut]
    summary: dict[str, Any] = Field(default_factory=dict, description="Free IPUs and fragmentation.")


class RackUnitOut(OpenOut):
    id: str
    index: int
    machine_type: str
    layout: str
    model: str | None = None
    ipus: int
    machines: dict[str, int] = Field(default_factory=dict, description="Machines by health.")


class RackOut(OpenOut):
    id: str
    index: int
    units: list[RackUnitOut] = Field(default_factory=list)
    ipus: int = 0
    drained: bool = False


class RacksOut(OpenOut):
    racks: list[RackOut]


class ServersAddedOut(OpenOut):
    servers: list[RackUnitOut]


class RackHealthOut(OpenOut):
    rack: str
    health: str
    machines: list[str]


class RetiredOut(OpenOut):
    rack: str | None = None
    retired: list[str]


class MachineOut(OpenOut):
    id: str
    pod: int | None = None
    slot: int | None = None
    machine_type: str | None = None
    health: str
    reason: str | None = None


class PartitionResetOut(OpenOut):
    partition: PartitionOut
    interrupted_job: str | None = None
    interrupted_jobs: list[str] = Field(default_factory=list)
