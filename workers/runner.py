"""Run one attempt: take its lease, run the emulated IPU in cluster time, heartbeat, finish.

Every write goes through scheduler/ functions and carries the lease epoch, so a worker that was
paused, cut off or duplicated can change nothing once its lease is gone. The worker also keeps
its own conservative estimate of the lease (the time it sent the last accepted heartbeat, plus
the lease): once that passes without a heartbeat getting through, it stops retrying and stops
running, because the reconciler may already have given the partition to someone else.

Stopping: a pool process learns that its worker is shutting down from a flag file (Celery sends
pool processes no signal on a warm shutdown), or from a SIGTERM of its own (Celery sends one to
the process running a task when it loses the broker; systemd sends one to every process of the
unit). Either way an attempt that can finish within `worker_grace_s` finishes, and any other is
handed back: ended unbilled and queued again at once, without waiting for its lease to expire.

Wake-up hints to Redis go through a small background sender: a broker that hangs (rather than
refusing) must never hold up a heartbeat to the database.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from scheduler import bus, emulation
from scheduler.db import Database, get_database
from scheduler.models import AttemptState
from scheduler.services import attempts, executables
from scheduler.services.attempts import Directive, LogLine, TakenAttempt
from scheduler.settings import Settings, get_settings
from vipu import emulator
from vipu.topology import pods_of, spans_gw_links
from workers import faults, ipuof

log = logging.getLogger("ipucloud.worker")

# Exit status of a pool process that outlived the grace period after its SIGTERM.
TERMINATED_EXIT_CODE = 143

_terminate = threading.Event()  # this pool process got SIGTERM
_busy = threading.Event()  # this pool process is running an attempt


_previous_handler: Any = signal.SIG_DFL


def install_sigterm_handler() -> None:
    """Turn SIGTERM into finish-or-hand-back while an attempt runs in this process.

    Called as each attempt starts, not at pool process start: billiard installs its own SIGTERM
    handler (exit at once) after Celery's process initialisers have run, so one installed there
    would be replaced. Whatever handler was there still acts when no attempt is running.
    """
    global _previous_handler
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (a threaded pool): leave signals to the pool
        return
    _previous_handler = current


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if not _busy.is_set():
        # Nothing to hand back: do what the process did before (billiard's: exit at once).
        if callable(_previous_handler):
            _previous_handler(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if _terminate.is_set():
        return
    _terminate.set()
    # Whoever sent the signal wants this process gone: if the attempt's last write hangs, or the
    # pool never sends the process another task to refuse, it still ends.
    settings = get_settings()
    timer = threading.Timer(
        settings.worker_grace_s + settings.lease_s, os._exit, args=(TERMINATED_EXIT_CODE,)
    )
    timer.daemon = True
    timer.start()
    log.warning(
        "SIGTERM: the running attempt finishes within %.0fs or is handed back", settings.worker_grace_s
    )


def terminated() -> bool:
    """True once this pool process got SIGTERM (it hands back what it runs, then goes)."""
    return _terminate.is_set()


def refusing_work() -> bool:
    """True once this pool process was told to stop: it must not take another attempt."""
    if _terminate.is_set():
        return True
    from workers.app import stopping_flag

    return stopping_flag(os.getppid()).exists()


class Hints:
    """Fire-and-forget wake-ups (scheduler, log followers) on a background thread of their own.

    Lossy by design (DESIGN.md: losing one costs a tick of latency, never a job): when Redis
    hangs, hints queue up to a small bound and the rest are dropped.
    """

    def __init__(self, publish: Callable[[str, str], None] = bus.publish, bound: int = 64) -> None:
        self._publish = publish
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(maxsize=bound)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, channel: str, message: str) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, name="ipucloud-hints", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((channel, message))
        except queue.Full:
            log.debug("hint %s on %s dropped: the event bus is not keeping up", message, channel)

    def _drain(self) -> None:
        while True:
            channel, message = self._queue.get()
            try:
                self._publish(channel, message)
            except Exception as exc:  # a hint never takes the worker down
                log.debug("hint %s on %s not sent: %s", message, channel, exc)


_hints: Hints | None = None
_hints_lock = threading.Lock()


def hints() -> Hints:
    """This process's hint sender (made after the fork: threads do not survive one)."""
    global _hints
    with _hints_lock:
        if _hints is None:
            _hints = Hints()
        return _hints


