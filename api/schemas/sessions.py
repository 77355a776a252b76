"""Sessions: a partition held for a tenant's jobs (POST /api/v1/sessions)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field


class SessionPartition(BaseModel):
    id: str
    size: int
    ipus: list[str]
    tenant: str | None = None
    machine: str


class SessionJob(BaseModel):
    id: str
    name: str
    state: str
    ipus: int


class SessionEvent(BaseModel):
    at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None = None


class SessionOut(BaseModel):
    """A session: a partition held for the tenant's jobs. Durations are cluster seconds."""

    id: str
    name: str | None = None
    state: Literal["starting", "active", "ended"]
    ended_reason: str | None = Field(
        None, description="`owner`, `max_duration`, `idle_timeout`, `quota` or `fault` once ended."
    )
    ended_detail: str | None = None
    ipus: int
    machine: str
    gcds: int
    max_duration_s: int
    idle_timeout_s: int
    partition: SessionPartition | None = None
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    held_s: float = Field(description="Cluster seconds it has held its partition (what it is billed for).")
    time_left_s: float | None = Field(None, description="Until its maximum duration (while active).")
    idle_s: float | None = Field(None, description="With no job running (null while one runs).")
    idle_left_s: float | None = Field(
        None, description="Until it is ended for idling (null while a job runs)."
    )
    ends_at: datetime | None = Field(None, description="When it ends if nothing changes (wall clock).")
    busy_gcds: int
    billed_ipu_hours: float
    jobs: list[SessionJob] = []
    events: list[SessionEvent] = []
