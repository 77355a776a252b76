"""The API's answers as the SDK reads them. GENERATED from docs/openapi.json: do not edit.

Regenerate with `.venv/bin/python -m scripts.gen_sdk_models` (see scripts/gen_sdk_models.py for the
rules: names, which fields are required, defaults).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from ipucloud.sdk._base import JobHelpers, Model, SessionHelpers

__all__ = [
    "AdminUsage",
    "ApiKey",
    "ApiKeyCreated",
    "Array",
    "ArrayAction",
    "ArrayTotals",
    "Catalogue",
    "Checkpoint",
    "Delivery",
    "Dependency",
    "DependsOn",
    "ElementEstimate",
    "Endpoint",
    "EndpointMetrics",
    "EndpointMinute",
    "EndpointReplica",
    "EndpointReplicas",
    "EndpointWindow",
    "Estimate",
    "Event",
    "Fleet",
    "FleetIpu",
    "FleetMachine",
    "FleetPod",
    "Folded",
    "Health",
    "HistoryEntry",
    "Job",
    "LogEntry",
    "Logs",
    "Machine",
    "Member",
    "MemberRemoved",
    "ModelInput",
    "NotificationSettings",
    "OnnxModel",
    "Partition",
    "PartitionReset",
    "Plan",
    "Progress",
    "Rack",
    "RackHealth",
    "RackUnit",
    "Racks",
    "Ready",
    "Retired",
    "RuntimeLimit",
    "ServeBatch",
    "ServePlan",
    "ServeRow",
    "ServersAdded",
    "Session",
    "SessionEvent",
    "SessionJob",
    "SessionPartition",
    "Submit",
    "Tenant",
    "TenantCreated",
    "TenantUsage",
    "TrialApplication",
    "TrialDecision",
    "TrialReceipt",
    "Unmodelled",
    "Usage",
    "UsageDay",
    "UsageEndpoint",
    "UsageJob",
    "UsageMachineType",
    "UsagePartitionSize",
    "UsageWorkload",
    "V2InferResponse",
    "V2Live",
    "V2ModelMetadata",
    "V2Output",
    "V2Ready",
    "V2ServerMetadata",
    "V2Tensor",
    "WaitReason",
    "Webhook",
    "WebhookCreated",
    "WebhookTest",
    "Workload",
]


class Submit(Model):
    """`POST /jobs`: the job, or with `array` or `sweep` the array (its `id` starts `arr_`)."""

    pass


class Job(JobHelpers, Model):
    id: str
    name: str
    state: str
    reason: str | None = None
    ipus: int
    ipus_requested: str | None = None
    machine: str | None = None
    prefer: str = "time"
    machine_options: dict[str, dict[str, float]] | None = None
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
    never_preempt: bool = False
    checkpoint_every_s: int | None = None
    checkpoints: list[Checkpoint] | None = None
    checkpoint_count: int | None = None
    resumable_until: datetime | None = None
    array_id: str | None = None
    array_index: int | None = None
    params: dict[str, Any] | None = None
    depends_on: DependsOn | None = None
    singleton: bool = False
    folded: Folded | None = None


class Logs(Model):
    job_id: str
    state: str
    items: list[LogEntry]
    next_cursor: str | None = None


class Array(Model):
    id: str | None = None
    name: str | None = None
    size: int | None = None
    indices: str | None = None
    max_running: int | None = None
    state: str | None = None
    elements_by_state: dict[str, int] = Field(default_factory=dict)
    completed_indices: str | None = None
    failed_indices: str | None = None
    progress_percent: float | None = None
    used_ipu_hours: float | None = None
    reserved_ipu_hours: float | None = None
    sweep: dict[str, Any] | None = None
    depends_on: DependsOn | None = None
    created_at: datetime | None = None


class ArrayAction(Model):
    array: Array | None = None
    job_ids: list[str] = Field(default_factory=list)


class Session(SessionHelpers, Model):
    """A session: a partition held for the tenant's jobs. Durations are cluster seconds."""

    id: str
    name: str | None = None
    state: str
    ended_reason: str | None = None
    ended_detail: str | None = None
    ipus: int
    machine: str
    gcds: int = 1
    max_duration_s: int
    idle_timeout_s: int
    partition: SessionPartition | None = None
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
    jobs: list[SessionJob] = Field(default_factory=list)
    events: list[SessionEvent] = Field(default_factory=list)


