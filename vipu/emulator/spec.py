"""The ``workload`` object of a job spec, validated against the catalogue and completed with its defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from vipu.emulator.catalogue import WORKLOAD_NAMES, Workload, get_workload
from vipu.emulator.errors import WorkloadError
from vipu.emulator.graph import ModelGraph, Precision, Task

_FIELDS = ("model", "task", "batch_size", "seq_len", "precision", "steps", "samples", "dims", "optimizer")
MAX_STEPS = 10_000_000
MAX_SAMPLES = 10**13
MAX_DIMS = 32

Dims = tuple[tuple[str, int], ...]

# How an own graph is trained (the graph says what to compute, not how to train it): element-operations
# per parameter per update and optimizer state elements per parameter, as the catalogue's recipes count.
OPTIMIZERS: dict[str, tuple[int, int]] = {
    "sgd": (2, 0),
    "sgd-momentum": (4, 1),
    "adam": (12, 2),
    "lamb": (20, 2),
    "rmsprop": (8, 2),
}
DEFAULT_OPTIMIZER = "adam"


class GraphSource(Protocol):
    """A workload that is not in the catalogue: a tenant's own graph (``onnxgraph.OnnxWorkload``).

    Equal sources plan alike, so they compare (and hash) by what determines the graph: its content, the
    operators declared element-wise, the dimensions bound by default, and the cache scope.
    """

    label: str
    """What messages call it (the model's name)."""

    def __hash__(self) -> int: ...

    executable_identity: str
    """Goes into the executable key in place of a catalogue name: the graph's content digest and scope."""
    tasks: tuple[Task, ...]
    default_batch_size: int
    min_batch_size: int
    max_batch_size: int
    default_steps: int
    default_precision: Precision
    precisions: tuple[Precision, ...]

    def bindings(self, seq_len: int | None, dims: Mapping[str, int]) -> Dims: ...

    def graph(self, task: Task, bindings: Dims, seq_len: int | None, optimizer: str) -> ModelGraph: ...

    def max_ipus_per_replica(self, bindings: Dims) -> int: ...


def _int_field(name: str, value: object) -> int | None:
    if value is None:
        return None
    # bool is an int in Python, and a float like 8.0 is a typo we should not silently accept.
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(name, f"must be an integer, got {value!r}")
    return value


def _dims_field(value: object) -> dict[str, int]:
    if value is None:
        return {}
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = list(items)  # type: ignore[call-overload]
    except TypeError:
        raise WorkloadError("dims", "must be an object of dimension names and sizes")
    if len(pairs) > MAX_DIMS:
        raise WorkloadError("dims", f"at most {MAX_DIMS} dimensions, got {len(pairs)}")
    out: dict[str, int] = {}
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2 or not isinstance(pair[0], str):
            raise WorkloadError("dims", "must be an object of dimension names and sizes")
        name, size = pair
        if not 1 <= len(name) <= 100:
            raise WorkloadError("dims", f"dimension names are 1 to 100 characters, got {name!r}")
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1_048_576:
            raise WorkloadError("dims", f"{name}: must be an integer from 1 to 1,048,576, got {size!r}")
        out[name] = size
    return out


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What to run: a catalogue model or a tenant's own graph, a task and its sizes (the job spec's
    `workload`, docs/tenancy.md).

    Omitted fields take the catalogue's (or the graph's) defaults; exactly one of ``steps`` and
    ``samples`` may be given (neither means the workload's default steps). Every violation raises
    ``WorkloadError`` naming the field. After construction all fields are filled in except the one of
    steps/samples the user did not give.

    With ``source`` (an own graph), ``model`` is its id and ``dims`` binds the graph's dynamic
    dimensions by name; after construction ``dims`` holds every binding (``seq_len`` and the graph's
    defaults included). A catalogue model takes no ``dims``.
    """

    model: str
    task: Task = "train"
    batch_size: int | None = None
    seq_len: int | None = None
    precision: Precision | None = None
    steps: int | None = None
    samples: int | None = None
    dims: Dims | Mapping[str, int] | None = None
    optimizer: str | None = None
    source: GraphSource | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.source is not None:
            self._own_graph(self.source)
            return
        if self.dims:
            raise WorkloadError("dims", "applies to your own ONNX models only; catalogue models take seq_len")
        if self.optimizer is not None:
            raise WorkloadError(
                "optimizer",
                "applies to your own ONNX models only; a catalogue model trains "
                "with its published recipe's optimizer",
            )
        object.__setattr__(self, "dims", ())
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
            what = (
                f"its image size is fixed at {w.image_size}" if w.image_size else "it has no sequence length"
            )
            raise WorkloadError("seq_len", f"does not apply to {w.name}: {what}")
        precision = self.precision if self.precision is not None else w.default_precision
        if precision not in w.precisions:
            raise WorkloadError("precision", f"must be one of {', '.join(w.precisions)}, got {precision!r}")
        steps, samples = self._steps_samples(w.default_steps)
        # Frozen dataclass: fill in the defaults through object.__setattr__.
        object.__setattr__(self, "batch_size", batch)
        object.__setattr__(self, "seq_len", seq)
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "samples", samples)

    def _steps_samples(self, default_steps: int) -> tuple[int | None, int | None]:
        steps = _int_field("steps", self.steps)
        samples = _int_field("samples", self.samples)
        if steps is not None and samples is not None:
            raise WorkloadError("steps", "give steps or samples, not both")
        if steps is not None and not 1 <= steps <= MAX_STEPS:
            raise WorkloadError("steps", f"must be between 1 and {MAX_STEPS:,}, got {steps}")
        if samples is not None and not 1 <= samples <= MAX_SAMPLES:
            raise WorkloadError("samples", f"must be between 1 and {MAX_SAMPLES:,}, got {samples}")
        if steps is None and samples is None:
            steps = default_steps
        return steps, samples

    def _own_graph(self, src: GraphSource) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise WorkloadError("model", "must name the model")
        if self.task not in ("train", "infer"):
            raise WorkloadError("task", f"must be 'train' or 'infer', got {self.task!r}")
        if self.task not in src.tasks:
            raise WorkloadError(
                "task", f"{src.label} supports {', '.join(src.tasks)} only (it has no weights to train)"
            )
        batch = _int_field("batch_size", self.batch_size)
        if batch is None:
            batch = src.default_batch_size
        if not src.min_batch_size <= batch <= src.max_batch_size:
            raise WorkloadError(
                "batch_size",
                f"{batch} is outside {src.min_batch_size}..{src.max_batch_size} (the global batch, in "
                "samples)",
            )
        seq = _int_field("seq_len", self.seq_len)
        if seq is not None and not 1 <= seq <= 1_048_576:
            raise WorkloadError("seq_len", f"must be from 1 to 1,048,576, got {seq}")
        dims = _dims_field(self.dims)
        bindings = src.bindings(seq, dims)
        precision = self.precision if self.precision is not None else src.default_precision
        if precision not in src.precisions:
            raise WorkloadError("precision", f"must be one of {', '.join(src.precisions)}, got {precision!r}")
        steps, samples = self._steps_samples(src.default_steps)
        optimizer = self.optimizer if self.optimizer is not None else DEFAULT_OPTIMIZER
        if optimizer not in OPTIMIZERS:
            raise WorkloadError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        object.__setattr__(self, "optimizer", optimizer)
        object.__setattr__(self, "batch_size", batch)
        object.__setattr__(self, "seq_len", seq)
        object.__setattr__(self, "dims", bindings)
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "samples", samples)
        # Lowered now, so a graph that cannot be planned at these sizes is a WorkloadError here.
        src.graph(self.task, bindings, seq, optimizer)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: GraphSource | None = None) -> WorkloadSpec:
        """Build from a job spec's ``workload`` object, rejecting keys the spec does not define.

        ``source`` is the tenant's own graph the ``model`` field names, resolved by the caller.
        """
        if not isinstance(data, Mapping):
            raise WorkloadError("model", "the workload must be an object")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise WorkloadError(unknown[0], f"unknown field; the workload takes {', '.join(_FIELDS)}")
        if "model" not in data:
            raise WorkloadError("model", "is required")
        return cls(**{k: data[k] for k in _FIELDS if k in data}, source=source)

    @property
    def workload(self) -> Workload:
        """The catalogue entry (a catalogue model only: an own graph has ``source`` instead)."""
        if self.source is not None:
            raise WorkloadError("model", f"{self.label} is not a catalogue workload")
        return get_workload(self.model)

    @property
    def label(self) -> str:
        """The model as messages name it: the catalogue name, or the own graph's name."""
        return self.source.label if self.source is not None else self.model

    @property
    def bindings(self) -> Dims:
        return cast(Dims, self.dims)

    def graph(self) -> ModelGraph:
        """The graph the planner lays out for this task and these sizes."""
        if self.source is not None:
            return self.source.graph(self.task, self.bindings, self.seq_len, cast(str, self.optimizer))
        return self.workload.graph(self.task, self.seq_len)

    @property
    def max_ipus_per_replica(self) -> int:
        if self.source is not None:
            return self.source.max_ipus_per_replica(self.bindings)
        return self.workload.max_ipus_per_replica

    @property
    def executable_identity(self) -> str:
        return self.source.executable_identity if self.source is not None else self.model

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
        if self.dims:
            d["dims"] = dict(self.bindings)
        if self.source is not None:
            d["optimizer"] = self.optimizer
        return d
