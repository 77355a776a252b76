"""The job spec of the API's contract (docs/tenancy.md), validated at the edge and stored as submitted."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from scheduler.text import LINE
from vipu.machine_types import MACHINE_TYPE_NAMES
from vipu.partitions import check_gcds, check_size, is_power_of_two

Name = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]
PartitionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]

SessionId = Annotated[str, StringConstraints(pattern=r"^ses_[0-9a-z]{26}$")]

MAX_FLEET_IPUS = 65_536

# Checkpoint intervals a job may ask for, in cluster seconds: often enough to lose little, not so often
# that checkpoint rows become the write load of the cloud (docs/checkpoints.md).
MIN_CHECKPOINT_EVERY_S = 60
MAX_CHECKPOINT_EVERY_S = 7 * 24 * 3600
DEFAULT_CHECKPOINT_EVERY_S = 600

# A machine type from the registry, or `any`: the scheduler picks (vipu/machine_types.py).
MachineChoice = Literal[(*MACHINE_TYPE_NAMES, "any")]  # type: ignore[valid-type]


DimName = Annotated[str, StringConstraints(min_length=1, max_length=100)]
DimSize = Annotated[int, Field(ge=1, le=1_048_576)]


class WorkloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: Annotated[str, StringConstraints(min_length=1, max_length=100)] = Field(
        description="Catalogue name, e.g. `bert-large` (see GET /api/v1/workloads), or the id or name of one "
        "of your own models (GET /api/v1/models)."
    )
    task: Literal["train", "infer"] = "train"
    batch_size: int | None = Field(None, ge=1, le=1_048_576, description="Global batch size.")
    seq_len: int | None = Field(None, ge=1, le=65_536)
    precision: Literal["fp16", "fp32"] = "fp16"
    steps: int | None = Field(None, ge=1, le=1_000_000_000)
    samples: int | None = Field(None, ge=1, le=1_000_000_000_000)
    dims: dict[DimName, DimSize] | None = Field(
        None,
        max_length=32,
        description="Own models only: sizes of the graph's dynamic dimensions by name (`seq_len` sets the "
        "sequence ones); the model's defaults fill in the rest.",
    )
    optimizer: Literal["sgd", "sgd-momentum", "adam", "lamb", "rmsprop"] | None = Field(
        None,
        description="Own models only: how it trains (default adam); catalogue models use their recipe's.",
    )

    @model_validator(mode="after")
    def _steps_or_samples(self) -> WorkloadRequest:
        if self.steps is not None and self.samples is not None:
            raise ValueError("give `steps` or `samples`, not both")
        return self


NotifyOn = Literal["start", "end", "fail", "requeue", "time_limit", "all"]


class JobNotify(BaseModel):
    """What of a job's life mails its submitter, as Slurm's `--mail-type`
    (scheduler/services/tenancy/mail.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    on: list[NotifyOn] = Field(
        max_length=6,
        description="`start` (it runs), `end` (succeeded, failed or cancelled), `fail`, "
        "`requeue` (preempted), "
        "`time_limit` (50/80/90% of max_runtime_s) or `all`; empty: none.",
    )


# Jobs arrays, sweeps and dependencies (docs/sweeps.md, scheduler/services/batch/arrays.py).
MAX_ARRAY_SIZE = 10_000  # no plan allows more elements in one array or sweep
MAX_ARRAY_INDEX = 999_999  # indices are 0 ... this (Slurm's MaxArraySize is a million too)
MAX_DEPENDENCIES = 64
MAX_SWEEP_PARAMETERS = 16
MAX_SWEEP_VALUES = 1_000
# What a sweep may vary: paths into the job spec (a dim of an own model: `workload.dims.<name>`).
SWEEPABLE = frozenset(
    {
        "ipus",
        "machine",
        "priority",
        "max_runtime_s",
        "preemptible",
        "checkpoint_every_s",
        "workload.batch_size",
        "workload.seq_len",
        "workload.precision",
        "workload.steps",
        "workload.samples",
        "workload.optimizer",
        "workload.task",
        "workload.model",
    }
)
_INDICES = r"^[0-9]{1,6}(-[0-9]{1,6}(:[0-9]{1,6})?)?(,[0-9]{1,6}(-[0-9]{1,6}(:[0-9]{1,6})?)?)*$"
Indices = Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=_INDICES)]
SweepValue = Annotated[str, StringConstraints(max_length=100)] | int | float | bool


