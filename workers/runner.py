"""Run one attempt: take its lease, run the emulated IPU in cluster time, heartbeat, finish.

Every write goes through scheduler/ functions and carries the lease epoch, so a worker that was
paused, cut off or duplicated can change nothing once its lease is gone.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler import bus
from scheduler.db import Database, get_database
from scheduler.models import AttemptState
from scheduler.services import attempts, executables
from scheduler.services.attempts import Directive, LogLine, TakenAttempt
from scheduler.settings import Settings, get_settings
from vipu import emulator
from workers import ipuof

log = logging.getLogger("ipucloud.worker")


@dataclass
class RunContext:
    settings: Settings
    db: Database
    worker: str
    stopping: Callable[[], bool] = lambda: False
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    seq: int = 0
    pending: list[LogLine] = field(default_factory=list)


def run(*, attempt_id: int, epoch: int, worker: str) -> str:
    from workers.app import stopping_flag

    settings = get_settings()
    flag = stopping_flag(os.getppid())
    ctx = RunContext(
        settings=settings,
        db=get_database(settings),
        worker=f"{worker}/{socket.gethostname()}:{os.getpid()}",
        stopping=flag.exists,
    )
    return run_attempt(ctx, attempt_id=attempt_id, epoch=epoch)


def run_attempt(ctx: RunContext, *, attempt_id: int, epoch: int) -> str:
    with ctx.db.write() as s:
        taken = attempts.take(
            session=s, attempt_id=attempt_id, epoch=epoch, worker=ctx.worker, lease_s=ctx.settings.lease_s
        )
    if taken is None:
        log.info("attempt %d (epoch %d) is not ours to run: duplicate or stale delivery", attempt_id, epoch)
        return "not-taken"
    bus.publish(bus.job_channel(taken.job_id), "running")
    log.info("running attempt %d of %s on partition %s", taken.number, taken.job_id, taken.partition)
    try:
        return _execute(ctx, taken)
    except Exception as exc:
        # A bug or crash inside the run is the platform's fault: hand it back unbilled; the
        # reconciler's retry limit stops a job that crashes every worker it touches.
        log.exception("attempt %d crashed", attempt_id)
        _finish(ctx, taken, AttemptState.LOST, 0.0, f"worker error: {type(exc).__name__}: {exc}")
        return "crashed"


def _execute(ctx: RunContext, taken: TakenAttempt) -> str:
    env, conf = ipuof.prepare(ctx.settings, taken)
    partition_id, gcd = ipuof.attach(env)
    ctx.pending.append(
        LogLine("log", f"attached to partition {partition_id} (GCD {gcd}) via {conf}", {"env": env})
    )
    workload = taken.spec["workload"]
    try:
        spec = emulator.WorkloadSpec(**workload)
        plan = emulator.plan(spec, taken.partition_size, taken.machine_type)
    except (emulator.CompileError, emulator.WorkloadError) as exc:
        ctx.pending.append(LogLine("log", f"compile failed: {exc}", {"phase": "compile", "error": str(exc)}))
        _finish(ctx, taken, AttemptState.FAILED, 0.0, f"compile error: {exc}")
        return "failed"
    with ctx.db.read() as s:
        cached = executables.is_cached(session=s, key=plan.executable_key)
    run = emulator.EmulatedRun(plan, spec, cached=cached)
    max_runtime = taken.max_runtime_s or float("inf")
    end_t = min(run.total_s, max_runtime)
    scale = ctx.settings.time_scale
    t0 = ctx.clock()
    last_t = 0.0
    compiled_recorded = cached

    def cluster_now() -> float:
        return min((ctx.clock() - t0) * scale, end_t)

    while True:
        remaining_wall = (end_t - cluster_now()) / scale
        ctx.sleep(max(0.0, min(ctx.settings.heartbeat_s, remaining_wall)))
        t = cluster_now()
        for ev in run.events_between(last_t, t):
            ctx.pending.append(
                LogLine("log", ev.message, {"t": round(ev.t, 3), "kind": ev.kind, **(ev.data or {})})
            )
        last_t = t
        progress = _progress(run, t)
        if not compiled_recorded and t >= run.compile_s:
            with ctx.db.write() as s:
                executables.record(
                    session=s,
                    key=plan.executable_key,
                    machine_type=taken.machine_type,
                    compile_s=run.compile_s,
                )
            compiled_recorded = True
        if t >= end_t:
            if end_t < run.total_s:
                _finish(
                    ctx, taken, AttemptState.TIMED_OUT, t, f"exceeded max_runtime_s={max_runtime:g}", progress
                )
                return "timed_out"
            _finish(ctx, taken, AttemptState.SUCCEEDED, t, None, progress)
            return "succeeded"
        if ctx.stopping() and (end_t - t) / scale > ctx.settings.worker_grace_s:
            _finish(ctx, taken, AttemptState.HANDED_BACK, t, "worker shutting down", progress)
            return "handed_back"
        directive = _heartbeat(ctx, taken, t, progress)
        if directive == Directive.CONTINUE:
            continue
        if directive == Directive.FENCED:
            log.warning("attempt %d: lease lost; stopping without writing", taken.attempt_id)
            return "fenced"
        outcome, reason = {
            Directive.CANCEL: (AttemptState.CANCELLED, "cancelled by user"),
            Directive.TIMEOUT: (AttemptState.TIMED_OUT, f"exceeded max_runtime_s={max_runtime:g}"),
            Directive.QUOTA: (AttemptState.FAILED, "stopped: the tenant's IPU-hour grant is used up"),
        }[directive]
        _finish(ctx, taken, outcome, t, reason, progress)
        return str(outcome)


def _progress(run: emulator.EmulatedRun, t: float) -> dict[str, Any]:
    p = run.progress_at(t)
    return {
        "phase": p.phase,
        "step": p.step,
        "steps": p.steps,
        "samples": p.samples,
        "percent": round(p.percent, 2),
        "eta_s": round(p.eta_s, 3),
        "throughput": round(p.throughput, 3),
        "memory_per_ipu_bytes": p.memory_per_ipu_bytes,
        "cluster_s": round(t, 3),
    }


def _with_retries(ctx: RunContext, what: str, fn: Callable[[], Any]) -> Any:
    """Ride out a short database outage, but never past the lease: then the attempt is lost anyway."""
    deadline = ctx.clock() + ctx.settings.lease_s
    delay = 0.1
    while True:
        try:
            return fn()
        except Exception as exc:
            if ctx.clock() + delay > deadline:
                raise
            log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
            ctx.sleep(delay)
            delay = min(delay * 2, 2.0)


def _heartbeat(ctx: RunContext, taken: TakenAttempt, t: float, progress: dict[str, Any]) -> Directive:
    ctx.seq += 1
    logs, ctx.pending = ctx.pending, []

    def beat() -> Directive:
        with ctx.db.write() as s:
            return attempts.heartbeat(
                session=s,
                attempt_id=taken.attempt_id,
                epoch=taken.epoch,
                seq=ctx.seq,
                cluster_s=t,
                lease_s=ctx.settings.lease_s,
                progress=progress,
                logs=logs,
            )

    try:
        directive: Directive = _with_retries(ctx, "heartbeat", beat)
    except Exception:
        log.exception("attempt %d: database unreachable for a whole lease; giving up", taken.attempt_id)
        return Directive.FENCED
    bus.publish(bus.job_channel(taken.job_id), "progress")
    return directive


def _finish(
    ctx: RunContext,
    taken: TakenAttempt,
    outcome: AttemptState,
    t: float,
    reason: str | None,
    progress: dict[str, Any] | None = None,
) -> None:
    logs, ctx.pending = ctx.pending, []

    def done() -> bool:
        with ctx.db.write() as s:
            return attempts.finish(
                session=s,
                attempt_id=taken.attempt_id,
                epoch=taken.epoch,
                outcome=outcome,
                cluster_s=t,
                reason=reason,
                progress=progress,
                logs=logs,
                max_attempts=ctx.settings.max_attempts,
            )

    try:
        accepted = _with_retries(ctx, "finish", done)
    except Exception:
        log.exception("attempt %d: could not record its end; the reconciler will", taken.attempt_id)
        return
    if not accepted:
        log.warning("attempt %d: finish refused (stale epoch)", taken.attempt_id)
    bus.publish(bus.job_channel(taken.job_id), "finished")
    bus.wake_scheduler("finish")