class V2ServerMetadata(Model):
    name: str | None = None
    version: str | None = None
    extensions: list[str] = Field(default_factory=list)


class V2Live(Model):
    live: bool = False


class V2Ready(Model):
    ready: bool = False


class V2ModelMetadata(Model):
    name: str | None = None
    versions: list[str] = Field(default_factory=list)
    platform: str | None = None
    inputs: list[V2Tensor] = Field(default_factory=list)
    outputs: list[V2Tensor] = Field(default_factory=list)


class V2InferResponse(Model):
    model_name: str | None = None
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    outputs: list[V2Output] = Field(default_factory=list)


class Endpoint(Model):
    """An inference endpoint. `url` is the base of its Open Inference Protocol (KServe v2) routes."""

    id: str
    name: str
    url: str
    model: str
    model_id: str | None = None
    state: str
    reason: str | None = None
    machine: str | None = None
    ipus_per_replica: int | None = None
    ipus_requested: str | None = None
    workload: dict[str, Any] = Field(default_factory=dict)
    replicas: EndpointReplicas
    autoscaling: dict[str, Any] = Field(default_factory=dict)
    batching: dict[str, Any] = Field(default_factory=dict)
    max_queue: int | None = None
    cold_start_timeout_s: float | None = None
    preemptible: bool = False
    signature: dict[str, Any] = Field(default_factory=dict)
    serve_plans: list[ServePlan] = Field(default_factory=list)
    replica_list: list[EndpointReplica] = Field(default_factory=list)
    billed_ipu_hours: float | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    stopped_at: datetime | None = None


class EndpointMetrics(Model):
    id: str | None = None
    state: str | None = None
    replicas: EndpointReplicas | None = None
    window: EndpointWindow | None = None
    history: list[EndpointMinute] = Field(default_factory=list)


class Catalogue(Model):
    items: list[Workload]
    machines: list[dict[str, Any]] = Field(default_factory=list)


class Estimate(Model):
    fits: bool
    plan: dict[str, Any] | None = None
    throughput: float | None = None
    compile_s: float | None = None
    step_s: float | None = None
    total_s: float | None = None
    ipu_hours: float | None = None
    charged_ipu_hours: float | None = None
    rate: float | None = None
    reserve_ipu_hours: float | None = None
    machine: str | None = None
    prefer: str | None = None
    machine_options: dict[str, dict[str, Any]] | None = None
    expected_wait_s: float | None = None
    expected_wait_wall_s: float | None = None
    time_scale: float | None = None
    cached: bool | None = None
    error: str | None = None
    runtime_limit: RuntimeLimit | None = None
    serve: list[ServeRow] | None = None
    elements: list[ElementEstimate] | None = None
    elements_truncated: bool | None = None
    totals: ArrayTotals | None = None
    serve_plan: dict[str, Any] | None = None