# Executable keys this process has seen in the cache. Entries are never removed from the cache,
# so a key seen once needs no further lookup: a rerun of a configuration costs no query.
_known_executables: set[str] = set()


@dataclass
class RunContext:
    settings: Settings
    db: Database
    worker: str
    stopping: Callable[[], bool] = lambda: False
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    hint: Callable[[str, str], None] = bus.publish
    seq: int = 0
    pending: list[LogLine] = field(default_factory=list)
    # Monotonic time by which the lease surely ends unless a heartbeat extends it.
    lease_deadline: float = 0.0


def run(*, attempt_id: int, epoch: int, worker: str) -> str:
    from workers.app import stopping_flag

    settings = get_settings()
    flag = stopping_flag(os.getppid())
    ctx = RunContext(
        settings=settings,
        db=get_database(settings),
        worker=f"{worker}/{socket.gethostname()}:{os.getpid()}",
        stopping=lambda: _terminate.is_set() or flag.exists(),
        hint=hints().send,
    )
    install_sigterm_handler()
    _busy.set()
    try:
        return run_attempt(ctx, attempt_id=attempt_id, epoch=epoch)
    finally:
        _busy.clear()


def run_attempt(ctx: RunContext, *, attempt_id: int, epoch: int) -> str:
    sent = ctx.clock()

    def take() -> TakenAttempt | None:
        with ctx.db.write() as s:
            return attempts.take(
                session=s, attempt_id=attempt_id, epoch=epoch, worker=ctx.worker, lease_s=ctx.settings.lease_s
            )

    try:
        taken: TakenAttempt | None = _with_retries(ctx, "take", take, deadline=sent + ctx.settings.lease_s)
    except Exception:
        # Still placed (or taken by a commit whose reply was lost, and then its lease expires):
        # the reconciler publishes it again either way.
        log.exception("attempt %d: could not reach the database to take it", attempt_id)
        return "not-taken"
    if taken is None:
        log.info("attempt %d (epoch %d) is not ours to run: duplicate or stale delivery", attempt_id, epoch)
        return "not-taken"
    ctx.lease_deadline = sent + ctx.settings.lease_s
    ctx.hint(bus.job_channel(taken.job_id), "running")
    log.info(
        "running attempt %d (%d of %s) on partition %s at epoch %d",
        taken.attempt_id,
        taken.number,
        taken.job_id,
        taken.partition,
        taken.epoch,
    )
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
    try:
        # Timed on the partition it really got: how many POD64s it spans and whether GW-Links join them.
        # A tenant's own model is read from the database (once per process) by the id the spec carries.
        plan, spec = emulation.plan_job(
            db=ctx.db,
            workload=taken.spec["workload"],
            ipus=taken.partition_size,
            machine=taken.machine_type,
            pods=len(pods_of(taken.partition_ipus)),
            gw_links=spans_gw_links(taken.partition_ipus),
        )
    except (emulator.CompileError, emulator.WorkloadError) as exc:
        ctx.pending.append(LogLine("log", f"compile failed: {exc}", {"phase": "compile", "error": str(exc)}))
        return _finish(ctx, taken, AttemptState.FAILED, 0.0, f"compile error: {exc}")
    cached = plan.executable_key in _known_executables
    if not cached:
        with ctx.db.read() as s:
            cached = executables.is_cached(session=s, key=plan.executable_key)
        if cached:
            _known_executables.add(plan.executable_key)
    run = emulator.EmulatedRun(plan, spec, cached=cached)
    max_runtime = taken.max_runtime_s or float("inf")
    end_t = min(run.total_s, max_runtime)
    scale = ctx.settings.time_scale
    t0 = ctx.clock()
    last_t = 0.0
    compiled_recorded = cached

    def cluster_now() -> float:
        t = (ctx.clock() - t0) * scale
        # Within a microsecond of the end is the end: clock resolution must not leave the loop
        # heartbeating on a remainder too small for a sleep to cover.
        return end_t if t >= end_t - 1e-6 else t

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
            compiled_recorded = True
            try:
                with ctx.db.write() as s:
                    executables.record(
                        session=s,
                        key=plan.executable_key,
                        machine_type=taken.machine_type,
                        compile_s=run.compile_s,
                    )
                _known_executables.add(plan.executable_key)
            except Exception as exc:  # a cache entry lost costs a later compile, not this attempt
                log.warning("attempt %d: could not record its executable: %s", taken.attempt_id, exc)
        if t >= end_t:
            if end_t < run.total_s:
                return _finish(
                    ctx, taken, AttemptState.TIMED_OUT, t, f"exceeded max_runtime_s={max_runtime:g}", progress
                )
            return _finish(ctx, taken, AttemptState.SUCCEEDED, t, None, progress)
        if ctx.stopping() and (end_t - t) / scale > ctx.settings.worker_grace_s:
            return _finish(ctx, taken, AttemptState.HANDED_BACK, t, "worker shutting down", progress)
        directive = _heartbeat(ctx, taken, t, progress)
        if directive == Directive.CONTINUE:
            faults.crash_if_injected(str(taken.spec.get("name", "")), taken.attempt_id)
            continue
        if directive == Directive.FENCED:
            log.warning("attempt %d: lease lost; stopping without writing", taken.attempt_id)
            return "fenced"
        outcome, reason = {
            Directive.CANCEL: (AttemptState.CANCELLED, "cancelled by user"),
            Directive.TIMEOUT: (AttemptState.TIMED_OUT, f"exceeded max_runtime_s={max_runtime:g}"),
            Directive.QUOTA: (AttemptState.FAILED, "stopped: the tenant's IPU-hour grant is used up"),
        }[directive]
        return _finish(ctx, taken, outcome, t, reason, progress)


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


