"""Tenants' own uploaded ONNX models, as the emulator sees them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from scheduler.models import OwnModel


class ModelInput(BaseModel):
    name: str
    dtype: str
    shape: list[int | str | None] = Field(
        description="Sizes; a name marks a dynamic dimension, null an unknown one."
    )
    dynamic: list[int] = Field(description="The axes whose size is not fixed by the graph.")


class Unmodelled(BaseModel):
    operator: str
    nodes: int
    treated_as: str


class ModelOut(BaseModel):
    """An uploaded graph, as the emulator sees it (per sample, at the sizes `described_at` gives)."""

    id: str
    name: str
    created_at: datetime
    sha256: str = Field(
        description="Of the stored graph (weights stripped): the executable cache keys on it."
    )
    graph_bytes: int = Field(description="Bytes stored: the graph without its weights.")
    uploaded_bytes: int = Field(description="Bytes of the file as uploaded.")
    weights_stripped_bytes: int = Field(description="Weight data removed before storing (0 if none came).")
    format: Literal["onnx"] = "onnx"
    ir_version: int
    opset: int
    producer: str
    inputs: list[ModelInput]
    outputs: list[str]
    batch_dim: str | int | None = Field(description="The batch axis: its name, or its fixed size.")
    dynamic_dims: list[str] = Field(
        description="Dynamic dimensions besides the batch: seq_len or dims size them."
    )
    dims: dict[str, int] = Field(
        description="Their sizes when a job gives none (set at upload); a dimension not here needs the "
        "job's seq_len or dims."
    )
    described_at: dict[str, int] = Field(
        description="The sizes the figures here (FLOPs, activations, host bytes per sample) are computed "
        "at: `dims`, and 128 for each dynamic dimension the upload left unsized."
    )
    nodes: int
    operators: dict[str, int] = Field(description="Nodes per operator type.")
    parameters: int
    layers: int = Field(description="Units a pipeline stage boundary may fall between.")
    tasks: list[str]
    forward_flops_per_sample: float
    train_flops_per_sample: float | None
    activation_bytes_per_sample: dict[str, float] = Field(
        description="Activations kept for the backward pass, per precision."
    )
    host_bytes_per_sample: dict[str, float]
    by_kind: dict[str, dict[str, float]] = Field(
        description="Forward FLOPs, parameters and ops per kind of op."
    )
    declared_elementwise: list[str]
    unmodelled: list[Unmodelled] = Field(description="Operators the emulator approximates, and how.")
    notes: list[str]

    @classmethod
    def of(cls, m: OwnModel) -> ModelOut:
        s = m.summary
        return cls(
            id=m.id,
            name=m.name,
            created_at=m.created_at,
            sha256=m.sha256,
            graph_bytes=m.graph_bytes,
            uploaded_bytes=m.uploaded_bytes,
            weights_stripped_bytes=m.weights_stripped_bytes,
            described_at=s.get("described_at", s["dims"]),
            **{k: s[k] for k in _SUMMARY_FIELDS},
        )


_SUMMARY_FIELDS = (
    "ir_version",
    "opset",
    "producer",
    "inputs",
    "outputs",
    "batch_dim",
    "dynamic_dims",
    "dims",
    "nodes",
    "operators",
    "parameters",
    "layers",
    "tasks",
    "forward_flops_per_sample",
    "train_flops_per_sample",
    "activation_bytes_per_sample",
    "host_bytes_per_sample",
    "by_kind",
    "declared_elementwise",
    "unmodelled",
    "notes",
)
