"""Jobs, arrays and sweeps: a job's answer and what it carries (progress, checkpoints, the wait,
dependencies), an array's, the changes to an array, and a job's log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, StringConstraints


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