def parse_indices(text: str, *, limit: int = MAX_ARRAY_SIZE) -> list[int]:
    """Slurm's array syntax: `0-99`, `0-99:2` (a step), `1,5,7`, or a list of those; sorted, no repeats.
    Raises ValueError naming the fault, and before expanding anything when it would pass `limit`."""
    parts: list[range] = []
    total = 0
    for part in text.split(","):
        lo_hi, _, step_s = part.partition(":")
        lo_s, _, hi_s = lo_hi.partition("-")
        lo = int(lo_s)
        hi = int(hi_s) if hi_s else lo
        step = int(step_s) if step_s else 1
        if hi < lo:
            raise ValueError(f"range {part!r} ends before it starts")
        if step < 1:
            raise ValueError(f"range {part!r} has a step of 0")
        if hi > MAX_ARRAY_INDEX:
            raise ValueError(f"indices go up to {MAX_ARRAY_INDEX}")
        r = range(lo, hi + 1, step)
        total += len(r)
        if total > limit:
            raise ValueError(f"more than {limit:,} elements")
        parts.append(r)
    return sorted({i for r in parts for i in r})


def compress_indices(indices: list[int]) -> str:
    """Sorted indices as Slurm writes them: `0-3,7,9-10` ("" for none)."""
    out: list[str] = []
    start = prev = None
    for i in indices:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


class ArrayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    indices: Indices | None = Field(
        None,
        description="Slurm's syntax: `0-99`, `0-99:2` (a step), `1,5,7` or a list of those. Omitted with a "
        "`sweep`: one element per point, 0 ... n-1.",
    )
    max_running: int | None = Field(
        None, ge=1, le=MAX_ARRAY_SIZE, description="At most this many elements run at once (Slurm's `%n`)."
    )

    @model_validator(mode="after")
    def _parse(self) -> ArrayRequest:
        if self.indices is not None:
            parse_indices(self.indices)  # ValueError -> 422 naming `array`
        return self


