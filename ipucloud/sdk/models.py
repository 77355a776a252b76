"""Typed views of what the API returns.

Every model accepts fields it does not know (`extra="allow"`), so a newer server never breaks an
older client; known fields are typed and validated.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=False)


class Paged(Protocol[T_co]):
    """Anything listed a page at a time: a `Page`, or a job's `Logs`."""

    @property
    def items(self) -> Sequence[T_co]: ...

    @property
    def next_cursor(self) -> str | None: ...


class Page(Model, Generic[T]):
    items: list[T]
    next_cursor: str | None = None


class Progress(Model):
    phase: str | None = None
    step: int | None = None
    steps: int | None = None
    samples: int | None = None
    percent: float | None = None
    eta_s: float | None = None
    throughput: float | None = None
    memory_per_ipu_bytes: int | None = None
    cluster_s: float | None = None


class HistoryEntry(Model):
    at: datetime
    message: str
    state: str | None = None
    attempt: int | None = None


class WaitReason(Model):
    reason: str
    detail: str
    behind: list[str] = Field(default_factory=list)
    estimated_start: datetime | None = None


class Checkpoint(Model):
    step: int
    steps: int
    samples: int
    executable: str
    machine_type: str | None = None
    attempt: int | None = None
    run_s: float | None = None
    reason: str
    at: datetime


class Job(Model):
    id: str
    name: str
    state: JobState
    reason: str | None = None
    ipus: int
    ipus_requested: str | None = None
    machine: str | None = None
    partition: str | None = None
    session: str | None = None
    priority: int = 0
    workload: dict[str, Any] = Field(default_factory=dict)
    max_runtime_s: int | None = None
    predicted_runtime_s: float | None = None
    cancel_requested: bool = False
    attempts: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: Progress | None = None
    used_ipu_hours: float | None = None
    history: list[HistoryEntry] | None = None
    wait: WaitReason | None = None
    preemptible: bool = False
    checkpoint_every_s: int | None = None
    checkpoints: list[Checkpoint] | None = None
    checkpoint_count: int | None = None
    resumable_until: datetime | None = None

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES


class LogEntry(Model):
    id: int
    at: datetime
    kind: str
    message: str
    attempt: int | None = None
    data: dict[str, Any] | None = None


class Logs(Model):
    job_id: str
    state: str
    items: list[LogEntry]
    next_cursor: str | None = None


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


class Estimate(Model):
    fits: bool
    plan: dict[str, Any] | None = None
    throughput: float | None = None
    compile_s: float | None = None
    step_s: float | None = None
    total_s: float | None = None
    ipu_hours: float | None = None
    expected_wait_s: float | None = None
    memory_per_ipu_bytes: int | None = None
    error: str | None = None


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


class Usage(Model):
    tenant_id: str
    plan: str
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float = 0.0
    remaining_ipu_hours: float
    used_ipu_seconds: float | None = None
    expires_at: datetime | None = None
    days_left: float | None = None
    by_day: list[dict[str, Any]] = Field(default_factory=list)
    by_job: list[dict[str, Any]] = Field(default_factory=list)
    by_workload: list[dict[str, Any]] = Field(default_factory=list)
    by_partition_size: list[dict[str, Any]] = Field(default_factory=list)


class TenantUsage(Model):
    tenant_id: str
    name: str
    plan: str
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float = 0.0


class AdminUsage(Model):
    tenants: list[TenantUsage]
    by_day: list[dict[str, Any]] = Field(default_factory=list)
    by_job: list[dict[str, Any]] = Field(default_factory=list)
    by_workload: list[dict[str, Any]] = Field(default_factory=list)
    by_partition_size: list[dict[str, Any]] = Field(default_factory=list)


class Tenant(Model):
    id: str
    name: str
    plan: str
    status: str
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float = 0.0
    remaining_ipu_hours: float
    expires_at: datetime | None = None
    fairshare_weight: float = 1.0
    category: str | None = None
    organisation: str | None = None
    created_at: datetime | None = None


