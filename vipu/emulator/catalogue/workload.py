"""A catalogue entry: what a user may ask for (tasks, batch and sequence limits, precisions) and how
its graph is built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from vipu.emulator.graph import ModelGraph, Precision, Task

BOTH_TASKS: tuple[Task, ...] = ("train", "infer")
PRECISIONS: tuple[Precision, ...] = ("fp16", "fp32")


@dataclass(frozen=True, eq=False, kw_only=True)
class Workload:
    """A catalogue entry. The defaults are what most entries share; an entry states only what differs."""

    name: str
    family: str
    description: str
    sample_unit: str
    task_notes: dict[str, str]
    default_batch_size: int
    max_ipus_per_replica: int
    architecture: dict[str, object]
    references: tuple[str, ...]
    build: Callable[[Task, int | None], ModelGraph] = field(repr=False, compare=False)
    tasks: tuple[Task, ...] = BOTH_TASKS
    min_batch_size: int = 1
    max_batch_size: int = 65_536
    seq_lens: tuple[int, ...] = ()
    default_seq_len: int | None = None
    seq_len_meaning: str = ""
    image_size: int | None = None
    precisions: tuple[Precision, ...] = PRECISIONS
    default_precision: Precision = "fp16"
    default_steps: int = 100

    def graph(self, task: Task, seq_len: int | None = None) -> ModelGraph:
        return _graph(self, task, seq_len if seq_len is not None else self.default_seq_len)

    def to_dict(self) -> dict[str, object]:
        default_task: Task = self.tasks[0]
        graph = self.graph(default_task)
        flops: dict[str, float] = {}
        for task in self.tasks:
            g = self.graph(task)
            flops[task] = g.flops_per_sample * (3.0 if task == "train" else 1.0)
        return {
            "name": self.name,
            "family": self.family,
            "description": self.description,
            "sample_unit": self.sample_unit,
            "tasks": list(self.tasks),
            "task_notes": dict(self.task_notes),
            "default_batch_size": self.default_batch_size,
            "min_batch_size": self.min_batch_size,
            "max_batch_size": self.max_batch_size,
            "seq_lens": list(self.seq_lens),
            "default_seq_len": self.default_seq_len,
            "seq_len_meaning": self.seq_len_meaning,
            "image_size": self.image_size,
            "precisions": list(self.precisions),
            "default_precision": self.default_precision,
            "default_steps": self.default_steps,
            "max_ipus_per_replica": self.max_ipus_per_replica,
            "parameters": graph.params,
            "flops_per_sample": flops,
            "layers": len(graph.layers),
            "architecture": dict(self.architecture),
            "references": list(self.references),
        }


# Building a graph walks every layer of the architecture; the planner asks for the same few graphs
# over and over. Entries compare by identity, so the cache keys on the entry itself.
@lru_cache(maxsize=256)
def _graph(workload: Workload, task: Task, seq_len: int | None) -> ModelGraph:
    return workload.build(task, seq_len)
