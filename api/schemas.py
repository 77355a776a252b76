"""Response and request bodies of the HTTP API (the job spec itself lives in scheduler.jobspec)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import Query
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    EmailStr,
    Field,
    RootModel,
    StringConstraints,
)

from scheduler.errors import InvalidRequest
from scheduler.jobspec import JSON_NUMBER
from scheduler.models import ApiKey, Member, OwnModel, Plan, TrialApplication
from scheduler.services.tenancy.keys import key_state
from scheduler.services.tenancy.rates import allowed_types, plan_rates
from scheduler.text import LINE, OPTIONAL_TEXT, TEXT
from vipu.machine_types import MACHINE_TYPE_NAMES
from vipu.partitions import is_power_of_two
from vipu.topology import MAX_IPUS

T = TypeVar("T")

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]
TenantName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}$")]


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(
        None, description="Pass as `cursor` to get the next page; null at the end."
    )


# A cursor is the key of the last item of the previous page (an id, a name, a number), as Stripe's
# `starting_after` is: every string of this shape is a valid position, so a request with any such
# cursor gets a page (possibly empty), and anything else is refused before it reaches a query.
# Empty is the first page, as if no cursor were given.
CURSOR_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_.-]{0,99})?$"
INT_CURSOR_PATTERN = r"^([0-9]{1,18})?$"
CursorParam = Annotated[
    str | None,
    Query(max_length=100, pattern=CURSOR_PATTERN, description="`next_cursor` of the previous page."),
]
IntCursorParam = Annotated[
    str | None,
    Query(max_length=18, pattern=INT_CURSOR_PATTERN, description="`next_cursor` of the previous page."),
]


def encode_cursor(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def decode_cursor(cursor: str | None) -> str | None:
    if cursor is None or cursor == "":
        return None
    if not re.fullmatch(CURSOR_PATTERN, cursor):
        raise InvalidRequest("cursor is not one this API returned.", field="cursor")
    return cursor


def decode_int_cursor(cursor: str | None) -> int | None:
    if cursor is None or cursor == "":
        return None
    if not re.fullmatch(INT_CURSOR_PATTERN, cursor):
        raise InvalidRequest("cursor is not one this API returned.", field="cursor")
    return int(cursor)


class HistoryEntry(BaseModel):
    at: datetime
    message: str
    state: str | None = None
    attempt: int | None = None


class WaitReason(BaseModel):
    reason: str
    detail: str
    behind: list[str] = Field(
        default_factory=list, description="Ids of the caller's own jobs this one waits behind."
    )
    behind_other_tenants: int = Field(0, description="How many jobs of other tenants it waits behind.")
    estimated_start: datetime | None = Field(
        None,
        description="Wall clock (UTC): when the scheduling policy forecasts it starts. Durations in "
        "seconds (`*_s`) are cluster time; this is a moment on the wall clock.",
    )


class Progress(BaseModel):
    model_config = ConfigDict(extra="allow")

    phase: str | None = Field(
        None, description="`compile`, `load`, `run` or `done`: compile and load are phases of their own."
    )
    step: int | None = Field(None, description="The job's steps done (a checkpoint's included).")
    steps: int | None = None
    samples: int | None = None
    percent: float | None = Field(
        None,
        description="Share of the job's steps done, 0 to 100: compiling and loading move no percent, and a "
        "run resumed from a checkpoint starts at the checkpoint's share.",
    )
    eta_s: float | None = Field(None, description="Cluster seconds until the run ends.")
    throughput: float | None = Field(None, description="Samples per cluster second while running.")
    memory_per_ipu_bytes: int | None = None
    cluster_s: float | None = Field(
        None,
        description="Cluster seconds this attempt has run; it stops when its host agent stops answering.",
    )


class CheckpointOut(BaseModel):
    step: int
    steps: int
    samples: int
    executable: str = Field(description="The executable key it ran; a resume on the same type reuses it.")
    machine_type: str
    attempt: int
    run_s: float = Field(description="The job's run time (cluster s) kept by this checkpoint.")
    reason: Literal["periodic", "preemption", "time_limit", "shutdown"]
    at: datetime


class JobOut(BaseModel):
    id: str
    name: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    reason: str | None = None
    ipus: int
    ipus_requested: str
    machine: str | None = Field(
        None, description="The machine type it runs (or ran) on; `any` until placed if it named none."
    )
    prefer: Literal["time", "cost"] = "time"
    machine_options: dict[str, dict[str, float]] | None = Field(
        None,
        description="Per machine type it may run on: `ipus`, `predicted_runtime_s` and `rate` (grant units "
        "per IPU-hour).",
    )
    partition: str | None = None
    session: str | None = Field(None, description="The session it runs in (POST /api/v1/sessions), if any.")
    priority: int
    workload: dict[str, Any]
    max_runtime_s: int | None = Field(None, description="Its time limit in cluster seconds.")
    predicted_runtime_s: float = Field(description="Cluster seconds it is predicted to run.")
    cancel_requested: bool
    attempts: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: Progress | None = None
    used_ipu_hours: float | None = None
    history: list[HistoryEntry] | None = None
    wait: WaitReason | None = None
    preemptible: bool = False
    never_preempt: bool = Field(
        False,
        description="It opted out of preemption: never stopped for other work (a plan can opt out all "
        "its jobs).",
    )
    checkpoint_every_s: int | None = Field(
        None, description="Training jobs: cluster seconds between checkpoints (600 unless it asked)."
    )
    checkpoints: list[CheckpointOut] | None = Field(
        None, description="`GET /jobs/{id}` only: its newest checkpoints, newest first (at most 20)."
    )
    checkpoint_count: int | None = None
    resumable_until: datetime | None = Field(
        None,
        description="Wall clock (UTC). A job stopped by its time limit with a checkpoint: until when its "
        "owner may resume it (`POST /jobs/{id}/resume`), the plan's checkpoint retention (wall seconds) "
        "after it stopped.",
    )
    array_id: str | None = Field(None, description="The array or sweep it is an element of (`arr_...`).")
    array_index: int | None = None
    params: dict[str, Any] | None = Field(
        None, description="A sweep's element: the value of each swept parameter (by its path in the spec)."
    )
    depends_on: DependsOnOut | None = None
    singleton: bool = False
    folded: FoldedOut | None = Field(
        None,
        description="`GET /jobs` without `expand`: this row stands for several queued elements of one array "
        "(`arr_..._[5-99]`), the first of which it shows.",
    )


class DependencyOut(BaseModel):
    job: str
    type: Literal["after", "afterany", "afterok", "afternotok", "aftercorr"]


class DependsOnOut(BaseModel):
    mode: Literal["all", "any"]
    on: list[DependencyOut]
    on_unsatisfiable: Literal["cancel", "hold"] = "cancel"


class FoldedOut(BaseModel):
    label: str = Field(description="Slurm's way: `arr_..._[5-99]`.")
    count: int
    indices: str


class ArrayOut(BaseModel):
    id: str
    name: str
    size: int
    indices: str
    max_running: int | None = None
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    elements_by_state: dict[str, int]
    completed_indices: str = Field(description="Elements that succeeded, as `0-3,7`.")
    failed_indices: str = Field(description="Elements that failed or were cancelled, as `4-6`.")
    progress_percent: float = Field(description="Share of the elements that ended, 0 to 100.")
    used_ipu_hours: float
    reserved_ipu_hours: float = Field(description="What its queued and running elements still hold.")
    sweep: dict[str, Any] | None = None
    depends_on: DependsOnOut | None = None
    created_at: datetime


class SubmitOut(RootModel[JobOut | ArrayOut]):
    """`POST /jobs`: the job, or with `array` or `sweep` the array (its `id` starts `arr_`)."""


class ArrayPatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_running: int | None = Field(
        None,
        description="At most this many elements run at once; null lifts the limit, leaving it out keeps it.",
        ge=1,
        le=10_000,
    )


class ArrayIndices(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    indices: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = Field(
        None,
        description="Slurm's syntax (`1,5,10-20`); `failed` (retry only) for every failed or cancelled "
        "element; omitted (cancel only) for all of them.",
    )


class ArrayActionOut(BaseModel):
    array: ArrayOut
    job_ids: list[str] = Field(description="The elements it changed.")


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


def _json_text(value: object) -> object:
    # Lax mode would read a number, or a string like "0.5", as a Unix time: RFC 3339 it must be.
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not re.match(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt]", value):
        raise ValueError("must be an RFC 3339 date-time string")
    return value


def _sane_year(value: datetime) -> datetime:
    if not 1970 <= value.year <= 2999:
        raise ValueError("the year must be between 1970 and 2999")
    return value.astimezone(UTC)


# The year range is in the spec as a pattern (formats cannot bound dates), so what the spec
# allows is exactly what is accepted, and no accepted date overflows when converted to UTC.
DATETIME_PATTERN = r"^(19[7-9][0-9]|2[0-9]{3})-"
UtcDatetime = Annotated[
    AwareDatetime,
    BeforeValidator(_json_text),
    AfterValidator(_sane_year),
    Field(
        description="An RFC 3339 date-time with a timezone, years 1970 to 2999, e.g. `2027-01-31T00:00:00Z`.",
        json_schema_extra={"pattern": DATETIME_PATTERN},
    ),
]


# Bounds go inside, before the validator, or the spec would lose them (pydantic cannot push them
# through a before-validator into JSON Schema).
_NUMBER = JSON_NUMBER
Hours = Annotated[float, Field(ge=0, le=100_000_000, allow_inf_nan=False), _NUMBER]
Weight = Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False), _NUMBER]
Days = Annotated[int, Field(ge=1, le=3650), _NUMBER]
Size = Annotated[int, Field(ge=1, le=65_536), _NUMBER]
Count = Annotated[int, Field(ge=1, le=10_000_000), _NUMBER]
Seconds = Annotated[int, Field(ge=1, le=10 * 365 * 24 * 3600), _NUMBER]
Priority = Annotated[int, Field(ge=-1000, le=1000), _NUMBER]
Rate = Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False), _NUMBER]
MachineTypeName = Literal[MACHINE_TYPE_NAMES]  # type: ignore[valid-type]
POWERS_OF_TWO = [2**i for i in range(17)]


def _power_of_two(value: int | None) -> int | None:
    if value is not None and (not is_power_of_two(value) or value > MAX_IPUS):
        raise ValueError("must be a power of two from 1 to 65536")
    return value


# A partition size in a query: the spec lists the powers of two V-IPU allows (a Literal would not
# read "4" from a query string as 4).
PowerOfTwoQuery = Annotated[
    int | None,
    Query(ge=1, le=65_536, json_schema_extra={"enum": POWERS_OF_TWO}),
    AfterValidator(_power_of_two),
]
# Plans are the five a cloud is seeded with (they are edited, never created), so a body naming
# one can say exactly which names exist.
PlanName = Literal["internal", "standard", "trial", "trial-business", "trial-university"]
Email = Annotated[EmailStr, StringConstraints(max_length=254)]
PersonName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]


class Problem(BaseModel):
    """An RFC 9457 problem: every error this API returns has this shape."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="A URI reference to the problem type, e.g. `/problems/quota-exceeded`.")
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = Field(
        None, description="For invalid requests: each field that is wrong and why."
    )


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


