"""Replay one trace under several policies side by side, and write what came out.

Every policy sees the same jobs and, unless it forces its own (``slurm-backfill`` always uses
``user`` estimates), the same estimates drawn from the same seed. With ``workers > 1`` the policies
run in parallel processes; the numbers do not depend on it.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.policy import BASELINES, get_policy
from scheduler.policy.preemption import PreemptionCost
from scheduler.simulator.engine import SimResult, Simulation, largest_partition
from scheduler.simulator.estimates import DEFAULT_PREDICTION_ERROR, default_limit, estimates
from scheduler.simulator.machines import assign, largest_by_type
from scheduler.simulator.metrics import summarize
from scheduler.simulator.svg import cdf_chart, line_chart
from scheduler.simulator.swf import DEFAULT_CORES_PER_IPU, is_swf, load_swf
from scheduler.simulator.trace import Columns, TraceJob, load_trace
from vipu.topology import Fleet

Progress = Callable[[str, int], None]  # (policy, jobs completed since the last call)


@dataclass(frozen=True)
class ReplaySpec:
    trace: Path
    pods: int = 8
    machine: str = "m2000"
    policies: tuple[str, ...] = BASELINES
    estimates: str = "predicted"
    seed: int = 0
    columns: Columns = field(default_factory=Columns)
    limit: int | None = None
    start_row: int = 0
    prediction_error: float = DEFAULT_PREDICTION_ERROR
    max_runtime_s: float | None = None
    # A fleet description (e.g. "4xm2000,2xbow,32xdss8440"), replacing `pods` x `machine`.
    fleet: str | None = None
    # Preemptible work (docs/checkpoints.md): the share of jobs submitted preemptible (drawn from the
    # seed), how often they checkpoint and how long a preemption's warning is (s of the trace's time).
    preemptible_fraction: float = 0.0
    checkpoint_every_s: float = 600.0
    warning_s: float = 30.0
    # Forecast the wait of every n-th submission and report its error (0: none); see engine.Simulation.
    estimate_every: int = 0
    # Whether every preemption pays what the emulator says it costs (scheduler.policy.preemption);
    # False: the research anchors preempt for free, as in their papers' simulators.
    preemption_costs: bool = True
    # SWF logs (a ``.swf`` or ``.swf.gz`` trace): how many of the log's cores make one IPU.
    cores_per_ipu: int = DEFAULT_CORES_PER_IPU

    def preemptible(self, jobs: Sequence[TraceJob]) -> list[bool]:
        """Which jobs are preemptible: those the trace marks so (an SWF log's best-effort queue), and
        each other with probability `preemptible_fraction`, from the seed (one draw a job, marked or
        not, so a mark does not move the others' draws)."""
        if self.preemptible_fraction <= 0:
            return [j.preemptible for j in jobs]
        rng = random.Random(f"preemptible:{self.seed}")
        return [rng.random() < self.preemptible_fraction or j.preemptible for j in jobs]

    def build_fleet(self) -> Fleet | None:
        return None if self.fleet is None else Fleet.build(self.fleet)

    def largest(self) -> int:
        fleet = self.build_fleet()
        if fleet is None:
            return largest_partition(self.pods)
        return max(largest_by_type(fleet).values(), default=0)

    def load(self) -> list[TraceJob]:
        if is_swf(self.trace):
            return load_swf(
                self.trace,
                largest_partition=self.largest(),
                cores_per_ipu=self.cores_per_ipu,
                limit=self.limit,
                start_row=self.start_row,
            )
        return load_trace(
            self.trace,
            largest_partition=self.largest(),
            columns=self.columns,
            limit=self.limit,
            start_row=self.start_row,
        )


def replay_policy(
    spec: ReplaySpec, jobs: Sequence[TraceJob], policy: str, progress: Progress | None = None
) -> SimResult:
    config = get_policy(policy).with_options(preempt_warning_s=spec.warning_s)
    model = config.estimates or spec.estimates
    limit = spec.max_runtime_s or default_limit(jobs)
    told = estimates(jobs, model, seed=spec.seed, limit_s=limit, prediction_error=spec.prediction_error)
    fleet = spec.build_fleet()
    preemptible = spec.preemptible(jobs)
    if fleet is None:
        sim = Simulation(
            jobs,
            config,
            told,
            pods=spec.pods,
            machine=spec.machine,
            estimate_model=model,
            estimate_every=spec.estimate_every,
            preemptible=preemptible,
            checkpoint_every_s=spec.checkpoint_every_s,
            warning_s=spec.warning_s,
            preemption_cost=PreemptionCost(warning_s=spec.warning_s) if spec.preemption_costs else None,
        )
    else:
        runs = assign(jobs, fleet, seed=spec.seed)
        sim = Simulation(
            jobs,
            config,
            told,
            fleet=fleet,
            runs=runs,
            estimate_model=model,
            estimate_every=spec.estimate_every,
            preemptible=preemptible,
            checkpoint_every_s=spec.checkpoint_every_s,
            warning_s=spec.warning_s,
            preemption_cost=PreemptionCost(warning_s=spec.warning_s) if spec.preemption_costs else None,
        )
    pending = 0

    def step(done: int) -> None:
        nonlocal pending
        pending += done
        if progress is not None and pending >= 250:
            progress(policy, pending)
            pending = 0

    started, processor = time.perf_counter(), time.process_time()
    result = sim.run(step)
    result.wall_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - processor
    if progress is not None and pending:
        progress(policy, pending)
    return result


_progress_queue: Any = None


def _init_worker(queue: Any) -> None:
    global _progress_queue
    _progress_queue = queue


def _worker(spec: ReplaySpec, jobs: Sequence[TraceJob], policy: str) -> SimResult:
    return replay_policy(spec, jobs, policy, lambda name, n: _progress_queue.put((name, n)))


def replay(
    spec: ReplaySpec, jobs: Sequence[TraceJob], *, workers: int = 1, progress: Progress | None = None
) -> dict[str, SimResult]:
    """Results by policy, in the order the policies were asked for."""
    for name in spec.policies:
        get_policy(name)  # fail on a bad name before any work
    if workers <= 1 or len(spec.policies) <= 1:
        return {name: replay_policy(spec, jobs, name, progress) for name in spec.policies}
    context = multiprocessing.get_context("fork")
    with context.Manager() as manager:
        queue = manager.Queue()
        with ProcessPoolExecutor(
            max_workers=min(workers, len(spec.policies)),
            mp_context=context,
            initializer=_init_worker,
            initargs=(queue,),
        ) as pool:
            futures = {name: pool.submit(_worker, spec, jobs, name) for name in spec.policies}
            while not all(f.done() for f in futures.values()):
                _drain(queue, progress, timeout=0.2)
            _drain(queue, progress, timeout=0)
            return {name: future.result() for name, future in futures.items()}


def _drain(queue: Any, progress: Progress | None, timeout: float) -> None:
    import queue as queue_module

    try:
        item = queue.get(timeout=timeout) if timeout else queue.get_nowait()
    except queue_module.Empty:
        return
    while True:
        if progress is not None:
            progress(*item)
        try:
            item = queue.get_nowait()
        except queue_module.Empty:
            return


def report(results: dict[str, SimResult]) -> dict[str, dict[str, Any]]:
    return {name: summarize(result) for name, result in results.items()}


def write_outputs(results: dict[str, SimResult], out: Path, *, title: str) -> list[Path]:
    """Per-job CSV, the summary as JSON, and the plots. Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    jobs_csv = out / "jobs.csv"
    with jobs_csv.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "policy",
                "job",
                "tenant",
                "size",
                "requested_size",
                "duration_s",
                "submit_s",
                "start_s",
                "end_s",
                "wait_s",
                "jct_s",
                "preempted",
            ]
        )
        for name, result in results.items():
            for job, outcome in zip(result.jobs, result.outcomes, strict=True):
                writer.writerow(
                    [
                        name,
                        job.id,
                        job.tenant,
                        job.size,
                        job.requested_size,
                        job.duration_s,
                        job.submit_s,
                        outcome.start_s,
                        outcome.end_s,
                        round(outcome.start_s - job.submit_s, 3),
                        round(outcome.end_s - job.submit_s, 3),
                        outcome.preempted,
                    ]
                )
    written.append(jobs_csv)
    summary = out / "summary.json"
    summary.write_text(json.dumps(report(results), indent=2) + "\n")
    written.append(summary)
    jct = {
        name: [o.end_s - j.submit_s for j, o in zip(r.jobs, r.outcomes, strict=True)]
        for name, r in results.items()
    }
    waits = {
        name: [o.start_s - j.submit_s for j, o in zip(r.jobs, r.outcomes, strict=True)]
        for name, r in results.items()
    }
    plots = {
        "sched-jct-cdf.svg": cdf_chart(
            jct, title=f"Job completion time, {title}", x_label="job completion time"
        ),
        "sched-wait-cdf.svg": cdf_chart(
            waits, title=f"Queueing delay, {title}", x_label="queueing delay (1 s and less at the left edge)"
        ),
        "sched-utilization.svg": line_chart(
            {name: _utilization_series(r) for name, r in results.items()},
            title=f"IPU utilisation over time, {title}",
            x_label="days since the first submission",
            y_label="busy IPUs / all IPUs",
            y_max=1.0,
        ),
    }
    for name, text in plots.items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written


def _utilization_series(result: SimResult) -> list[tuple[float, float]]:
    capacity = result.capacity_ipus * result.bin_s
    return [((i + 0.5) * result.bin_s / 86_400, busy / capacity) for i, busy in enumerate(result.busy_bins)]
