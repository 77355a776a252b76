"""A serving replica's run: compile (unless the executable is cached), load, then serve until stopped.

A host agent drives a replica's attempt the way it drives a job's run: the same events (plan,
compile, load) at the same cluster times, the same meter ticks. What differs is that it has no last
step: a replica serves until the control plane drains it, so its timeline is a run of
``SERVE_STEPS`` notional steps of ``SERVE_STEP_S`` each (thirty thousand years), which keeps every
reader of ``Timeline`` (progress, the derived cluster time of a running attempt) working unchanged.
Its phase is its state: ``compile`` -> compiling, ``load`` -> loading, ``run`` -> ready.

The requests themselves are timed by the replica's ``ServePlan`` (``serving.py``), not here.
"""

from __future__ import annotations

from vipu.emulator.run import RunEvent, Timeline, _duration
from vipu.emulator.serving import ServePlan
from vipu.emulator.spec import WorkloadSpec

SERVE_STEP_S = 3600.0
"""A notional step of a replica's timeline: its progress moves once an hour served."""
SERVE_STEPS = 10**9


class ReplicaRun:
    """The run of a serving replica laid out by ``plan``; ``cached`` when the executable is in the cache."""

    def __init__(self, plan: ServePlan, spec: WorkloadSpec, cached: bool = False) -> None:
        self.plan = plan
        self.spec = spec
        self.cached = cached
        self.compile_s = 0.0 if cached else plan.compile_s
        self.load_s = plan.load_s
        self.run_start_s = self.compile_s + self.load_s
        self.timeline = Timeline(
            compile_s=self.compile_s,
            load_s=self.load_s,
            step_s=SERVE_STEP_S,
            steps=SERVE_STEPS,
            samples_per_step=0,
            memory_per_ipu_bytes=plan.memory_per_ipu_bytes,
        )
        self.total_s = self.timeline.total_s
        self._events = self._fixed_events()

    def progress_at(self, t: float):
        return self.timeline.progress_at(t)

    def events_between(self, t0: float, t1: float) -> list[RunEvent]:
        """Events with t0 <= t < t1, in time order: consecutive calls return each exactly once."""
        return [e for e in self._events if t0 <= e.t < t1]

    def next_event_at(self, t: float) -> float | None:
        times = [e.t for e in self._events if e.t >= t]
        return min(times) if times else None

    def _fixed_events(self) -> list[RunEvent]:
        p = self.plan
        key = p.executable_key
        layout = (
            f"{p.ipus} {p.machine} IPU(s) = {p.pipeline_stages} pipeline stage(s) x {p.replicas} copy(ies) "
            f"(layers per stage {list(p.layers_per_stage)}); batches of up to {p.max_batch_size}; "
            f"latency at batch 1 {p.latency_s(1) * 1000:,.3f} ms, at {p.max_batch_size} "
            f"{p.latency_s(p.max_batch_size) * 1000:,.3f} ms; "
            f"{p.throughput(p.max_batch_size):,.0f} requests/s at saturation"
        )
        events = [
            RunEvent(
                0.0,
                "plan",
                f"Serving plan for {self.spec.label} ({self.spec.precision}): {layout}",
                {"plan": p.to_dict()},
            )
        ]
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
                    f"Compiling executable {key} for {p.ipus} IPU(s)",
                    {"executable_key": key, "expected_s": self.compile_s},
                )
            )
            events.append(
                RunEvent(
                    self.compile_s,
                    "compile_end",
                    f"Compiled in {_duration(self.compile_s)}; busiest IPU "
                    f"{p.memory_per_ipu_bytes / 2**20:,.0f} MB",
                    {"executable_key": key, "compile_s": self.compile_s},
                )
            )
        events.append(RunEvent(self.compile_s, "load_start", f"Loading the executable onto {p.ipus} IPU(s)",
                               {"ipus": p.ipus}))  # fmt: skip
        events.append(
            RunEvent(
                self.run_start_s, "load_end", f"Loaded in {_duration(self.load_s)}", {"load_s": self.load_s}
            )
        )
        events.append(
            RunEvent(
                self.run_start_s,
                "serving",
                "Ready: serving requests",
                {"max_batch_size": p.max_batch_size},
            )
        )
        return events