class SweepParameter(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    values: list[SweepValue] | None = Field(None, min_length=1, max_length=MAX_SWEEP_VALUES)
    min: float | None = None
    max: float | None = None
    distribution: Literal["uniform", "int_uniform", "log_uniform"] = "uniform"

    @model_validator(mode="after")
    def _one_kind(self) -> SweepParameter:
        if self.values is not None:
            if self.min is not None or self.max is not None:
                raise ValueError("give `values` or `min` and `max`, not both")
            return self
        if self.min is None or self.max is None:
            raise ValueError("give `values`, or `min` and `max`")
        if self.max < self.min:
            raise ValueError("`max` is below `min`")
        if self.distribution == "log_uniform" and self.min <= 0:
            raise ValueError("a log_uniform range starts above 0")
        return self


class SweepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    method: Literal["grid", "random"] = "grid"
    parameters: dict[Annotated[str, StringConstraints(min_length=1, max_length=100)], SweepParameter] = Field(
        min_length=1,
        max_length=MAX_SWEEP_PARAMETERS,
        description="Paths into the job spec (`workload.batch_size`, `ipus`, `workload.dims.<name>`, ...) "
        "and what each takes: `values`, or (random only) `min`, `max` and a `distribution`.",
    )
    samples: int | None = Field(None, ge=1, le=MAX_ARRAY_SIZE, description="Random: how many points.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Random: the same seed draws the same points.")

    @model_validator(mode="after")
    def _size(self) -> SweepRequest:
        for path in self.parameters:
            if path not in SWEEPABLE and not (
                path.startswith("workload.dims.") and len(path) > len("workload.dims.")
            ):
                raise ValueError(f"{path!r} is no field of the job spec a sweep can vary")
        if self.method == "grid":
            if self.samples is not None:
                raise ValueError("`samples` is for random sweeps; a grid has one element per point")
            size = 1
            for path, p in self.parameters.items():
                if p.values is None:
                    raise ValueError(f"a grid needs `values` for {path!r}, not a range")
                size *= len(p.values)
                if size > MAX_ARRAY_SIZE:
                    raise ValueError(f"the grid has more than {MAX_ARRAY_SIZE:,} points")
        elif self.samples is None:
            raise ValueError("a random sweep needs `samples`")
        return self


DependencyType = Literal["after", "afterany", "afterok", "afternotok", "aftercorr"]
UpstreamId = Annotated[str, StringConstraints(pattern=r"^(job|arr)_[0-9a-z]{26}$")]


class Dependency(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    job: UpstreamId = Field(description="A job (`job_...`) or an array (`arr_...`) of yours.")
    type: DependencyType = Field(
        "afterok",
        description="`after`: once it started; `afterany`: once it ended; `afterok`: once it succeeded; "
        "`afternotok`: once it failed or was cancelled; `aftercorr`: array on array, element i after "
        "element i succeeded. An array satisfies a condition when all its elements do.",
    )


class DependsOn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    all: list[Dependency] | None = Field(None, min_length=1, max_length=MAX_DEPENDENCIES)
    any: list[Dependency] | None = Field(None, min_length=1, max_length=MAX_DEPENDENCIES)

    @model_validator(mode="after")
    def _one(self) -> DependsOn:
        if (self.all is None) == (self.any is None):
            raise ValueError("give `all` or `any`")
        return self

    @property
    def mode(self) -> str:
        return "all" if self.all is not None else "any"

    @property
    def items(self) -> list[Dependency]:
        return self.all if self.all is not None else (self.any or [])


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name
    workload: WorkloadRequest
    ipus: int | Literal["auto"] = Field(
        description="Partition size: a power of two, or `auto` for the smallest that fits."
    )
    machine: MachineChoice | None = Field(
        "any",
        description="A machine type, or `any` (the default, also what null means): the scheduler runs the "
        "job where it is predicted to finish first, counting the wait and the run time on each type.",
    )
    prefer: Literal["time", "cost"] = Field(
        "time",
        description="With `machine` `any`: `time` runs it where it finishes first, `cost` where it spends "
        "the least of the grant (rate x IPU-hours).",
    )
    partition: PartitionName | None = Field(None, description="Run inside this reserved partition.")
    session: SessionId | None = Field(
        None,
        description="Run in this active session of yours (POST /api/v1/sessions): it starts at once on the "
        "session's partition, billed as part of the session.",
    )
    priority: int = Field(
        0,
        ge=-100,
        le=100,
        description="Orders your own queued jobs (higher first, then older first). It never ranks them "
        "against other tenants' jobs: fair share and your plan's priority, set by an admin, do that.",
    )
    max_runtime_s: int | None = Field(None, ge=1, le=365 * 24 * 3600)
    preemptible: bool = Field(
        False,
        description="Run at the plan's discounted rate; non-preemptible work of any tenant may then stop "
        "it, after a warning in which it checkpoints, and it requeues by itself (docs/checkpoints.md).",
    )
    never_preempt: bool = Field(
        False,
        description="Never stop this job for other work (it waits its turn instead of being preempted); "
        "charged exactly as without the flag. Not with `preemptible` (docs/scheduling.md).",
    )
    checkpoint_every_s: int | None = Field(
        None,
        ge=MIN_CHECKPOINT_EVERY_S,
        le=MAX_CHECKPOINT_EVERY_S,
        description="Training jobs: cluster seconds between checkpoints (default 600). A new attempt "
        "after a platform fault or a preemption resumes from the last one.",
    )
    notify: JobNotify | None = Field(
        None,
        description='E-mail its submitter about it, e.g. `{"on": ["end", "fail"]}` as Slurm\'s --mail-type, '
        "whatever their notification settings say.",
    )
    array: ArrayRequest | None = Field(
        None, description="Submit a job array: one element per index, answered with the array (`arr_...`)."
    )
    sweep: SweepRequest | None = Field(
        None, description="Submit a parameter sweep: one element per point, answered with the array."
    )
    depends_on: DependsOn | None = Field(
        None, description="Start only once these jobs or arrays of yours reach a state (docs/sweeps.md)."
    )
    on_unsatisfiable: Literal["cancel", "hold"] = Field(
        "cancel",
        description="When its dependencies can no longer be met: `cancel` it (saying why), or `hold` it "
        "queued (Slurm's way) until you cancel it.",
    )
    singleton: bool = Field(
        False, description="Run only when no other job of yours with this name is running."
    )

    @model_validator(mode="after")
    def _size(self) -> JobSpec:
        if self.session is not None and self.partition is not None:
            raise ValueError("give `session` or `partition`, not both")
        if self.preemptible and self.never_preempt:
            raise ValueError("give `preemptible` or `never_preempt`, not both")
        if self.array is not None and self.array.indices is None and self.sweep is None:
            raise ValueError("an array needs `indices` (or a `sweep` to make its elements)")
        if self.array is not None and self.array.indices is not None and self.sweep is not None:
            raise ValueError("a sweep makes its own indices: give `array` only its `max_running`")
        if (self.array is not None or self.sweep is not None) and self.session is not None:
            raise ValueError("an array or sweep cannot run in a session")
        if isinstance(self.ipus, int):
            if self.ipus < 1 or self.ipus > MAX_FLEET_IPUS:
                raise ValueError(f"ipus must be between 1 and {MAX_FLEET_IPUS}")
            if not is_power_of_two(self.ipus):
                raise ValueError("ipus must be a power of two (1, 2, 4, ... 65536): partitions are")
        return self


MAX_SESSION_S = 365 * 24 * 3600


def json_number(value: object) -> object:
    """For a number field validated laxly (so that 3600.0, an integer in JSON Schema, is 3600): lax
    mode would also read `true` as 1 and "5" as 5, and a JSON number it must be."""
    if isinstance(value, bool | str):
        raise ValueError("must be a JSON number")
    return value


# Bounds go inside, before the validator, or the spec would lose them (pydantic cannot push them
# through a before-validator into JSON Schema).
JSON_NUMBER = BeforeValidator(json_number)
SessionSeconds = Annotated[int, Field(ge=1, le=MAX_SESSION_S, strict=False), JSON_NUMBER]


class SessionSpec(BaseModel):
    """`POST /api/v1/sessions`: a partition held for the tenant's jobs (scheduler/services/sessions/)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name | None = None
    ipus: int = Field(description="Partition size: a power of two.")
    machine: MachineChoice | None = Field(
        "any", description="A machine type, or `any` (the default): wherever it can start first."
    )
    max_duration_s: SessionSeconds | None = Field(
        None,
        description="Cluster seconds the session may hold its partition; default and ceiling: the plan's "
        "`max_session_s` (six hours on trial plans).",
    )
    idle_timeout_s: SessionSeconds | None = Field(
        None,
        description="Cluster seconds with no job running after which it ends; default: the plan's "
        "`idle_timeout_s`.",
    )
    gcds: int = Field(
        1,
        ge=1,
        le=MAX_FLEET_IPUS,
        description="Graph compile domains to split the partition into: it runs one job in each at once.",
    )

    @model_validator(mode="after")
    def _size(self) -> SessionSpec:
        # The partition rules are vipu/partitions.py's; its errors are ValueErrors pydantic reports.
        check_size(self.ipus)
        check_gcds(self.ipus, self.gcds)
        return self


class SessionChange(BaseModel):
    """`PATCH /api/v1/sessions/{id}`: give a starting or active session more time, or another idle
    timeout. Both are totals in cluster seconds, as at its start, so repeating a change is harmless;
    a field left out (or null) is left as it is, as in the API's other PATCH bodies."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_duration_s: SessionSeconds | None = Field(
        None,
        description="The new maximum duration, counted from the session's start: at least the present "
        "one (end the session to stop sooner) and at most the plan's `max_session_s`. The added time is "
        "reserved from the grant at the session's rate.",
    )
    idle_timeout_s: SessionSeconds | None = Field(
        None,
        description="Cluster seconds with no job running after which it ends, counted from when it last "
        "had one.",
    )