# Tenants, members, plans ------------------------------------------------------------------------------


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TenantName
    plan: PlanName = "trial"
    quota_ipu_hours: Hours | None = Field(None, description="Default: the plan's grant.")
    expires_at: UtcDatetime | None = Field(None, description="Default: the plan's trial length, if any.")
    fairshare_weight: Weight | None = None
    owner_email: Email | None = None


class TenantUpdate(BaseModel):
    """Fields to change; a null leaves the field as it is, except `expires_at` (null: never expires)."""

    model_config = ConfigDict(extra="forbid")

    plan: PlanName | None = None
    quota_ipu_hours: Hours | None = None
    expires_at: UtcDatetime | None = None
    fairshare_weight: Weight | None = None
    status: Literal["active", "suspended"] | None = None


class TenantOut(BaseModel):
    id: str
    name: str
    plan: str
    status: Literal["active", "suspended", "expired"] = Field(
        description="`expired`: active, but its trial has ended (it can read, not submit)."
    )
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
    gcds: int = Field(description="Graph compile domains: a reserved partition runs one job in each.")
    reconfigurable: bool
    job: str | None = Field(None, description="The job it was made for, or the first job running in it.")
    jobs: list[str] = Field(default_factory=list, description="Every job running in it, one per GCD.")
    state: Literal["active", "released"]
    created_at: datetime
    released_at: datetime | None = None


