"""Typed views of what the API returns.

The models of answers the API describes in docs/openapi.json are generated from it
(`_schemas.py`, by scripts/gen_sdk_models.py); this module adds the few the spec leaves as plain
objects (fleet, racks, catalogue) and the SDK's own (a stream's events). Every model accepts fields it
does not know (`extra="allow"`), so a newer server never breaks an older client; known fields are
typed and validated.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ipucloud.sdk._base import FINAL_STATES, SESSION_FINAL, Model, Page
from ipucloud.sdk._core import Paged
from ipucloud.sdk._schemas import (
    AdminUsage,
    ApiKey,
    ApiKeyCreated,
    Checkpoint,
    Estimate,
    HistoryEntry,
    Job,
    LogEntry,
    Logs,
    Member,
    MemberRemoved,
    ModelInput,
    OnnxModel,
    Partition,
    Plan,
    Progress,
    RuntimeLimit,
    Session,
    SessionEvent,
    SessionJob,
    SessionPartition,
    Tenant,
    TenantCreated,
    TenantUsage,
    TrialApplication,
    TrialDecision,
    TrialReceipt,
    Unmodelled,
    Usage,
    UsageDay,
    UsageJob,
    UsageMachineType,
    UsagePartitionSize,
    UsageWorkload,
    WaitReason,
)

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]

__all__ = [
    "FINAL_STATES",
    "SESSION_FINAL",
    "AdminUsage",
    "ApiKey",
    "ApiKeyCreated",
    "Catalogue",
    "Checkpoint",
    "Estimate",
    "Fleet",
    "FleetIpu",
    "FleetMachine",
    "FleetPod",
    "HistoryEntry",
    "Job",
    "JobState",
    "LogEntry",
    "Logs",
    "Machine",
    "Member",
    "MemberRemoved",
    "Model",
    "ModelInput",
    "OnnxModel",
    "Page",
    "Paged",
    "Partition",
    "PartitionReset",
    "Plan",
    "Progress",
    "Rack",
    "RackHealth",
    "RackUnit",
    "Racks",
    "Retired",
    "RuntimeLimit",
    "ServersAdded",
    "Session",
    "SessionEvent",
    "SessionJob",
    "SessionPartition",
    "StreamEvent",
    "Tenant",
    "TenantCreated",
    "TenantUsage",
    "TrialApplication",
    "TrialDecision",
    "TrialReceipt",
    "Unmodelled",
    "Usage",
    "UsageDay",
    "UsageJob",
    "UsageMachineType",
    "UsagePartitionSize",
    "UsageWorkload",
    "WaitReason",
    "Workload",
]


class StreamEvent(Model):
    """One server-sent event of a job's log stream.

    `event` is `state` or `log` (a job event, with `entry`), `progress` (a snapshot, with
    `progress`) or `end` (the job reached a final state, `state` says which).
    """

    event: str
    id: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def entry(self) -> LogEntry | None:
        if self.event in ("state", "log") and "message" in self.data:
            return LogEntry.model_validate(self.data)
        return None

    @property
    def progress(self) -> Progress | None:
        return Progress.model_validate(self.data) if self.event == "progress" else None

    @property
    def state(self) -> str | None:
        return str(self.data.get("state")) if self.event == "end" else None


class Workload(Model):
    name: str
    family: str | None = None
    description: str = ""
    tasks: list[str] = Field(default_factory=list)
    default_batch_size: int | None = None
    seq_lens: list[int] | None = None
    default_seq_len: int | None = None
    precisions: list[str] = Field(default_factory=list)
    default_steps: int | None = None


class Catalogue(Model):
    items: list[Workload]
    machines: list[dict[str, Any]] = Field(default_factory=list)


class PartitionReset(Model):
    partition: Partition
    interrupted_job: str | None = None
    interrupted_jobs: list[str] = []


class FleetIpu(Model):
    id: str
    partition: str | None = None
    tenant: str | None = None
    kind: str | None = None


class FleetMachine(Model):
    id: str
    slot: int
    health: str
    reason: str | None = None
    ipus: list[FleetIpu] = Field(default_factory=list)


class FleetPod(Model):
    """A unit of the fleet: a POD (layout `pod64` or `pod16`) or an IPU server (`server`)."""

    id: str
    index: int
    rack: str | None = None
    machine_type: str
    layout: str = "pod64"
    model: str | None = None
    machines: list[FleetMachine] = Field(default_factory=list)


class RackUnit(Model):
    id: str
    index: int
    machine_type: str
    layout: str
    model: str | None = None
    ipus: int
    machines: dict[str, int] = Field(default_factory=dict)


class Rack(Model):
    id: str
    index: int
    units: list[RackUnit] = Field(default_factory=list)
    ipus: int = 0
    drained: bool = False


class Racks(Model):
    racks: list[Rack]


class ServersAdded(Model):
    servers: list[RackUnit]


class RackHealth(Model):
    rack: str
    health: str
    machines: list[str]


class Retired(Model):
    rack: str | None = None
    retired: list[str]


class Fleet(Model):
    pods: list[FleetPod]
    summary: dict[str, Any] = Field(default_factory=dict)


class Machine(Model):
    id: str
    pod: int | None = None
    slot: int | None = None
    machine_type: str | None = None
    health: str
    reason: str | None = None