class TenantCreated(Tenant):
    api_key: str


class Plan(Model):
    name: str
    kind: str | None = None
    description: str = ""
    quota_ipu_hours: float | None = None
    trial_days: int | None = None
    max_partition_size: int | None = None
    max_concurrent_jobs: int | None = None
    max_queued_jobs: int | None = None
    max_runtime_s: int | None = None
    idle_timeout_s: int | None = None
    max_session_s: int | None = None
    priority: int | None = None
    fairshare_weight: float | None = None
    max_models: int | None = None
    max_model_bytes: int | None = None


class OnnxModel(Model):
    """One of the tenant's own ONNX graphs (``POST /models``), described per sample at its default dims."""

    id: str
    name: str
    created_at: datetime | None = None
    sha256: str | None = None
    graph_bytes: int | None = None
    uploaded_bytes: int | None = None
    weights_stripped_bytes: int | None = None
    inputs: list[dict[str, Any]] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    batch_dim: str | int | None = None
    dynamic_dims: list[str] = Field(default_factory=list)
    dims: dict[str, int] = Field(default_factory=dict)
    nodes: int | None = None
    operators: dict[str, int] = Field(default_factory=dict)
    parameters: int | None = None
    layers: int | None = None
    tasks: list[str] = Field(default_factory=list)
    forward_flops_per_sample: float | None = None
    train_flops_per_sample: float | None = None
    activation_bytes_per_sample: dict[str, float] = Field(default_factory=dict)
    declared_elementwise: list[str] = Field(default_factory=list)
    unmodelled: list[dict[str, Any]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class TrialApplication(Model):
    id: str
    name: str
    email: str | None = None
    organisation: str | None = None
    category: str | None = None
    intended_use: str | None = None
    status: str
    reason: str | None = None
    tenant_id: str | None = None
    plan: str | None = None
    created_at: datetime | None = None
    decided_at: datetime | None = None
    decided_by: str | None = None


class TrialDecision(Model):
    """What approving an application returns: the application, its new tenant and key (shown once)."""

    application: TrialApplication | None = None
    tenant: Tenant | None = None
    api_key: str | None = None


class ApiKey(Model):
    """An API key's record; never the key itself (`prefix` helps recognise it)."""

    id: str
    name: str = ""
    prefix: str | None = None
    scopes: list[str] = Field(default_factory=list)
    tenant_id: str | None = None
    member_id: str | None = None
    state: str | None = None
    created_at: datetime | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    created_by: str | None = None


class ApiKeyCreated(ApiKey):
    api_key: str


class Partition(Model):
    id: str
    size: int
    ipus: list[str] = Field(default_factory=list)
    tenant: str | None = None
    kind: str | None = None
    machine_type: str | None = None
    gcds: int = 1
    reconfigurable: bool = False
    job: str | None = None
    jobs: list[str] = []
    state: str | None = None
    created_at: datetime | None = None
    released_at: datetime | None = None


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


SESSION_FINAL = "ended"


class SessionEvent(Model):
    at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None = None


class Session(Model):
    """A held partition (``POST /sessions``): its jobs start at once. Durations are cluster seconds."""

    id: str
    name: str | None = None
    state: str  # starting | active | ended
    ended_reason: str | None = None
    ended_detail: str | None = None
    ipus: int
    machine: str
    gcds: int = 1
    max_duration_s: int
    idle_timeout_s: int
    partition: dict[str, Any] | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    held_s: float = 0.0
    time_left_s: float | None = None
    idle_s: float | None = None
    idle_left_s: float | None = None
    ends_at: datetime | None = None
    busy_gcds: int = 0
    billed_ipu_hours: float = 0.0
    jobs: list[dict[str, Any]] = Field(default_factory=list)
    events: list[SessionEvent] = Field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.state == SESSION_FINAL