class MemberOut(BaseModel):
    id: str
    tenant_id: str
    email: str
    name: str
    role: Literal["owner", "member"]
    created_at: datetime

    @classmethod
    def of(cls, m: Member) -> MemberOut:
        return cls(
            id=m.id,
            tenant_id=m.tenant_id or "",
            email=m.email,
            name=m.name,
            role=m.role,
            created_at=m.created_at,
        )


class MemberCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: Email
    name: PersonName = Field(description="How the member is shown.")
    role: Literal["owner", "member"] = "member"


class MemberUpdate(BaseModel):
    """Null or absent fields stay as they are."""

    model_config = ConfigDict(extra="forbid")

    name: PersonName | None = None
    role: Literal["owner", "member"] | None = None


class MemberRemoved(MemberOut):
    revoked_keys: int = Field(description="How many of the member's keys were revoked with it.")


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
    max_endpoints: Annotated[int, Field(ge=0, le=1_000_000), _NUMBER] | None = Field(
        None, description="0: the plan's tenants may not serve models."
    )
    max_endpoint_replicas: Annotated[int, Field(ge=1, le=1_000_000), _NUMBER] | None = None
    max_endpoint_ipus: Annotated[int, Field(ge=0, le=2**31 - 1), _NUMBER] | None = None
    max_array_size: Annotated[int, Field(ge=1, le=10_000), _NUMBER] | None = None
    priority: Priority | None = None
    fairshare_weight: Weight | None = None
    rates: dict[MachineTypeName, Rate] | None = Field(
        None, description="Rates to change, by machine type (types not named keep theirs)."
    )
    machine_types: (
        Annotated[list[MachineTypeName], Field(min_length=1, max_length=len(MACHINE_TYPE_NAMES))] | None
    ) = Field(None, description="The machine types the plan's tenants may use.")
    max_models: Annotated[int, Field(ge=0, le=1_000_000), _NUMBER] | None = None
    max_model_bytes: Annotated[int, Field(ge=0, le=2**50), _NUMBER] | None = None
    preemptible_discount: Annotated[float, Field(ge=0, le=0.95), _NUMBER] | None = None
    checkpoint_retention_s: Seconds | None = None
    never_preempt: Annotated[bool, Field(strict=True)] | None = Field(
        None, description="Opt every job of the plan's tenants out of preemption (true) or not (false)."
    )


