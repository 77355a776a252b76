"""The inference endpoint's request bodies (`POST` and `PATCH /api/v1/endpoints`), validated at the
edge (scheduler/services/endpoints/ does the rest: the model, the plan, the emulator)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from scheduler.jobspec import JSON_NUMBER, DimName, DimSize, MachineChoice
from vipu.emulator.serving import MAX_SERVE_BATCH, MAX_SERVING_IPUS
from vipu.partitions import is_power_of_two

# A DNS label (RFC 1123), as the endpoint's name may become a host name one day.
EndpointName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
MAX_REPLICAS = 1024
MAX_DELAY_S = 7 * 24 * 3600
Delay = Annotated[int, Field(ge=0, le=MAX_DELAY_S, strict=False), JSON_NUMBER]
Millis = Annotated[float, Field(gt=0, le=600_000, strict=False), JSON_NUMBER]


class Replicas(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    min: int = Field(
        1, ge=0, le=MAX_REPLICAS, description="Replicas held at all times (0: it may scale to zero)."
    )
    max: int = Field(1, ge=1, le=MAX_REPLICAS, description="The most the autoscaler adds.")

    @model_validator(mode="after")
    def _order(self) -> Replicas:
        if self.min > self.max:
            raise ValueError("replicas.min must be at most replicas.max")
        return self


class Autoscaling(BaseModel):
    """When the scheduler adds and removes replicas. Durations are cluster seconds."""

    model_config = ConfigDict(extra="forbid", strict=True)

    target_queue_delay_ms: Millis = Field(
        50.0, description="Add replicas while the last 5 s of answers' mean queue delay stays above this."
    )
    scale_up_delay_s: Delay = Field(30, description="How long the queue delay must stay above target.")
    scale_down_delay_s: Delay = Field(
        300, description="How long the load must fit in one replica fewer before one is removed."
    )
    scale_to_zero_after_s: Delay | None = Field(
        900,
        description="With replicas.min 0: after this long with no request, hold no replica (null: never). "
        "The next request waits for a cold start.",
    )


class Batching(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_batch_size: int = Field(8, ge=1, le=MAX_SERVE_BATCH, description="The largest batch a replica forms.")
    max_wait_ms: Annotated[float, Field(ge=0, le=10_000, strict=False), JSON_NUMBER] = Field(
        5.0, description="How long a replica waits for a batch to fill before it runs what it has."
    )


class EndpointSpec(BaseModel):
    """`POST /api/v1/endpoints`: serve a model behind a URL (docs/endpoints.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: EndpointName = Field(description="A DNS label (a-z, 0-9, `-`; at most 63), unique among yours.")
    model: Annotated[str, StringConstraints(min_length=1, max_length=100)] = Field(
        description="A catalogue name (GET /api/v1/workloads) or the id or name of one of your own models."
    )
    seq_len: int | None = Field(None, ge=1, le=65_536)
    dims: dict[DimName, DimSize] | None = Field(
        None, max_length=32, description="Own models only: sizes of the graph's dynamic dimensions."
    )
    precision: Literal["fp16", "fp32"] = "fp16"
    machine: MachineChoice | None = Field(
        "any", description="A machine type, or `any`: each replica wherever it can start first."
    )
    ipus_per_replica: int | Literal["auto"] = Field(
        "auto",
        description="IPUs of each replica: a power of two, or `auto` for the fewest that hold "
        "`batching.max_batch_size`.",
    )
    replicas: Replicas = Field(default_factory=Replicas)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    batching: Batching = Field(default_factory=Batching)
    max_queue: int = Field(
        256, ge=1, le=1_000_000, description="Requests waiting beyond this are answered 429 with Retry-After."
    )
    cold_start_timeout_s: Annotated[float, Field(gt=0, le=3600, strict=False), JSON_NUMBER] = Field(
        60.0,
        description="Wall seconds a request waits for a ready replica before it is answered 503.",
    )
    preemptible: bool = Field(
        False,
        description="Replicas at the plan's discounted rate that non-preemptible work may stop (each is "
        "replaced).",
    )

    @model_validator(mode="after")
    def _size(self) -> EndpointSpec:
        if isinstance(self.ipus_per_replica, int):
            if not 1 <= self.ipus_per_replica <= MAX_SERVING_IPUS:
                raise ValueError(f"ipus_per_replica must be between 1 and {MAX_SERVING_IPUS}")
            if not is_power_of_two(self.ipus_per_replica):
                raise ValueError("ipus_per_replica must be a power of two (1, 2, 4, ... 64) or `auto`")
        if self.seq_len is not None and self.dims is not None:
            raise ValueError("give `seq_len` or `dims`, not both")
        return self


class EndpointChange(BaseModel):
    """`PATCH /api/v1/endpoints/{id}`: a field left out (or null) stays as it is. Applied while the
    endpoint serves: replicas are added or drained, batching reaches the replicas with the route."""

    model_config = ConfigDict(extra="forbid", strict=True)

    replicas: Replicas | None = None
    autoscaling: Autoscaling | None = None
    batching: Batching | None = None
    max_queue: int | None = Field(None, ge=1, le=1_000_000)
    cold_start_timeout_s: Annotated[float, Field(gt=0, le=3600, strict=False), JSON_NUMBER] | None = None
