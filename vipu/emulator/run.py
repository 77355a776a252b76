"""A job's run on the emulated IPUs as a deterministic timeline in cluster time.

Nothing here sleeps or reads a clock: the caller (the worker) advances cluster time and asks where the
run is (``progress_at``) and what happened meanwhile (``events_between``). Both are O(1) in the run's
length (``events_between`` is O(events returned)), so they are cheap enough to call every progress tick.
Cancelling is the caller stopping to ask.

Timeline:  [compile, unless the executable is cached] [load] [steps x step_s] done

A run resumed from a checkpoint (``first_step`` k > 0) loads the executable and the checkpoint, then
runs steps k+1 .. N: its progress and step reports count the job's steps, not the attempt's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from vipu.emulator.machines import get_machine
from vipu.emulator.planner import Plan
from vipu.emulator.spec import WorkloadSpec

Phase = Literal["compile", "load", "run", "done"]

# Step reports: about every REPORT_EVERY_S of cluster time, but at least every tenth of the run and at
# most MAX_STEP_REPORTS of them, so short runs still show progress and long ones do not flood the log.
REPORT_EVERY_S = 30.0
MAX_STEP_REPORTS = 200
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Progress:
    phase: Phase
    step: int
    steps: int
    samples: int
    percent: float
    """Share of the job's steps done, 0 to 100 (a checkpoint's steps included). Compile and load are
    phases of their own and move no percent: a percent that mixed their time in fell when a
    resumed run skipped a compile, or rose when one was cached, with no step gained or lost."""
    eta_s: float
    throughput: float
    """Samples per second while running; 0 while compiling or loading."""
    memory_per_ipu_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "step": self.step,
            "steps": self.steps,
            "samples": self.samples,
            "percent": self.percent,
            "eta_s": self.eta_s,
            "throughput": self.throughput,
            "memory_per_ipu_bytes": self.memory_per_ipu_bytes,
        }


@dataclass(frozen=True, slots=True)
class RunEvent:
    t: float
    """Cluster seconds since the run started."""
    kind: str
    message: str
    data: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"t": self.t, "kind": self.kind, "message": self.message, "data": dict(self.data)}


def _duration(seconds: float) -> str:
    if 0 < seconds < 0.1:  # a small model's run: "0.0 s" said nothing
        return _step(seconds)
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _step(seconds: float) -> str:
    """A short time in the unit that shows it: 337.4 ms, 2.15 ms, 41.7 µs (not "0.0 ms")."""
    if seconds >= 0.01:
        return f"{seconds * 1000:,.1f} ms"
    if seconds >= 0.001:
        return f"{seconds * 1000:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def _same_executable(a: WorkloadSpec, b: WorkloadSpec) -> bool:
    return (a.model, a.task, a.batch_size, a.seq_len, a.precision, a.dims, a.source) == (
        b.model,
        b.task,
        b.batch_size,
        b.seq_len,
        b.precision,
        b.dims,
        b.source,
    )


@dataclass(frozen=True, slots=True)
class Timeline:
    """Where a run is at any cluster time, from six numbers: what anyone needs to derive a running
    job's progress from its start, without the process that drives it writing it down."""

    compile_s: float
    load_s: float
    step_s: float
    steps: int
    samples_per_step: int
    memory_per_ipu_bytes: int
    first_step: int = 0
    """Steps already done when this run started (a resume from a checkpoint)."""

    @property
    def run_start_s(self) -> float:
        return self.compile_s + self.load_s

    @property
    def total_s(self) -> float:
        return self.run_start_s + (self.steps - self.first_step) * self.step_s

    def step_time(self, step: int) -> float:
        """Cluster time of this run at which ``step`` of the job's steps are complete."""
        return self.run_start_s + (step - self.first_step) * self.step_s

    def step_at(self, t: float) -> int:
        """The job's steps complete at cluster time ``t`` of this run."""
        if t < self.run_start_s:
            return self.first_step
        return min(self.steps, self.first_step + int((t - self.run_start_s) / self.step_s + _EPS))

    @property
    def samples(self) -> int:
        return self.steps * self.samples_per_step

    @property
    def throughput(self) -> float:
        return self.samples_per_step / self.step_s

    def progress_at(self, t: float) -> Progress:
        t = max(0.0, t)
        total = self.total_s
        eta = max(0.0, total - t)
        start = self.run_start_s
        first = self.first_step
        # Steps done, the one in flight counted by its share: compile and load move no percent.
        steps_done = first + max(0.0, t - start) / self.step_s if self.step_s > 0 else float(first)
        percent = 100.0 * min(1.0, steps_done / self.steps) if self.steps else 100.0
        # Done once every step is complete, even if rounding leaves t a hair short of total_s.
        all_steps = t >= start and first + (t - start) / self.step_s + _EPS >= self.steps
        if t >= total or all_steps:
            return Progress(
                "done",
                self.steps,
                self.steps,
                self.samples,
                100.0,
                0.0,
                self.throughput,
                self.memory_per_ipu_bytes,
            )
        done = first * self.samples_per_step
        if t < self.compile_s:
            return Progress("compile", first, self.steps, done, percent, eta, 0.0, self.memory_per_ipu_bytes)
        if t < start:
            return Progress("load", first, self.steps, done, percent, eta, 0.0, self.memory_per_ipu_bytes)
        step = self.step_at(t)
        return Progress(
            "run",
            step,
            self.steps,
            step * self.samples_per_step,
            percent,
            eta,
            self.throughput,
            self.memory_per_ipu_bytes,
        )

    def to_dict(self) -> dict[str, float | int]:
        return {
            "compile_s": self.compile_s,
            "load_s": self.load_s,
            "step_s": self.step_s,
            "steps": self.steps,
            "samples_per_step": self.samples_per_step,
            "memory_per_ipu_bytes": self.memory_per_ipu_bytes,
            "first_step": self.first_step,
        }

    @classmethod
    def from_dict(cls, d: dict[str, float | int]) -> Timeline:
        return cls(
            compile_s=float(d["compile_s"]),
            load_s=float(d["load_s"]),
            step_s=float(d["step_s"]),
            steps=int(d["steps"]),
            samples_per_step=int(d["samples_per_step"]),
            memory_per_ipu_bytes=int(d["memory_per_ipu_bytes"]),
            first_step=int(d.get("first_step", 0)),
        )