# API keys ---------------------------------------------------------------------------------------------

Scope = Literal["read", "submit", "invoke", "admin"]
TenantScope = Literal["read", "submit", "invoke"]
KeyName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]


class ApiKeyOut(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="The key's first characters, to recognise it; never the secret.")
    scopes: list[Scope]
    tenant_id: str | None = None
    member_id: str | None = None
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = Field(None, description="Within a minute.")
    created_by: str | None = Field(None, description="The id of the key that created this one.")

    @classmethod
    def of(cls, k: ApiKey) -> ApiKeyOut:
        return cls(**_key_fields(k))


def _key_fields(k: ApiKey) -> dict[str, Any]:
    return dict(
        id=k.id,
        name=k.name,
        prefix=f"ipuc_{k.lookup[:6]}",
        scopes=k.scopes.split(),
        tenant_id=k.tenant_id,
        member_id=k.member_id,
        state=key_state(k),
        created_at=k.created_at,
        expires_at=k.expires_at,
        revoked_at=k.revoked_at,
        last_used_at=k.last_used_at,
        created_by=k.created_by,
    )


class ApiKeyCreated(ApiKeyOut):
    api_key: str = Field(description="The key itself. Shown once: store it now.")

    @classmethod
    def created(cls, k: ApiKey, api_key: str) -> ApiKeyCreated:
        return cls(**_key_fields(k), api_key=api_key)


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: KeyName
    scopes: list[Scope] | None = Field(
        None,
        min_length=1,
        max_length=4,
        description="Default: the creating key's scopes. A key never gets a scope its creator lacks.",
    )
    expires_at: UtcDatetime | None = Field(
        None,
        description="Default: never, or the creating key's expiry if it has one (a key cannot outlive it).",
    )
    member_id: Annotated[str, StringConstraints(min_length=1, max_length=40)] | None = Field(
        None, description="Owners may create a key for another member of the tenant; default: yourself."
    )


class AdminKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: KeyName
    scopes: list[TenantScope] | None = Field(
        None,
        min_length=1,
        max_length=3,
        description="Default: all three. A key with only `invoke` calls the tenant's inference endpoints "
        "and nothing else.",
    )
    expires_at: UtcDatetime | None = None
    member_id: Annotated[str, StringConstraints(min_length=1, max_length=40)] | None = Field(
        None, description="The member the key belongs to; default: the tenant's first owner."
    )


# Trials -----------------------------------------------------------------------------------------------

Category = Literal["business", "university", "individual"]
TrialStatus = Literal["pending", "approved", "rejected"]


class TrialApplicationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: PersonName = Field(description="Your name.")
    email: Email
    organisation: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=LINE)] = Field(
        description="Company, university or project (individuals: anything that describes you)."
    )
    category: Category
    intended_use: Annotated[str, StringConstraints(min_length=10, max_length=5000, pattern=TEXT)] = Field(
        description="What you want to run on IPUs (10 to 5000 characters)."
    )


class TrialReceipt(BaseModel):
    """What an applicant gets back: the application as recorded."""

    id: str
    status: TrialStatus
    name: str
    email: str
    organisation: str
    category: Category
    created_at: datetime

    @classmethod
    def of(cls, a: TrialApplication) -> TrialReceipt:
        return cls(**_receipt_fields(a))


