"""The workload catalogue and the serving estimate of a workload."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.common import OpenOut


class WorkloadOut(OpenOut):
    name: str
    family: str | None = None
    description: str = ""
    tasks: list[str] = Field(default_factory=list)
    default_batch_size: int | None = None
    seq_lens: list[int] | None = None
    default_seq_len: int | None = None
    precisions: list[str] = Field(default_factory=list)
    default_steps: int | None = None


class CatalogueOut(OpenOut):
    items: list[WorkloadOut]
    machines: list[dict[str, Any]] = Field(
        default_factory=list, description="The machine types (vipu/machine_types.py), with their figures."
    )


class ServeRequest(BaseModel):
    """`serve` of an estimate: the batch sizes to time one serving replica at."""

    model_config = ConfigDict(extra="forbid", strict=True)

    batch_sizes: list[Annotated[int, Field(ge=1, le=65_536)]] = Field(
        min_length=1,
        max_length=64,
        description="1 to 64 batch sizes, each from 1 to the model's largest batch. Inference only "
        "(`workload.task` infer).",
    )


class ServeRowOut(OpenOut):
    batch_size: int
    fits: bool = Field(description="False when a batch this size does not fit the replica; `error` says why.")
    latency_ms: float | None = Field(
        None, description="A request alone in a batch of this size: host call + host transfer + device."
    )
    throughput: float | None = Field(None, description="Samples/s one replica serves at saturation.")
    host_call_ms: float | None = None
    host_ms: float | None = Field(None, description="The batch's inputs in and outputs out.")
    device_ms: float | None = None
    step_ms: float | None = Field(None, description="How long the replica is busy per batch at saturation.")
    error: str | None = None