class OnnxModel(Model):
    """An uploaded graph, as the emulator sees it (per sample, at the sizes `described_at` gives)."""

    id: str
    name: str
    created_at: datetime | None = None
    sha256: str | None = None
    graph_bytes: int | None = None
    uploaded_bytes: int | None = None
    weights_stripped_bytes: int | None = None
    format: str = "onnx"
    ir_version: int | None = None
    opset: int | None = None
    producer: str | None = None
    inputs: list[ModelInput] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    batch_dim: str | int | None = None
    dynamic_dims: list[str] = Field(default_factory=list)
    dims: dict[str, int] = Field(default_factory=dict)
    described_at: dict[str, int] = Field(default_factory=dict)
    nodes: int | None = None
    operators: dict[str, int] = Field(default_factory=dict)
    parameters: int | None = None
    layers: int | None = None
    tasks: list[str] = Field(default_factory=list)
    forward_flops_per_sample: float | None = None
    train_flops_per_sample: float | None = None
    activation_bytes_per_sample: dict[str, float] = Field(default_factory=dict)
    host_bytes_per_sample: dict[str, float] = Field(default_factory=dict)
    by_kind: dict[str, dict[str, float]] = Field(default_factory=dict)
    declared_elementwise: list[str] = Field(default_factory=list)
    unmodelled: list[Unmodelled] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class Usage(Model):
    by_day: list[UsageDay] = Field(default_factory=list)
    by_job: list[UsageJob] = Field(default_factory=list)
    by_workload: list[UsageWorkload] = Field(default_factory=list)
    by_partition_size: list[UsagePartitionSize] = Field(default_factory=list)
    by_machine_type: list[UsageMachineType] = Field(default_factory=list)
    by_endpoint: list[UsageEndpoint] = Field(default_factory=list)
    next_cursor: str | None = None
    tenant_id: str
    plan: str
    rates: dict[str, float] = Field(default_factory=dict)
    machine_types: list[str] = Field(default_factory=list)
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float = 0.0
    remaining_ipu_hours: float
    used_ipu_seconds: float | None = None
    expires_at: datetime | None = None
    days_left: float | None = None


class AdminUsage(Model):
    by_day: list[UsageDay] = Field(default_factory=list)
    by_job: list[UsageJob] = Field(default_factory=list)
    by_workload: list[UsageWorkload] = Field(default_factory=list)
    by_partition_size: list[UsagePartitionSize] = Field(default_factory=list)
    by_machine_type: list[UsageMachineType] = Field(default_factory=list)
    by_endpoint: list[UsageEndpoint] = Field(default_factory=list)
    next_cursor: str | None = None
    tenants: list[TenantUsage]
    tenants_next_cursor: str | None = None


class ApiKey(Model):
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


class TrialReceipt(Model):
    """What an applicant gets back: the application as recorded."""

    id: str
    status: str
    name: str
    email: str | None = None
    organisation: str | None = None
    category: str | None = None
    created_at: datetime | None = None


class Fleet(Model):
    pods: list[FleetPod]
    summary: dict[str, Any] = Field(default_factory=dict)


class Racks(Model):
    racks: list[Rack]


class Rack(Model):
    id: str
    index: int
    units: list[RackUnit] = Field(default_factory=list)
    ipus: int = 0
    drained: bool = False


class ServersAdded(Model):
    servers: list[RackUnit]


class RackHealth(Model):
    rack: str
    health: str
    machines: list[str]


class Retired(Model):
    rack: str | None = None
    retired: list[str]


class Machine(Model):
    id: str
    pod: int | None = None
    slot: int | None = None
    machine_type: str | None = None
    health: str
    reason: str | None = None


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
    jobs: list[str] = Field(default_factory=list)
    state: str | None = None
    created_at: datetime | None = None
    released_at: datetime | None = None


class PartitionReset(Model):
    partition: Partition
    interrupted_job: str | None = None
    interrupted_jobs: list[str] = Field(default_factory=list)


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


class Member(Model):
    id: str | None = None
    tenant_id: str | None = None
    email: str | None = None
    name: str | None = None
    role: str | None = None
    created_at: datetime | None = None


class MemberRemoved(Member):
    revoked_keys: int | None = None


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
    max_endpoints: int = 2
    max_endpoint_replicas: int = 2
    max_endpoint_ipus: int = 8
    max_array_size: int = 64
    priority: int | None = None
    fairshare_weight: float | None = None
    rates: dict[str, float] = Field(default_factory=dict)
    machine_types: list[str] = Field(default_factory=list)
    max_models: int | None = None
    max_model_bytes: int | None = None
    preemptible_discount: float = 0.5
    checkpoint_retention_s: int = 604800
    never_preempt: bool = False
    updated_at: datetime | None = None


