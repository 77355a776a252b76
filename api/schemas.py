"""Response and request bodies of the HTTP API (the job spec itself lives in scheduler.jobspec)."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, EmailStr, Field, StringConstraints

from scheduler.errors import InvalidRequest

T = TypeVar("T")

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")]
TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}$")]


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(
        None, description="Pass as `cursor` to get the next page; null at the end."
    )


def encode_cursor(value: str | int | None) -> str | None:
    if value is None:
        return None
    return base64.urlsafe_b64encode(str(value).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    if cursor is None or cursor == "":
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = base64.urlsafe_b64decode(padded.encode()).decode()
    except Exception:
        raise InvalidRequest("cursor is not one this API returned.", field="cursor")
    if not value or len(value) > 100 or not value.isprintable():
        raise InvalidRequest("cursor is not one this API returned.", field="cursor")
    return value


def decode_int_cursor(cursor: str | None) -> int | None:
    value = decode_cursor(cursor)
    if value is None:
        return None
    if not value.isdigit() or len(value) > 18:
        raise InvalidRequest("cursor is not one this API returned.", field="cursor")
    return int(value)


class HistoryEntry(BaseModel):
    at: datetime
    message: str
    state: str | None = None
    attempt: int | None = None


class WaitReason(BaseModel):
    reason: str
    detail: str
    behind: list[str] = Field(default_factory=list)
    estimated_start: datetime | None = None


class Progress(BaseModel):
    model_config = ConfigDict(extra="allow")

    phase: str | None = None
    step: int | None = None
    steps: int | None = None
    samples: int | None = None
    percent: float | None = None
    eta_s: float | None = None
    throughput: float | None = None
    memory_per_ipu_bytes: int | None = None
    cluster_s: float | None = None


class JobOut(BaseModel):
    id: str
    name: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    reason: str | None = None
    ipus: int
    ipus_requested: str
    machine: str | None = None
    partition: str | None = None
    priority: int
    workload: dict[str, Any]
    max_runtime_s: int | None = None
    predicted_runtime_s: float
    cancel_requested: bool
    attempts: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: Progress | None = None
    used_ipu_hours: float | None = None
    history: list[HistoryEntry] | None = None
    wait: WaitReason | None = None


class LogEntry(BaseModel):
    id: int
    at: datetime
    kind: str
    message: str
    attempt: int | None = None
    data: dict[str, Any] | None = None


class LogsOut(BaseModel):
    job_id: str
    state: str
    items: list[LogEntry]
    next_cursor: str | None = None


class UsageOut(BaseModel):
    tenant_id: str
    plan: str
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float
    remaining_ipu_hours: float
    used_ipu_seconds: float
    expires_at: datetime | None = None
    days_left: float | None = None
    by_day: list[dict[str, Any]] = Field(default_factory=list)
    by_job: list[dict[str, Any]] = Field(default_factory=list)
    by_workload: list[dict[str, Any]] = Field(default_factory=list)
    by_partition_size: list[dict[str, Any]] = Field(default_factory=list)


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TenantName
    plan: Annotated[str, StringConstraints(min_length=1, max_length=64)] = "trial"
    quota_ipu_hours: float | None = Field(None, ge=0, le=100_000_000)
    expires_at: datetime | None = None
    fairshare_weight: float | None = Field(None, gt=0, le=1000)
    owner_email: EmailStr | None = None


class TenantUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    quota_ipu_hours: float | None = Field(None, ge=0, le=100_000_000)
    expires_at: datetime | None = None
    fairshare_weight: float | None = Field(None, gt=0, le=1000)
    status: Literal["active", "suspended"] | None = None


class TenantOut(BaseModel):
    id: str
    name: str
    plan: str
    status: str
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float
    remaining_ipu_hours: float
    expires_at: datetime | None = None
    fairshare_weight: float
    category: str | None = None
    organisation: str | None = None
    created_at: datetime


class TenantCreated(TenantOut):
    api_key: str = Field(description="The tenant's first API key. Shown once: store it now.")


class PartitionOut(BaseModel):
    id: str
    size: int
    ipus: list[str]
    tenant: str | None = None
    kind: str
    machine_type: str
    gcds: int
    reconfigurable: bool
    job: str | None = None
    state: Literal["active", "released"]
    created_at: datetime
    released_at: datetime | None = None
