"""Trace jobs on a mixed fleet: what each job would need and take on each machine type.

A trace (Philly's) records a run time on its own hardware, and no workload. To replay it on a fleet
of several IPU machine types, every job is given a workload of the catalogue (drawn with the seed,
the same for every policy) and its recorded run time is taken as its run time on the reference type,
the IPU-M2000. On another type it runs ``throughput on m2000 / throughput on that type`` times as
long, both throughputs the emulator's prediction for that workload at the job's partition size; on a
type where the workload does not fit at that size (out of In-Processor-Memory on a 304 MB GC2, or
larger than one C2 server), the job cannot run there at all. The run time a policy is told scales
the same way, so the estimate model's error carries over unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from scheduler.simulator.trace import TraceJob
from vipu import emulator
from vipu.machine_types import LAYOUTS, MACHINES, MachineType
from vipu.topology import Fleet

REFERENCE = MachineType.M2000
# Training workloads a trace's jobs are drawn from: a developer cloud's mix of vision, language,
# recurrent and small models (mcmc infers only).
WORKLOADS = (
    "bert-base",
    "bert-large",
    "resnet50",
    "resnext101",
    "efficientnet-b0",
    "efficientnet-b4",
    "lstm",
    "gru",
    "deep-autoencoder",
)


@dataclass(frozen=True, slots=True)
class TypeRun:
    """A job on one machine type: its partition size there and how much longer than on the
    reference type it runs (1.0 on the reference, below 1 on a faster type)."""

    machine_type: str
    size: int
    factor: float


def largest_by_type(fleet: Fleet) -> dict[str, int]:
    """The largest partition each type of ``fleet`` can form (whole POD64s, else one unit)."""
    counts: dict[tuple[str, str], int] = {}
    for unit in fleet.units:
        if unit is not None:
            key = (unit.machine_type.value, unit.layout)
            counts[key] = counts.get(key, 0) + 1
    largest: dict[str, int] = {}
    for (kind, layout), n in counts.items():
        spec = LAYOUTS[layout]
        size = spec.ipus * (1 << (n.bit_length() - 1)) if spec.joins else spec.ipus
        largest[kind] = max(largest.get(kind, 0), size)
    return largest


@lru_cache(maxsize=4096)
def throughput(workload: str, size: int, machine_type: str) -> float | None:
    """Samples per second of ``workload`` (its default training spec) on ``size`` IPUs, or None when
    it cannot run there."""
    spec = emulator.WorkloadSpec(model=workload, task="train")
    try:
        return emulator.plan(spec, size, machine_type).throughput
    except (emulator.CompileError, ValueError):
        return None


def runs_on(workload: str, size: int, types: Sequence[str], largest: dict[str, int]) -> tuple[TypeRun, ...]:
    """Where a job of ``workload`` on ``size`` IPUs can run, and how long relative to the reference."""
    reference = throughput(workload, size, REFERENCE.value)
    runs: list[TypeRun] = []
    for kind in types:
        if size > largest.get(kind, 0):
            continue
        if reference is None:
            # The reference cannot plan it (too few samples for so many replicas): the types that
            # can take the size run it as long as recorded, scaled by peak FP16 alone.
            factor = MACHINES[REFERENCE].fp16_flops / MACHINES[MachineType(kind)].fp16_flops
            if throughput(workload, min(size, 16), kind) is None:
                continue
            runs.append(TypeRun(kind, size, factor))
            continue
        there = throughput(workload, size, kind)
        if there is not None:
            runs.append(TypeRun(kind, size, reference / there))
    return tuple(runs)


def assign(jobs: Sequence[TraceJob], fleet: Fleet, *, seed: int) -> list[tuple[TypeRun, ...]]:
    """Per job, in order: the machine types of ``fleet`` it can run on, with its size and factor there.

    A job no type can run at its size (a workload too large for the types that can form the size)
    is given the reference type's shape anyway, factor 1, so that every trace job runs somewhere.
    """
    rng = random.Random(f"{seed}:workloads")
    largest = largest_by_type(fleet)
    types = [kind.value for kind in fleet.machine_types]
    out: list[tuple[TypeRun, ...]] = []
    for job in jobs:
        workload = WORKLOADS[rng.randrange(len(WORKLOADS))]
        runs = runs_on(workload, job.size, types, largest)
        if not runs:
            kinds = [kind for kind in types if largest[kind] >= job.size] or types[:1]
            runs = (TypeRun(kinds[0], job.size, 1.0),)
        out.append(runs)
    return out
