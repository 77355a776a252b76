"""The ``workload`` object of a job spec, validated against the catalogue and completed with its defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from vipu.emulator.catalogue import WORKLOAD_NAMES, Precision, Task, Workload, get_workload
from vipu.emulator.errors import WorkloadError

_FIELDS = ("model", "task", "batch_size", "seq_len", "precision", "steps", "samples")
MAX_STEPS = 10_000_000
MAX_SAMPLES = 10**13


def _int_field(name: str, value: object) -> int | None:
    if value is None:
        return None
    # bool is an int in Python, and a float like 8.0 is a typo we should not silently accept.
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(name, f"must be an integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What to run: a catalogue model, a task and its sizes, as in DESIGN.md's job spec.

    Omitted fields take the catalogue's defaults; exactly one of ``steps`` and ``samples`` may be
    given (neither means the workload's default steps). Every violation raises ``WorkloadError``
    naming the field. After construction all fields are filled in except the one of steps/samples
    the user did not give.
    """

    model: str
    task: Task = "train"
    batch_size: int | None = None
    seq_len: int | None = None
    precision: Precision | None = None
    steps: int | None = None
    samples: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or self.model not in WORKLOAD_NAMES:
            raise WorkloadError(
                "model", f"unknown model {self.model!r}; the catalogue has {', '.join(WORKLOAD_NAMES)}"
            )
        w = get_workload(self.model)
        if self.task not in ("train", "infer"):
            raise WorkloadError("task", f"must be 'train' or 'infer', got {self.task!r}")
        if self.task not in w.tasks:
            raise WorkloadError(
                "task", f"{w.name} supports {', '.join(w.tasks)} only ({w.task_notes[w.tasks[0]]})"
            )
        batch = _int_field("batch_size", self.batch_size)
        if batch is None:
            batch = w.default_batch_size
        if not w.min_batch_size <= batch <= w.max_batch_size:
            raise WorkloadError(
                "batch_size",
                f"{batch} is outside {w.min_batch_size}..{w.max_batch_size} for {w.name} (the global batch, "
                f"in {w.sample_unit}s)",
            )
        seq = _int_field("seq_len", self.seq_len)
        if w.seq_lens:
            if seq is None:
                seq = w.default_seq_len
            elif seq not in w.seq_lens:
                raise WorkloadError(
                    "seq_len",
                    f"{seq} is not offered for {w.name}; choose one of {', '.join(map(str, w.seq_lens))}",
                )
        elif seq is not None:
            what = (f"its image size is fixed at {w.image_size}" if w.image_size
                    else "it has no sequence length")
            raise WorkloadError("seq_len", f"does not apply to {w.name}: {what}")
        precision = self.precision if self.precision is not None else w.default_precision
        if precision not in w.precisions:
            raise WorkloadError("precision", f"must be one of {', '.join(w.precisions)}, got {precision!r}")
        steps = _int_field("steps", self.steps)
        samples = _int_field("samples", self.samples)
        if steps is not None and samples is not None:
            raise WorkloadError("steps", "give steps or samples, not both")
        if steps is not None and not 1 <= steps <= MAX_STEPS:
            raise WorkloadError("steps", f"must be between 1 and {MAX_STEPS:,}, got {steps}")
        if samples is not None and not 1 <= samples <= MAX_SAMPLES:
            raise WorkloadError("samples", f"must be between 1 and {MAX_SAMPLES:,}, got {samples}")
        if steps is None and samples is None:
            steps = w.default_steps
        # Frozen dataclass: fill in the defaults through object.__setattr__.
        object.__setattr__(self, "batch_size", batch)
        object.__setattr__(self, "seq_len", seq)
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "samples", samples)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadSpec:
        """Build from a job spec's ``workload`` object, rejecting keys the spec does not define."""
        if not isinstance(data, Mapping):
            raise WorkloadError("model", "the workload must be an object")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise WorkloadError(unknown[0], f"unknown field; the workload takes {', '.join(_FIELDS)}")
        if "model" not in data:
            raise WorkloadError("model", "is required")
        return cls(**{k: data[k] for k in _FIELDS if k in data})

    @property
    def workload(self) -> Workload:
        return get_workload(self.model)

    @property
    def global_batch(self) -> int:
        return cast(int, self.batch_size)

    @property
    def dtype(self) -> Precision:
        return cast(Precision, self.precision)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "model": self.model,
            "task": self.task,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "precision": self.precision,
        }
        if self.samples is not None:
            d["samples"] = self.samples
        else:
            d["steps"] = self.steps
        return d