class TrialApplication(TrialReceipt):
    intended_use: str | None = None
    reason: str | None = None
    tenant_id: str | None = None
    plan: str | None = None
    decided_at: datetime | None = None
    decided_by: str | None = None


class TrialDecision(Model):
    application: TrialApplication | None = None
    tenant: Tenant | None = None
    api_key: str | None = None


class Health(Model):
    """`/healthz`: the process answers."""

    status: str | None = None


class Ready(Model):
    """`/readyz` when ready: every dependency's check is `ok`."""

    status: str | None = None
    checks: dict[str, str] = Field(default_factory=dict)


class Webhook(Model):
    id: str | None = None
    url: str | None = None
    description: str | None = None
    events: list[str] = Field(default_factory=list)
    enabled: bool = False
    disabled_reason: str | None = None
    failing_since: datetime | None = None
    previous_secret_until: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class WebhookCreated(Webhook):
    secret: str | None = None


class WebhookTest(Model):
    """What the receiver answered a signed `webhook.ping`."""

    ok: bool = False
    status: int | None = None
    latency_ms: int | None = None
    body_excerpt: str | None = None
    error: str | None = None
    webhook_id_header: str | None = None


class Delivery(Model):
    id: int | None = None
    webhook_id: str | None = None
    event_id: str | None = None
    event_type: str | None = None
    status: str | None = None
    attempts: int | None = None
    next_attempt_at: datetime | None = None
    last_status: int | None = None
    last_error: str | None = None
    last_latency_ms: int | None = None
    response_excerpt: str | None = None
    created_at: datetime | None = None
    last_attempt_at: datetime | None = None
    delivered_at: datetime | None = None


class NotificationSettings(Model):
    """A member's e-mail choices (the defaults until they change one)."""

    member_id: str | None = None
    job_events: list[str] = Field(default_factory=list)
    budget_thresholds: list[int] = Field(default_factory=list)
    budget_kinds: list[str] = Field(default_factory=list)
    trial_mail: bool = False
    session_mail: bool = False
    webhook_mail: bool = False


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
    behind_other_tenants: int = 0
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


class DependsOn(Model):
    mode: str | None = None
    on: list[Dependency] = Field(default_factory=list)
    on_unsatisfiable: str = "cancel"


class Folded(Model):
    label: str | None = None
    count: int | None = None
    indices: str | None = None


class LogEntry(Model):
    id: int
    at: datetime
    kind: str
    message: str
    attempt: int | None = None
    data: dict[str, Any] | None = None


class SessionPartition(Model):
    id: str | None = None
    size: int | None = None
    ipus: list[str] = Field(default_factory=list)
    tenant: str | None = None
    machine: str | None = None


class SessionJob(Model):
    id: str | None = None
    name: str | None = None
    state: str | None = None
    ipus: int | None = None


class SessionEvent(Model):
    at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None = None


class V2Tensor(Model):
    name: str | None = None
    datatype: str | None = None
    shape: list[int] = Field(default_factory=list)


class V2Output(V2Tensor):
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class EndpointReplicas(Model):
    min: int
    max: int
    desired: int
    ready: int


class ServePlan(Model):
    """A replica on one machine type as the emulator lays it out (cluster time)."""

    machine: str | None = None
    ipus: int | None = None
    max_batch_size: int | None = None
    compile_s: float | None = None
    load_s: float | None = None
    pipeline_stages: int | None = None
    batches: list[ServeBatch] = Field(default_factory=list)


class EndpointReplica(Model):
    """One replica: a partition held for the endpoint (its holder job's id)."""

    id: str | None = None
    state: str | None = None
    ipus: int | None = None
    machine: str | None = None
    partition: str | None = None
    started_at: datetime | None = None
    ready_at: datetime | None = None
    billed_ipu_hours: float | None = None