def _receipt_fields(a: TrialApplication) -> dict[str, Any]:
    return dict(
        id=a.id,
        status=a.status,
        name=a.name,
        email=a.email,
        organisation=a.organisation,
        category=a.category,
        created_at=a.created_at,
    )


class TrialApplicationOut(TrialReceipt):
    intended_use: str
    reason: str | None = None
    tenant_id: str | None = None
    plan: str | None = None
    decided_at: datetime | None = None
    decided_by: str | None = None

    @classmethod
    def of(cls, a: TrialApplication) -> TrialApplicationOut:
        return cls(
            **_receipt_fields(a),
            intended_use=a.intended_use,
            reason=a.reason,
            tenant_id=a.tenant_id,
            plan=a.plan,
            decided_at=a.decided_at,
            decided_by=a.decided_by,
        )


class TrialApprove(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: PlanName | None = Field(None, description="Default: the trial plan of the application's category.")
    hand_over_key: bool = Field(
        False,
        strict=True,  # true or false, not "yes": it decides who sees a secret
        description=(
            "Mint the tenant's first key now and answer it, for the admin to hand over (when mail cannot "
            "reach the applicant). Then no claim link is mailed; the applicant's mail says the key comes "
            "from the admin. Default: no key now; the applicant's claim link mints the first key."
        ),
    )


class TrialReject(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=TEXT)] = Field(
        description="Why; the applicant may be told."
    )


class TrialDecision(BaseModel):
    application: TrialApplicationOut
    tenant: TenantOut
    api_key: str | None = Field(
        description=(
            "The new tenant's first API key, only with `hand_over_key`: shown once, store it now. "
            "Otherwise null: the applicant's claim link mints the first key."
        )
    )


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


# Catalogue and fleet ---------------------------------------------------------------------------------
# These answers are built by vipu/ and scheduler/services/ as plain objects; the models below name
# the fields clients rely on and keep every other one (`extra="allow"`), so declaring them changed
# no answer.


class OpenOut(BaseModel):
    model_config = ConfigDict(extra="allow")


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


class FleetIpuOut(OpenOut):
    id: str
    partition: str | None = None
    tenant: str | None = None
    kind: str | None = None


class FleetMachineOut(OpenOut):
    id: str
    slot: int
    health: str
    reason: str | None = None
    ipus: list[FleetIpuOut] = Field(default_factory=list)


class FleetPodOut(OpenOut):
    """A unit of the fleet: a POD (layout `pod64` or `pod16`) or an IPU server (`server`)."""

    id: str
    index: int
    rack: str | None = None
    machine_type: str
    layout: str = "pod64"
    model: str | None = None
    machines: list[FleetMachineOut] = Field(default_factory=list)


class FleetOut(OpenOut):
    pods: list[FleetPodOut]
    summary: dict[str, Any] = Field(default_factory=dict, description="Free IPUs and fragmentation.")


class RackUnitOut(OpenOut):
    id: str
    index: int
    machine_type: str
    layout: str
    model: str | None = None
    ipus: int
    machines: dict[str, int] = Field(default_factory=dict, description="Machines by health.")


class RackOut(OpenOut):
    id: str
    index: int
    units: list[RackUnitOut] = Field(default_factory=list)
    ipus: int = 0
    drained: bool = False


class RacksOut(OpenOut):
    racks: list[RackOut]


class ServersAddedOut(OpenOut):
    servers: list[RackUnitOut]


class RackHealthOut(OpenOut):
    rack: str
    health: str
    machines: list[str]


class RetiredOut(OpenOut):
    rack: str | None = None
    retired: list[str]


class MachineOut(OpenOut):
    id: str
    pod: int | None = None
    slot: int | None = None
    machine_type: str | None = None
    health: str
    reason: str | None = None


class PartitionResetOut(OpenOut):
    partition: PartitionOut
    interrupted_job: str | None = None
    interrupted_jobs: list[str] = Field(default_factory=list)


# Health -----------------------------------------------------------------------------------------------


class HealthOut(BaseModel):
    """`/healthz`: the process answers."""

    status: Literal["ok"]


class ReadyOut(BaseModel):
    """`/readyz` when ready: every dependency's check is `ok`."""

    status: Literal["ready"]
    checks: dict[str, str] = Field(description="Each dependency (`database`, `redis`) and its state.")


class NotReadyOut(Problem):
    """`/readyz` when not ready (503): a problem naming each dependency's state."""

    checks: dict[str, str] = Field(
        description="Each dependency and its state: `ok`, `migrations pending` or `unreachable: ...`."
    )


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
