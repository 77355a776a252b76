"""The shapes of the inference endpoints' control-plane answers (api/routers/endpoints.py), mirrors of
the views scheduler/services/endpoints/ returns (tests/test_view_mirrors.py); the request bodies are
scheduler/endpointspec.py's."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

EndpointStateName = Literal["provisioning", "ready", "scaled-to-zero", "degraded", "failed", "stopped"]
ReplicaStateName = Literal["queued", "compiling", "loading", "ready", "draining", "stopped"]


class EndpointReplicas(BaseModel):
    min: int
    max: int
    desired: int = Field(description="What the autoscaler wants now.")
    ready: int = Field(description="Replicas serving now.")


class EndpointReplica(BaseModel):
    """One replica: a partition held for the endpoint (its holder job's id)."""

    id: str
    state: ReplicaStateName
    ipus: int
    machine: str | None = None
    partition: str | None = None
    started_at: datetime | None = None
    ready_at: datetime | None = Field(None, description="When it serves (or served) from, once it runs.")
    billed_ipu_hours: float


class ServeBatch(BaseModel):
    batch_size: int
    latency_ms: float = Field(description="A request's latency in a batch of this size (host call included).")
    throughput: float = Field(
        description="Requests/s of one replica at saturation with batches of this size."
    )


class ServePlanOut(BaseModel):
    """A replica on one machine type as the emulator lays it out (cluster time)."""

    machine: str
    ipus: int
    max_batch_size: int
    compile_s: float
    load_s: float
    pipeline_stages: int
    batches: list[ServeBatch]


class EndpointOut(BaseModel):
    """An inference endpoint. `url` is the base of its Open Inference Protocol (KServe v2) routes."""

    id: str
    name: str
    url: str = Field(description="`{url}/v2/models/{name}/infer` answers inference requests.")
    model: str
    model_id: str
    state: EndpointStateName
    reason: str | None = None
    machine: str
    ipus_per_replica: int
    ipus_requested: str
    workload: dict[str, Any]
    replicas: EndpointReplicas
    autoscaling: dict[str, Any]
    batching: dict[str, Any]
    max_queue: int
    cold_start_timeout_s: float
    preemptible: bool
    signature: dict[str, Any] = Field(description="Inputs and outputs: names, datatypes, shapes (-1: batch).")
    serve_plans: list[ServePlanOut]
    replica_list: list[EndpointReplica] = []
    billed_ipu_hours: float = Field(
        description="IPU-hours its replicas were billed so far (held, busy or idle)."
    )
    created_at: datetime
    updated_at: datetime
    stopped_at: datetime | None = None


class EndpointWindow(BaseModel):
    """The endpoint's last minute as its replicas and the API count it."""

    requests: int
    answered: int
    rejected_429: int
    unavailable_503: int
    cold_starts: int
    rps: float
    mean_batch: float | None = None
    queue_delay_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    queued: int
    ready_replicas: int


class EndpointMinute(BaseModel):
    minute: datetime
    requests: int
    errors: int = Field(description="Answered 503 (no replica within the cold-start timeout).")
    rejected: int = Field(description="Answered 429 (the queue was full).")
    cold_starts: int
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_batch: float | None = None
    queue_delay_ms: float | None = None
    replicas: int
    desired: int


class EndpointMetricsOut(BaseModel):
    id: str
    state: EndpointStateName
    replicas: EndpointReplicas
    window: EndpointWindow | None = Field(
        None, description="The last minute; null when the data plane cannot say."
    )
    history: list[EndpointMinute] = Field(description="One row per minute, oldest first.")
