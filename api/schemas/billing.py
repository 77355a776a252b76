"""What the grant is spent on: usage by day, job, workload, size, machine type and endpoint, and the
plans (quotas, limits and rates) tenants are on."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.schemas.common import Count, Days, Hours, MachineTypeName, Priority, Rate, Seconds, Size, Weight
from scheduler.jobspec import JSON_NUMBER
from scheduler.models import Plan
from scheduler.services.tenancy.rates import allowed_types, plan_rates
from scheduler.text import OPTIONAL_TEXT
from vipu.machine_types import MACHINE_TYPE_NAMES

# Usage ----------------------------------------------------------------------------------------------


class UsageDay(BaseModel):
    day: str = Field(description="UTC day, `YYYY-MM-DD`.")
    ipu_hours: float


class UsageJob(BaseModel):
    job_id: str
    tenant_id: str
    name: str
    workload: str
    partition_size: int
    ipu_hours: float = Field(description="The grant charged for it: rate x IPU-hours (`charged_ipu_hours`)")
    machine_type: str | None = Field(
        None, description="The machine type it ran on (two, comma-separated, if its attempts ran on both)"
    )
    rate: float | None = Field(None, description="Grant units per IPU-hour it was charged at")
    raw_ipu_hours: float | None = Field(None, description="The IPU-hours it ran, before the rate")
    charged_ipu_hours: float | None = Field(None, description="The grant charged: rate x IPU-hours")


class UsageWorkload(BaseModel):
    workload: str
    ipu_hours: float


class UsagePartitionSize(BaseModel):
    partition_size: int
    ipu_hours: float


class UsageMachineType(BaseModel):
    machine_type: str
    ipu_hours: float = Field(description="IPU-hours run on this type.")
    charged_ipu_hours: float = Field(description="What they spent of the grant: the type's rate x IPU-hours.")


class UsageEndpoint(BaseModel):
    endpoint_id: str
    tenant_id: str
    name: str
    model: str
    ipu_hours: float = Field(description="What its replicas were billed: held IPU-hours, busy or idle.")


class UsageGroups(BaseModel):
    by_day: list[UsageDay] = Field(default_factory=list)
    by_job: list[UsageJob] = Field(default_factory=list)
    by_workload: list[UsageWorkload] = Field(default_factory=list)
    by_partition_size: list[UsagePartitionSize] = Field(default_factory=list)
    by_machine_type: list[UsageMachineType] = Field(default_factory=list)
    by_endpoint: list[UsageEndpoint] = Field(default_factory=list)
    next_cursor: str | None = Field(
        None,
        description="More jobs than `limit` were used in the window: pass as `cursor` for the next page.",
    )


class UsageOut(UsageGroups):
    tenant_id: str
    plan: str
    rates: dict[str, float] = Field(
        default_factory=dict,
        description="Grant units per IPU-hour of each machine type under the plan (1.0: an IPU-M2000 hour).",
    )
    machine_types: list[str] = Field(default_factory=list, description="The types the plan runs jobs on.")
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float
    remaining_ipu_hours: float
    used_ipu_seconds: float
    expires_at: datetime | None = None
    days_left: float | None = None


class TenantUsage(BaseModel):
    tenant_id: str
    name: str
    plan: str
    status: Literal["active", "suspended", "expired"]
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float
    remaining_ipu_hours: float
    expires_at: datetime | None = None


class AdminUsageOut(UsageGroups):
    tenants: list[TenantUsage]
    tenants_next_cursor: str | None = Field(
        None, description="More tenants than `limit`: pass as `tenants_cursor` for the next page."
    )


class PlanOut(BaseModel):
    name: str
    kind: Literal["trial", "standard", "internal"]
    description: str
    quota_ipu_hours: float = Field(description="The grant a new tenant on this plan receives.")
    trial_days: int | None = Field(description="Length of a trial; null: tenants on it do not expire.")
    max_partition_size: int
    max_concurrent_jobs: int
    max_queued_jobs: int
    max_runtime_s: int
    idle_timeout_s: int = Field(description="A session's default idle timeout (cluster seconds).")
    max_session_s: int = Field(description="The longest a session may hold its partition (cluster seconds).")
    max_endpoints: int = Field(2, description="Inference endpoints a tenant may keep.")
    max_endpoint_replicas: int = Field(2, description="The most replicas one endpoint may scale to.")
    max_endpoint_ipus: int = Field(
        8, description="IPUs a tenant's endpoints may hold together at their maximum replicas."
    )
    max_array_size: int = Field(64, description="The most elements one job array or sweep may have.")
    priority: int
    fairshare_weight: float
    rates: dict[str, float] = Field(
        description="Grant units per IPU-hour of each machine type (1.0: an IPU-M2000 hour); a job's grant "
        "is spent at its type's rate x IPU-hours."
    )
    machine_types: list[str] = Field(description="The machine types the plan's tenants may run jobs on.")
    max_models: int = Field(description="Own ONNX models a tenant on this plan may keep.")
    max_model_bytes: int = Field(description="Bytes its stored graphs (weights stripped) may take together.")
    preemptible_discount: float = Field(
        0.5, description="Preemptible jobs run at the plan's rates times (1 - this): 0.5 is half price."
    )
    checkpoint_retention_s: int = Field(
        7 * 86400,
        description="How long after a job stopped at its time limit its owner may still resume it from its "
        "checkpoint.",
    )
    never_preempt: bool = Field(
        False,
        description="Its tenants' jobs are never preempted for other work (charged as without this), "
        "whatever each job says.",
    )
    updated_at: datetime

    @classmethod
    def of(cls, p: Plan) -> PlanOut:
        return cls(
            name=p.name,
            kind=p.kind,
            description=p.description,
            quota_ipu_hours=p.quota_ipu_hours,
            trial_days=p.trial_days,
            max_partition_size=p.max_partition_size,
            max_concurrent_jobs=p.max_concurrent_jobs,
            max_queued_jobs=p.max_queued_jobs,
            max_runtime_s=p.max_runtime_s,
            idle_timeout_s=p.idle_timeout_s,
            max_session_s=p.max_session_s,
            max_endpoints=p.max_endpoints,
            max_endpoint_replicas=p.max_endpoint_replicas,
            max_endpoint_ipus=p.max_endpoint_ipus,
            max_array_size=p.max_array_size,
            priority=p.priority,
            fairshare_weight=p.fairshare_weight,
            rates=plan_rates(p.rates),
            machine_types=list(allowed_types(p.machine_types)),
            max_models=p.max_models,
            max_model_bytes=p.max_model_bytes,
            preemptible_discount=p.preemptible_discount,
            checkpoint_retention_s=p.checkpoint_retention_s,
            never_preempt=bool(p.never_preempt),
            updated_at=p.updated_at,
        )


class PlanUpdate(BaseModel):
    """Fields to change; null or absent fields stay as they are (`trial_days` null: no expiry)."""

    model_config = ConfigDict(extra="forbid")

    description: Annotated[str, StringConstraints(max_length=500, pattern=OPTIONAL_TEXT)] | None = None
    quota_ipu_hours: Hours | None = None
    trial_days: Days | None = None
    max_partition_size: Size | None = Field(None, description="A power of two (IPUs).")
    max_concurrent_jobs: Count | None = None
    max_queued_jobs: Count | None = None
    max_runtime_s: Seconds | None = None
    idle_timeout_s: Seconds | None = None
    max_session_s: Seconds | None = None
    max_endpoints: Annotated[int, Field(ge=0, le=1_000_000), JSON_NUMBER] | None = Field(
        None, description="0: the plan's tenants may not serve models."
    )
    max_endpoint_replicas: Annotated[int, Field(ge=1, le=1_000_000), JSON_NUMBER] | None = None
    max_endpoint_ipus: Annotated[int, Field(ge=0, le=2**31 - 1), JSON_NUMBER] | None = None
    max_array_size: Annotated[int, Field(ge=1, le=10_000), JSON_NUMBER] | None = None
    priority: Priority | None = None
    fairshare_weight: Weight | None = None
    rates: dict[MachineTypeName, Rate] | None = Field(
        None, description="Rates to change, by machine type (types not named keep theirs)."
    )
    machine_types: (
        Annotated[list[MachineTypeName], Field(min_length=1, max_length=len(MACHINE_TYPE_NAMES))] | None
    ) = Field(None, description="The machine types the plan's tenants may use.")
    max_models: Annotated[int, Field(ge=0, le=1_000_000), JSON_NUMBER] | None = None
    max_model_bytes: Annotated[int, Field(ge=0, le=2**50), JSON_NUMBER] | None = None
    preemptible_discount: Annotated[float, Field(ge=0, le=0.95), JSON_NUMBER] | None = None
    checkpoint_retention_s: Seconds | None = None
    never_preempt: Annotated[bool, Field(strict=True)] | None = Field(
        None, description="Opt every job of the plan's tenants out of preemption (true) or not (false)."
    )