def _with_retries(ctx: RunContext, what: str, fn: Callable[[], Any], deadline: float | None = None) -> Any:
    """Ride out a short database outage, but never past the lease: then the attempt is lost anyway.

    Two tries are always made, even past the deadline: the database, not this worker's estimate,
    decides whether a late write still counts (it refuses it if the lease is gone), and a process
    that was frozen finds its first try failing on a connection the server dropped meanwhile.
    """
    deadline = ctx.lease_deadline if deadline is None else deadline
    delay = 0.1
    tries = 0
    while True:
        tries += 1
        try:
            return fn()
        except Exception as exc:
            if tries >= 2 and ctx.clock() + delay > deadline:
                raise
            log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
            ctx.sleep(delay)
            delay = min(delay * 2, 2.0)


def _heartbeat(ctx: RunContext, taken: TakenAttempt, t: float, progress: dict[str, Any]) -> Directive:
    ctx.seq += 1
    logs, ctx.pending = ctx.pending, []

    sent = ctx.clock()

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
        log.exception("attempt %d: database unreachable until its lease ran out; giving up", taken.attempt_id)
        return Directive.FENCED
    if directive != Directive.FENCED:
        ctx.lease_deadline = sent + ctx.settings.lease_s
    ctx.hint(bus.job_channel(taken.job_id), "progress")
    return directive


def _finish(
    ctx: RunContext,
    taken: TakenAttempt,
    outcome: AttemptState,
    t: float,
    reason: str | None,
    progress: dict[str, Any] | None = None,
) -> str:
    """Report the attempt's end. Returns the outcome, or `fenced` if the database refused it."""
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
        return "unrecorded"
    if not accepted:
        log.warning(
            "attempt %d: finish as %s refused: the lease of epoch %d is gone (expired or taken over)",
            taken.attempt_id,
            outcome,
            taken.epoch,
        )
        return "fenced"
    ctx.hint(bus.job_channel(taken.job_id), "finished")
    ctx.hint(bus.WAKE_CHANNEL, "finish")
    return str(outcome)