class EmulatedRun:
    """The run of ``spec`` under ``plan``; ``cached`` when the executable is already in the cache;
    ``first_step`` the steps a checkpoint it resumes from had done (0: from the start)."""

    def __init__(
        self, plan: Plan, spec: WorkloadSpec | None = None, cached: bool = False, first_step: int = 0
    ) -> None:
        spec = spec if spec is not None else plan.spec
        if not _same_executable(spec, plan.spec):
            raise ValueError("the spec differs from the one the plan was made for; plan it again")
        self.plan = plan
        self.spec = spec
        self.cached = cached
        self.samples_per_step = plan.global_batch
        if spec.samples is not None:
            self.steps = max(1, math.ceil(spec.samples / self.samples_per_step))
        else:
            assert spec.steps is not None
            self.steps = spec.steps
        if not 0 <= first_step < self.steps:
            raise ValueError(f"a run of {self.steps} steps cannot resume after step {first_step}")
        self.first_step = first_step
        self.compile_s = 0.0 if cached else plan.compile_s
        self.load_s = plan.load_s
        self.step_s = plan.timing.step_s
        self.run_start_s = self.compile_s + self.load_s
        self.run_s = (self.steps - first_step) * self.step_s
        self.total_s = self.run_start_s + self.run_s
        self.samples = self.steps * self.samples_per_step
        self.throughput = self.samples_per_step / self.step_s
        self.memory_per_ipu_bytes = plan.memory_per_ipu_bytes
        self.report_every = max(
            1,
            min(math.ceil(REPORT_EVERY_S / self.step_s), math.ceil(self.steps / 10)),
            math.ceil(self.steps / MAX_STEP_REPORTS),
        )
        self.timeline = Timeline(
            compile_s=self.compile_s,
            load_s=self.load_s,
            step_s=self.step_s,
            steps=self.steps,
            samples_per_step=self.samples_per_step,
            memory_per_ipu_bytes=self.memory_per_ipu_bytes,
            first_step=first_step,
        )
        self._fixed = self._fixed_events()
        self._fixed_times = [e.t for e in self._fixed]

    @property
    def ipu_hours(self) -> float:
        return self.plan.ipus * self.total_s / 3600.0

    def progress_at(self, t: float) -> Progress:
        return self.timeline.progress_at(t)

    def step_time(self, step: int) -> float:
        """Cluster time at which ``step`` of the job's steps are complete."""
        return self.run_start_s + (step - self.first_step) * self.step_s

    def events_between(self, t0: float, t1: float) -> list[RunEvent]:
        """Events with t0 <= t < t1 in time order, except "done", which counts as t0 < t <= t1 so that a
        call ending exactly at the end of the run already returns it.

        Consecutive calls over [a, b), [b, c), ... return every event exactly once.
        """
        out = [e for e in self._fixed if (t0 < e.t <= t1 if e.kind == "done" else t0 <= e.t < t1)]
        out.extend(self._step_events(t0, t1))
        out.sort(key=lambda e: (e.t, e.kind == "done"))
        return out

    def next_event_at(self, t: float) -> float | None:
        """The cluster time of the first event that `events_between(t, ...)` would return, or None
        when none is left: what a driver of many runs sleeps until, instead of asking every run."""
        times = [e for e in self._fixed_times if (e > t if e == self.total_s else e >= t)]
        k = self.report_every
        lo = max(0.0, (t - self.run_start_s) / self.step_s) + self.first_step
        step = max(k, math.ceil(lo / k - _EPS) * k)
        if step <= self.first_step:
            step += k
        while step < self.steps and self.step_time(step) < t:
            step += k
        if step < self.steps:
            times.append(self.step_time(step))
        return min(times) if times else None

    def events(self) -> list[RunEvent]:
        return self.events_between(0.0, math.inf)

    def _step_events(self, t0: float, t1: float) -> list[RunEvent]:
        k = self.report_every
        lo = max(0.0, (t0 - self.run_start_s) / self.step_s) + self.first_step
        first = max(k, math.ceil(lo / k - _EPS) * k)
        if first <= self.first_step:
            first += k
        events: list[RunEvent] = []
        step = first
        while step < self.steps:
            t = self.step_time(step)
            if t >= t1:
                break
            if t >= t0:
                events.append(self._step_event(step, t))
            step += k
        return events

    def _step_event(self, step: int, t: float) -> RunEvent:
        samples = step * self.samples_per_step
        eta = self.total_s - t
        return RunEvent(
            t,
            "step",
            f"step {step:,}/{self.steps:,}: {samples:,} samples, {self.throughput:,.0f} samples/s, "
            f"{_step(self.step_s)}/step, ETA {_duration(eta)}",
            {
                "step": step,
                "steps": self.steps,
                "samples": samples,
                "throughput": self.throughput,
                "step_s": self.step_s,
                "eta_s": eta,
            },
        )

    def _fixed_events(self) -> list[RunEvent]:
        p = self.plan
        key = p.executable_key
        layout = (
            f"{p.ipus} {p.machine} IPUs = {p.replicas} replica(s) x {p.ipus_per_replica} IPU(s) per replica "
            f"(layers per IPU {p.layers_per_ipu}); micro-batch {p.micro_batch}, "
            + (
                f"gradient accumulation {p.grad_accum}, "
                if self.spec.task == "train"
                else f"{p.micro_batches_per_step} micro-batches per step, "
            )
            + f"global batch {p.global_batch:,}, device iterations {p.device_iterations}"
            + ("; optimizer state off-chip" if p.optimizer_offchip else "")
            + ("; recomputation on" if p.recompute else "")
        )
        events = [
            RunEvent(
                0.0,
                "plan",
                f"Plan for {self.spec.label} ({self.spec.task}, {self.spec.precision}): {layout}",
                {"plan": {k: v for k, v in p.to_dict().items() if k not in ("stages", "timing")}},
            ),
        ]
        events += [RunEvent(0.0, "note", note) for note in p.notes]
        per_stage = [s.memory_bytes for s in p.stages]
        memory = ", ".join(f"IPU {s.index}: {s.memory_bytes / 2**20:,.0f} MB" for s in p.stages)
        if self.cached:
            events.append(
                RunEvent(
                    0.0,
                    "cache_hit",
                    f"Executable {key} found in the cache: skipping compilation",
                    {"executable_key": key},
                )
            )
        else:
            events.append(
                RunEvent(
                    0.0,
                    "compile_start",
                    f"Compiling executable {key} for {p.ipus_per_replica} IPU(s) per replica",
                    {"executable_key": key, "expected_s": self.compile_s},
                )
            )
            events.append(
                RunEvent(
                    self.compile_s,
                    "compile_end",
                    f"Compiled in {_duration(self.compile_s)}; "
                    f"memory per IPU of {get_machine(p.machine).sram_label}: {memory}",
                    {
                        "executable_key": key,
                        "compile_s": self.compile_s,
                        "memory_per_stage_bytes": per_stage,
                        "memory_per_stage": [s.memory.to_dict() for s in p.stages],
                    },
                )
            )
        events.append(
            RunEvent(
                self.compile_s, "load_start", f"Loading the executable onto {p.ipus} IPUs", {"ipus": p.ipus}
            )
        )
        events.append(
            RunEvent(
                self.run_start_s, "load_end", f"Loaded in {_duration(self.load_s)}", {"load_s": self.load_s}
            )
        )
        resume = f"Resuming from the checkpoint after step {self.first_step:,}: " if self.first_step else ""
        events.append(
            RunEvent(
                self.run_start_s,
                "run_start",
                f"{resume}Running {self.steps - self.first_step:,} steps "
                f"of {self.samples_per_step:,} samples "
                f"(expected {self.throughput:,.0f} samples/s, {_duration(self.run_s)})",
                {
                    "steps": self.steps,
                    "first_step": self.first_step,
                    "samples_per_step": self.samples_per_step,
                    "step_s": self.step_s,
                    "memory_per_stage_bytes": per_stage,
                },
            )
        )
        events.append(
            RunEvent(
                self.total_s,
                "done",
                f"Done: {self.steps:,} steps, {self.samples:,} samples in "
                f"{_duration(self.total_s)} "
                f"(compile {_duration(self.compile_s)}, load {_duration(self.load_s)}, run "
                f"{_duration(self.run_s)}); {self.throughput:,.0f} samples/s; "
                f"{self.ipu_hours:,.3f} IPU-hours",
                {
                    "steps": self.steps,
                    "samples": self.samples,
                    "total_s": self.total_s,
                    "compile_s": self.compile_s,
                    "load_s": self.load_s,
                    "run_s": self.run_s,
                    "throughput": self.throughput,
                    "ipu_hours": self.ipu_hours,
                },
            )
        )
        return events
