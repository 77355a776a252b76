"""Dry runs: what a job would need and take, without running it.

Behind ``POST /estimates`` and ``ipucloud estimate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from vipu.emulator.errors import CompileError
from vipu.emulator.planner import choose_ipus_auto, plan
from vipu.emulator.run import EmulatedRun
from vipu.emulator.spec import WorkloadSpec


@dataclass(frozen=True, slots=True)
class Estimate:
    """The answer to "what would this job take?"; ``to_dict()`` is the JSON the API returns."""

    fits: bool
    model: str
    task: str
    machine: str
    ipus: int | None
    """The partition size estimated for (the chosen one when ``"auto"`` was asked)."""
    ipus_auto: bool
    plan: dict[str, object] | None
    throughput: float | None
    """Samples per second in steady state."""
    compile_s: float | None
    load_s: float | None
    step_s: float | None
    steps: int | None
    samples: int | None
    total_s: float | None
    ipu_hours: float | None
    """IPUs x total seconds / 3600: what the job would be metered."""
    memory_per_ipu_bytes: int | None
    """The busiest IPU's memory; when it does not fit, what the failing stage would need."""
    cached: bool
    error: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "fits": self.fits,
            "model": self.model,
            "task": self.task,
            "machine": self.machine,
            "ipus": self.ipus,
            "ipus_auto": self.ipus_auto,
            "plan": self.plan,
            "throughput": self.throughput,
            "compile_s": self.compile_s,
            "load_s": self.load_s,
            "step_s": self.step_s,
            "steps": self.steps,
            "samples": self.samples,
            "total_s": self.total_s,
            "ipu_hours": self.ipu_hours,
            "memory_per_ipu_bytes": self.memory_per_ipu_bytes,
            "cached": self.cached,
            "error": self.error,
        }


def _as_spec(spec: WorkloadSpec | Mapping[str, Any]) -> WorkloadSpec:
    return spec if isinstance(spec, WorkloadSpec) else WorkloadSpec.from_dict(spec)


def estimate(
    spec: WorkloadSpec | Mapping[str, Any],
    ipus: int | Literal["auto"],
    machine: str = "m2000",
    cached: bool = False,
) -> Estimate:
    """Plan and time ``spec`` on ``ipus`` IPUs (or the smallest partition that fits, for ``"auto"``).

    A workload that does not fit is an answer, not an error: ``fits`` is False and ``error`` says why.
    Bad input (unknown model, an IPU count that is not a power of two) raises ``WorkloadError`` /
    ``ValueError``.
    """
    s = _as_spec(spec)
    auto = ipus == "auto"
    chosen: int | None = None
    try:
        if auto:
            chosen = choose_ipus_auto(s, machine)
        else:
            if isinstance(ipus, str):
                raise ValueError(f"ipus must be a power of two or 'auto', got {ipus!r}")
            chosen = ipus
        p = plan(s, chosen, machine)
    except CompileError as exc:
        return Estimate(
            fits=False,
            model=s.model,
            task=s.task,
            machine=machine,
            ipus=None if auto else chosen,
            ipus_auto=auto,
            plan=None,
            throughput=None,
            compile_s=None,
            load_s=None,
            step_s=None,
            steps=None,
            samples=None,
            total_s=None,
            ipu_hours=None,
            memory_per_ipu_bytes=exc.needed_bytes,
            cached=cached,
            error=str(exc),
        )
    run = EmulatedRun(p, s, cached=cached)
    return Estimate(
        fits=True,
        model=s.model,
        task=s.task,
        machine=machine,
        ipus=p.ipus,
        ipus_auto=auto,
        plan=p.to_dict(),
        throughput=run.throughput,
        compile_s=run.compile_s,
        load_s=run.load_s,
        step_s=run.step_s,
        steps=run.steps,
        samples=run.samples,
        total_s=run.total_s,
        ipu_hours=run.ipu_hours,
        memory_per_ipu_bytes=p.memory_per_ipu_bytes,
        cached=cached,
        error=None,
    )


def predicted_runtime_s(
    spec: WorkloadSpec | Mapping[str, Any], ipus: int, machine: str = "m2000", cached: bool = False
) -> float:
    """Cluster seconds the job would hold its partition, compile included unless ``cached`` (its
    executable is in the cache): for backfill and the quota it reserves.

    Raises ``CompileError`` when the job cannot run on that partition.
    """
    s = _as_spec(spec)
    return EmulatedRun(plan(s, ipus, machine), s, cached=cached).total_s