class EndpointWindow(Model):
    """The endpoint's last minute as its replicas and the API count it."""

    requests: int | None = None
    answered: int | None = None
    rejected_429: int | None = None
    unavailable_503: int | None = None
    cold_starts: int | None = None
    rps: float | None = None
    mean_batch: float | None = None
    queue_delay_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    queued: int | None = None
    ready_replicas: int | None = None


class EndpointMinute(Model):
    minute: datetime | None = None
    requests: int | None = None
    errors: int | None = None
    rejected: int | None = None
    cold_starts: int | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_batch: float | None = None
    queue_delay_ms: float | None = None
    replicas: int | None = None
    desired: int | None = None


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


class RuntimeLimit(Model):
    max_runtime_s: int | None = None
    within: bool = False
    detail: str | None = None
    fitting_steps: int | None = None
    fitting_ipus: int | None = None


class ServeRow(Model):
    batch_size: int | None = None
    fits: bool = False
    latency_ms: float | None = None
    throughput: float | None = None
    host_call_ms: float | None = None
    host_ms: float | None = None
    device_ms: float | None = None
    step_ms: float | None = None
    error: str | None = None


class ElementEstimate(Model):
    index: int | None = None
    params: dict[str, Any] | None = None
    fits: bool = False
    ipus: int | None = None
    machine: str | None = None
    total_s: float | None = None
    throughput: float | None = None
    ipu_hours: float | None = None
    charged_ipu_hours: float | None = None
    expected_wait_s: float | None = None
    error: str | None = None


class ArrayTotals(Model):
    elements: int | None = None
    fitting: int | None = None
    max_running: int | None = None
    total_s: float | None = None
    ipu_hours: float | None = None
    charged_ipu_hours: float | None = None
    expected_wait_s: float | None = None
    expected_end_s: float | None = None


class ModelInput(Model):
    name: str | None = None
    dtype: str | None = None
    shape: list[int | str | None] = Field(default_factory=list)
    dynamic: list[int] = Field(default_factory=list)


class Unmodelled(Model):
    operator: str | None = None
    nodes: int | None = None
    treated_as: str | None = None


class UsageDay(Model):
    day: str | None = None
    ipu_hours: float | None = None


class UsageJob(Model):
    job_id: str | None = None
    tenant_id: str | None = None
    name: str | None = None
    workload: str | None = None
    partition_size: int | None = None
    ipu_hours: float | None = None
    machine_type: str | None = None
    rate: float | None = None
    raw_ipu_hours: float | None = None
    charged_ipu_hours: float | None = None


class UsageWorkload(Model):
    workload: str | None = None
    ipu_hours: float | None = None


class UsagePartitionSize(Model):
    partition_size: int | None = None
    ipu_hours: float | None = None


class UsageMachineType(Model):
    machine_type: str | None = None
    ipu_hours: float | None = None
    charged_ipu_hours: float | None = None


class UsageEndpoint(Model):
    endpoint_id: str | None = None
    tenant_id: str | None = None
    name: str | None = None
    model: str | None = None
    ipu_hours: float | None = None


class TenantUsage(Model):
    tenant_id: str
    name: str
    plan: str
    status: str | None = None
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float = 0.0
    remaining_ipu_hours: float | None = None
    expires_at: datetime | None = None


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


class Event(Model):
    id: str | None = None
    type: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None


class Dependency(Model):
    job: str | None = None
    type: str | None = None


class ServeBatch(Model):
    batch_size: int | None = None
    latency_ms: float | None = None
    throughput: float | None = None


class FleetMachine(Model):
    id: str
    slot: int
    health: str
    reason: str | None = None
    ipus: list[FleetIpu] = Field(default_factory=list)


class FleetIpu(Model):
    id: str
    partition: str | None = None
    tenant: str | None = None
    kind: str | None = None
