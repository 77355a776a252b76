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
    """What of a job's life mails its submitter, as Slurm's `--mail-type` (scheduler/services/mail.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    on: list[NotifyOn] = Field(
        max_length=6,
        description="`start` (it runs), `end` (succeeded, failed or cancelled), `fail`, "
        "`requeue` (preempted), "
        "`time_limit` (50/80/90% of max_runtime_s) or `all`; empty: none.",
    )


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

    @model_validator(mode="after")
    def _size(self) -> JobSpec:
        if self.session is not None and self.partition is not None:
            raise ValueError("give `session` or `partition`, not both")
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
    """`POST /api/v1/sessions`: a partition held for the tenant's jobs (scheduler/services/sessions.py)."""

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
