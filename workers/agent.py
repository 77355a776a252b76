"""The host agent: every attempt on its racks, driven at once from one event loop.

A real site runs one agent per IPU host server, as it runs one slurmd per node. The agent serves the
Celery queues it is routed to (pods, machine types, or anything); a dispatch message hands it
"attempt N is ready", it takes the attempt durably (a compare-and-set in the database, batched
with whatever else arrived meanwhile) and the message is done. From then on the attempt is a timer
and a stream of events in this loop, not a process or a thread, so how many run at once is bounded
by the IPUs of the agent's racks, not by a pool.

Every tick (`IPUCLOUD_HEARTBEAT_S`) is one transaction for all its attempts: the agent's lease
renewed (one heartbeat for the whole host, scheduler.services.capacity.agents), the log lines that happened,
the meter ticks due (each running attempt every `IPUCLOUD_METER_INTERVAL_S`) and the attempts that
ended. Progress is not written: it follows from each run's timeline and start, which the take wrote.

Faults:
- The database is unreachable: the tick is retried, keeping what it would have written, but never
  past the lease. Once the agent's own conservative view of its lease (the start of its last tick
  that went through, plus the lease) has passed, it stops everything without writing: the
  reconciler may already have handed the partitions to someone else. It then registers again.
- Its lease lapsed anyway (the process was paused, its host cut off): the renewal at the start of
  every transaction is refused, so it can change nothing; it drops everything and registers anew.
- The control plane ended one of its attempts (a cancel, a preemption, a failed machine): a notice
  on the bus says so at once, and a look at the database every `IPUCLOUD_AGENT_SYNC_S` catches any
  notice that was lost. Either way the agent forgets the attempt; it never writes for it again.
- Shutdown: attempts that end within `IPUCLOUD_WORKER_GRACE_S` finish, the rest are handed back at
  once (ended unbilled and queued again, from a checkpoint taken then), and the lease is released.

Serving replicas (docs/endpoints.md): an endpoint's replica is an attempt like any other (taken,
billed per tick, ended, handed back), whose run compiles, loads and then serves until the control
plane drains it. Its requests are answered by `workers/serving.py`, on an asyncio loop of its own
beside this one; ending the attempt for any reason drains the replica (what it holds is answered,
what it had not started goes back to the endpoint's queue), losing the lease drops it.

Checkpoints (docs/checkpoints.md): a training attempt notes one every `checkpoint_every_s` of cluster
time, at its time limit, on shutdown and when warned of a preemption (a notice on the bus: it then
checkpoints at its next step boundary within the warning and ends itself, to be queued again). The
tick writes the latest noted per attempt, so they add no transaction and at most a row per attempt
per tick.
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from scheduler import bus, runtime
from scheduler.clock import Clock
from scheduler.db import Database
from scheduler.models import AttemptState
from scheduler.services.batch import attempts, executables
from scheduler.services.batch.attempts import Bill, Finish, LogLine, TakenAttempt
from scheduler.services.batch.checkpoints import CheckpointDue
from scheduler.services.capacity import agents
from scheduler.services.capacity.agents import AgentLease
from scheduler.settings import Settings
from vipu.emulator import RunEvent
from workers import faults, ipuof
from workers.serving import ServingHost

log = logging.getLogger("ipucloud.worker")

# Within a microsecond of its end is the end: clock resolution must not leave a run a remainder
# too small to wait for.
_END_EPS = 1e-6
# Finishes wait this long for others to share their transaction (a burst of short jobs ending).
_FINISH_COALESCE_S = 0.02
# The shortest wait for an attempt's next timer.
_MIN_WAIT_S = 0.001
# Deliveries taken in one transaction at most.
_TAKE_BATCH = 512


def _process_redis() -> redis.Redis:
    return runtime.current().redis


class Hints:
    """Fire-and-forget wake-ups (the scheduler, log followers) from a thread of their own.

    Lossy by design: losing one costs a moment of latency, never a job. A batch goes out as one
    Redis pipeline; when Redis hangs, batches queue up to a small bound and the rest are dropped, so
    a hint never holds up a tick.
    """

    def __init__(self, client: Callable[[], redis.Redis] | None = None, bound: int = 64) -> None:
        self._client = client or _process_redis
        self._queue: queue.Queue[list[tuple[str, str]]] = queue.Queue(maxsize=bound)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def send(self, messages: list[tuple[str, str]]) -> None:
        if not messages:
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, name="ipucloud-hints", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(messages)
        except queue.Full:
            log.debug("%d hints dropped: the event bus is not keeping up", len(messages))

    def _drain(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                client = self._client()
                pipe = client.pipeline(transaction=False)
                for channel, message in batch:
                    pipe.publish(bus.scoped(channel, client), message)
                pipe.execute()
            except Exception as exc:  # a hint never takes the agent down
                log.debug("%d hints not sent: %s", len(batch), exc)


@dataclass(eq=False)
class _Take:
    attempt_id: int
    epoch: int
    done: threading.Event = field(default_factory=threading.Event)
    outcome: str = "not-taken"


@dataclass(eq=False, slots=True)
class _Running:
    """One attempt as the loop drives it."""

    taken: TakenAttempt
    t0: float  # the agent's clock when the run's cluster time was 0
    last_t: float = 0.0  # cluster time up to which its events were written
    next_bill: float = 0.0  # the agent's clock at its next meter tick
    seq: int = 0  # meter ticks written
    version: int = 0  # its entry in the timer heap; older entries are stale
    next_checkpoint: float = float("inf")  # cluster time of its next periodic checkpoint
    preempt_at: float | None = None  # cluster time at which it checkpoints and ends, once warned
    preempt_why: str = "preempted for other work"  # what its owner is told (the scheduler's words)


def _pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one we may not signal still runs)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Agent:
    """A host agent. `start()` it, hand it deliveries with `take()` (from any thread), `stop()` it."""

    def __init__(
        self,
        *,
        settings: Settings,
        db: Database,
        name: str,
        queues: Iterable[str],
        clock: Callable[[], float] = time.monotonic,
        cluster_clock: Clock | None = None,
        hints: Hints | None = None,
        redis_client: Callable[[], redis.Redis] | None = None,
        on_name_taken: Callable[[str], None] | None = None,
    ) -> None:
        """`redis_client`: the bus's client; by default the process's runtime's (workers/app.py
        installs the worker's at start-up). `on_name_taken`: called with what to tell the operator
        when another live agent holds this name (the agent has stopped by then; the worker exits).
        `clock` is the agent's monotonic wall clock (a test may drive its own); `cluster_clock` converts
        it to the runs' cluster time: the worker's runtime's, by default the one `settings` describe."""
        redis_client = redis_client or _process_redis
        self.settings = settings
        self.db = db
        self.name = name
        self.queues = list(queues)
        self.clock = clock
        self.cluster_clock = cluster_clock or Clock.of(settings)
        self.hints = hints or Hints(redis_client)
        self._redis = redis_client
        self.lease: AgentLease | None = None
        self.running: dict[int, _Running] = {}
        self._timers: list[tuple[float, int, int, int]] = []
        self._timer_seq = 0
        self._takes: queue.SimpleQueue[_Take] = queue.SimpleQueue()
        self._stop_notices: deque[int] = deque()
        self._preempt_notices: deque[tuple[int, float, str]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._stop_deadline = 0.0
        self._handed_back_at_stop = False
        self._done = threading.Event()
        self._registered = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: threading.Thread | None = None
        # What the next tick writes.
        self._logs: list[LogLine] = []
        self._bills: list[Bill] = []
        self._finishes: list[Finish] = []
        self._compiled: list[tuple[str, str, float]] = []
        self._saved: dict[int, CheckpointDue] = {}  # the latest checkpoint noted per attempt
        self._first_finish_at: float | None = None
        self._next_tick = 0.0
        self._next_sync = 0.0
        self._lease_deadline = 0.0
        self._retry_delay = 0.0
        self._crash_armed: set[int] = set()
        self._crash_now: set[int] = set()
        self._serving: ServingHost | None = None
        self.on_name_taken = on_name_taken
        self.name_taken: str | None = None

    # Life ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"agent-{self.name}", daemon=True)
        self._thread.start()
        self._listener = threading.Thread(target=self._listen, name="agent-stop-notices", daemon=True)
        self._listener.start()

    def stop(self, grace_s: float | None = None) -> None:
        """Begin a clean shutdown: take nothing more, finish what ends within the grace, hand back
        the rest. Returns at once; `join` waits."""
        grace = self.settings.worker_grace_s if grace_s is None else grace_s
        if not self._stopping:
            self._stop_deadline = self.clock() + grace
            self._stopping = True
            log.info(
                "agent %s stopping: %d attempts finish within %.0fs or are handed back",
                self.name, len(self.running), grace,
            )  # fmt: skip
        self._wake.set()

    def join(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def wait_registered(self, timeout: float) -> bool:
        return self._registered.wait(timeout)

    # Deliveries (any thread) ----------------------------------------------------------------------------

    def take(self, attempt_id: int, epoch: int, timeout: float | None = None) -> str:
        """Take a delivered attempt; returns once the take is durable (or refused): `taken`,
        `not-taken` (a duplicate, stale or unwanted delivery, or the database could not be reached:
        the outbox publishes it again), `failed` (it cannot run on its partition) or `stopping`."""
        if self._stopping:
            return "stopping"
        request = self.deliver(attempt_id, epoch)
        wait = self.settings.lease_s + self.settings.startup_wait_s if timeout is None else timeout
        if not request.done.wait(wait):
            return "not-taken"
        return request.outcome

    def deliver(self, attempt_id: int, epoch: int) -> _Take:
        """Queue a delivery for the loop's next take; `take` waits for it."""
        request = _Take(attempt_id, epoch)
        self._takes.put(request)
        self._wake.set()
        return request

    # The loop ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self.step():
                self._sleep(self.clock())
        except Exception:
            log.exception("agent %s: its loop failed; everything it ran is left to its lease", self.name)
        finally:
            self._answer_takes("stopping")
            if self._serving is not None:
                self._serving.close()
            self._done.set()

    def step(self) -> bool:
        """One turn of the loop, without waiting; False once the agent has stopped. The loop thread
        runs it; a test may run it itself on a clock of its own."""
        if self.lease is None:
            if self._stopping:
                return False
            if not self._register():
                self._answer_takes("not-taken")
                self._wake.wait(min(2.0, self.settings.lease_s / 2))
                self._wake.clear()
            return True
        self._apply_stop_notices()
        self._take_pending()
        if self.lease is None:
            return True
        self._fire_timers(self.clock())
        now = self.clock()
        if self._stopping:
            self._wind_down(now)
        if self._tick_due(now):
            self._tick()
            if self.lease is None:
                return True
        if now >= self._next_sync and not self._stopping:
            self._sync()
        if self._stopping and not self.running and not self._has_writes():
            self._release()
            return False
        return True

    def _register(self) -> bool:
        host, takeover = socket.gethostname(), False
        for _ in range(2):
            try:
                with self.db.write() as s:
                    lease, ended = attempts.register_agent(
                        session=s,
                        name=self.name,
                        host=host,
                        pid=os.getpid(),
                        queues=self.queues,
                        lease_s=self.settings.lease_s,
                        max_attempts=self.settings.max_attempts,
                        takeover=takeover,
                    )
                break
            except agents.NameTaken as exc:
                if exc.host == host and not _pid_alive(exc.pid):
                    takeover = True  # this host's previous agent died: a restart takes its place
                    continue
                self._refuse_name(str(exc))
                return False
            except Exception as exc:
                log.warning("agent %s cannot register (%s); trying again", self.name, exc)
                return False
        else:
            return False
        started = self.clock()
        self.lease = lease
        self._lease_deadline = started + self.settings.lease_s
        self._next_tick = started + self.settings.heartbeat_s
        self._next_sync = started + self.settings.agent_sync_s
        self._registered.set()
        log.info(
            "agent %s registered at epoch %d, serving %s%s",
            self.name, lease.epoch, ", ".join(self.queues),
            f"; {len(ended)} attempts of its previous run ended" if ended else "",
        )  # fmt: skip
        if ended:
            self.hints.send([(bus.WAKE_CHANNEL, "agent")])
        return True

    def _refuse_name(self, message: str) -> None:
        """Another live agent holds this name: stop for good (retrying would take its lease from
        it every few seconds, and it ours) and say what to set."""
        log.error("agent %s not started: %s", self.name, message)
        self.name_taken = message
        self._stopping = True
        self._registered.set()
        if self.on_name_taken is not None:
            self.on_name_taken(message)

    def _answer_takes(self, outcome: str) -> None:
        while True:
            try:
                request = self._takes.get_nowait()
            except queue.Empty:
                return
            request.outcome = outcome
            request.done.set()

    def _sleep(self, now: float) -> None:
        until = self._next_tick
        if self._timers:
            until = min(until, self._timers[0][0])
        if self._first_finish_at is not None:
            until = min(until, self._first_finish_at + _FINISH_COALESCE_S)
        if not self._stopping:
            until = min(until, self._next_sync)
        delay = until - now
        if delay > 0:
            self._wake.wait(delay)
        self._wake.clear()

    # Takes ----------------------------------------------------------------------------------------------

    def _take_pending(self) -> None:
        batch: list[_Take] = []
        while len(batch) < _TAKE_BATCH:
            try:
                batch.append(self._takes.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return
        if self._stopping:
            for request in batch:
                request.outcome = "stopping"
                request.done.set()
            return
        assert self.lease is not None
        lease = self.lease
        started = self.clock()
        try:
            with self.db.write() as s:
                result = attempts.take_many(
                    session=s,
                    agent=lease,
                    deliveries=[(r.attempt_id, r.epoch) for r in batch],
                    lease_s=self.settings.lease_s,
                    clock=self.cluster_clock,
                    running=len(self.running),
                    ipus_busy=self._ipus_busy(),
                )
        except Exception as exc:
            # Still placed (or taken by a commit whose reply was lost: the next look at the database
            # hands it back): the outbox publishes it again either way.
            log.warning("agent %s: could not take %d attempts: %s", self.name, len(batch), exc)
            for request in batch:
                request.done.set()
            return
        if result.fenced:
            for request in batch:
                request.done.set()
            self._fence("its lease was gone when it took attempts")
            return
        self._lease_deadline = started + self.settings.lease_s
        t0 = self.clock()
        for taken in result.taken:
            self._begin(taken, t0)
        outcome = {a.attempt_id: "taken" for a in result.taken}
        outcome.update({a: "failed" for a in result.failed})
        epochs = {r.attempt_id: r.epoch for r in reversed(batch)}  # each id's first delivery
        refused = [(a, epochs.get(a, -1)) for a in result.refused]
        answered: set[int] = set()
        for request in batch:
            if request.attempt_id in answered:
                # The same message delivered twice into one batch: the first delivery took it.
                request.outcome = "not-taken"
                refused.append((request.attempt_id, request.epoch))
            else:
                request.outcome = outcome.get(request.attempt_id, "not-taken")
                answered.add(request.attempt_id)
            request.done.set()
        for attempt_id, epoch in refused:
            log.info("attempt %d (epoch %d) is not ours to run: a duplicate, stale or unwanted delivery",
                     attempt_id, epoch)  # fmt: skip
        hints = [(bus.job_channel(a.job_id), "running") for a in result.taken]
        if result.failed:
            hints.append((bus.WAKE_CHANNEL, "finish"))
        self.hints.send(hints)

    def _begin(self, taken: TakenAttempt, t0: float) -> None:
        r = _Running(taken=taken, t0=t0, next_bill=t0 + self.settings.meter_interval_s)
        if taken.checkpoint_every_s is not None:
            r.next_checkpoint = taken.checkpoint_every_s
        self.running[taken.attempt_id] = r
        try:
            config: Path | None = ipuof.write_attempt_files(
                self.settings,
                attempt_id=taken.attempt_id,
                epoch=taken.epoch,
                tenant_id=taken.tenant_id,
                partition=taken.partition,
                gcd_ipus=taken.partition_ipus,
                gcds=taken.partition_gcds,
                gcd=taken.gcd,
                machine_type=taken.machine_type,
            )
        except OSError as exc:
            # The run goes on without its files (the emulated IPU needs none); the log says so.
            log.warning(
                "agent %s: could not write the files of attempt %d: %s", self.name, taken.attempt_id, exc
            )
            config = None
        env = ipuof.environment(self.settings, taken.partition, taken.gcd, config)
        env.update(taken.environment or {})  # an array element's IPUCLOUD_ARRAY_* and SLURM_ARRAY_*
        self._logs.append(
            LogLine(
                taken.job_id,
                taken.number,
                "log",
                f"attached to partition {taken.partition} (GCD {taken.gcd}, {taken.partition_size} IPUs)",
                {"env": env},
                taken.started_at,
            )
        )
        if faults.crash_armed(taken.job_name):
            self._crash_armed.add(taken.attempt_id)
        if taken.endpoint_id is not None:
            self._serve(taken, t0)
        self._schedule(r, t0)

    def _serve(self, taken: TakenAttempt, t0: float) -> None:
        """Hand a replica to the model servers: it takes requests once its run has loaded."""
        if self._serving is None:
            self._serving = ServingHost(self.settings.broker_url)
            self._serving.start()
        loaded_in = self.cluster_clock.to_wall(taken.run.run_start_s) - (self.clock() - t0)
        self._serving.add(
            attempt_id=taken.attempt_id,
            endpoint_id=taken.endpoint_id or "",
            plan=taken.run.plan,  # type: ignore[arg-type]
            cluster_clock=self.cluster_clock,
            ready_at=time.time() + max(0.0, loaded_in),
        )

    def _unserve(self, r: _Running) -> None:
        if r.taken.endpoint_id is not None and self._serving is not None:
            self._serving.drain(r.taken.attempt_id)

    def _ipus_busy(self) -> int:
        return sum(r.taken.partition_size for r in self.running.values())

    # Timers -----------------------------------------------------------------------------------------------

    def _schedule(self, r: _Running, at: float) -> None:
        r.version += 1
        self._timer_seq += 1
        heapq.heappush(self._timers, (at, self._timer_seq, r.taken.attempt_id, r.version))

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, attempt_id, version = heapq.heappop(self._timers)
            r = self.running.get(attempt_id)
            if r is None or r.version != version:
                continue
            try:
                if attempt_id in self._crash_now:
                    faults.crash(attempt_id)
                self._advance(r, now)
            except Exception as exc:
                # A run that fails in the agent's own code is the platform's fault, and only its
                # own: it goes back unbilled (the retry limit stops a job that fails every time),
                # and every other attempt of the loop carries on.
                log.exception("agent %s: attempt %d crashed", self.name, attempt_id)
                self._end(r, AttemptState.LOST, r.last_t, f"its run crashed in its host agent: {exc}")

    def _cluster_t(self, r: _Running, now: float) -> float:
        t = self.cluster_clock.to_cluster(now - r.t0)
        return r.taken.end_s if t >= r.taken.end_s - _END_EPS else max(0.0, t)

    def _advance(self, r: _Running, now: float) -> None:
        """Bring one attempt up to `now`: its events, its meter tick if due, its end."""
        taken, run, cluster = r.taken, r.taken.run, self.cluster_clock
        t = self._cluster_t(r, now)
        preempted = r.preempt_at is not None and t >= r.preempt_at and r.preempt_at < taken.end_s
        if preempted:
            t = max(r.last_t, r.preempt_at or t)  # it stopped there, however late the loop looks
        for ev in run.events_between(r.last_t, t):
            self._logs.append(_log_line(taken, ev, cluster))
            if ev.kind == "compile_end":
                cache_key = executables.tenant_key(tenant_id=taken.tenant_id, key=run.plan.executable_key)
                self._compiled.append((cache_key, taken.machine_type, run.compile_s))
        r.last_t = t
        if preempted:
            saved = self._save(r, t, "preemption")
            at = f"checkpointed after step {saved.step:,}" if saved else "no step to checkpoint"
            self._end(r, AttemptState.PREEMPTED, t, f"{r.preempt_why} ({at}); requeued")
            return
        if t >= taken.end_s:
            if taken.timed_out:
                self._save(r, t, "time_limit")
                self._end(r, AttemptState.TIMED_OUT, t, f"exceeded max_runtime_s={taken.max_runtime_s:g}")
            else:
                self._end(r, AttemptState.SUCCEEDED, t, None)
            return
        if t >= r.next_checkpoint:
            self._save(r, t, "periodic")
            r.next_checkpoint = t + (taken.checkpoint_every_s or float("inf"))
        if now >= r.next_bill:
            r.seq += 1
            self._bills.append(Bill(taken.attempt_id, r.seq, t))
            r.next_bill = max(r.next_bill + self.settings.meter_interval_s, now)
        after = run.next_event_at(t)
        wake = r.t0 + cluster.to_wall(min(taken.end_s, r.next_checkpoint, r.preempt_at or taken.end_s))
        if after is not None:
            wake = min(wake, r.t0 + cluster.to_wall(after))
        # An event at exactly `t` is written once time has moved past it ([last_t, t) is half-open).
        self._schedule(r, max(min(wake, r.next_bill), now + _MIN_WAIT_S))

    def _save(self, r: _Running, t: float, reason: str) -> CheckpointDue | None:
        """Note the attempt's checkpoint at `t` (its last completed step) for the next tick."""
        checkpoint = r.taken.checkpoint_at(t, reason)
        if checkpoint is not None:
            previous = self._saved.get(r.taken.attempt_id)
            if previous is None or previous.step <= checkpoint.step:
                self._saved[r.taken.attempt_id] = checkpoint
        return checkpoint

    def _warn(self, attempt_id: int, window_s: float, why: str = "") -> None:
        """A preemption warning: checkpoint at the next step boundary within `window_s` cluster
        seconds (or at its end, at the last step completed), then end. `why` is the scheduler's
        reason, told to the job's owner."""
        r = self.running.get(attempt_id)
        if r is None or r.preempt_at is not None:
            return
        if why:
            r.preempt_why = why
        t = self._cluster_t(r, self.clock())
        timeline = r.taken.run.timeline
        at = t  # compiling or loading: nothing to save, and the IPUs are wanted now
        if t >= timeline.run_start_s:
            step = timeline.step_at(t)
            boundary = timeline.step_time(step)
            if boundary < t - _END_EPS:
                boundary = timeline.step_time(step + 1)
            at = min(boundary, t + window_s)
        r.preempt_at = at
        # The job's own log says so (the warning event alone was in the job's events, which its
        # owner following the log never saw).
        step_note = (
            f"checkpoints after step {timeline.step_at(at):,} and stops"
            if r.taken.checkpoint_every_s is not None and at >= timeline.run_start_s
            else "stops"
        )
        self._logs.append(
            LogLine(
                r.taken.job_id,
                r.taken.number,
                "log",
                f"WARNING: {r.preempt_why}: it {step_note} at {at:,.1f} s "
                f"({self.cluster_clock.name}), then is queued again"
                + (" and resumes from that checkpoint" if "checkpoints" in step_note else ""),
                {
                    "t": round(t, 3),
                    "kind": "preemption_warning",
                    "ends_at_s": round(at, 3),
                    "level": "warning",
                },
                self.cluster_clock.wall_after(r.taken.started_at, t),
            )
        )
        log.info("agent %s: attempt %d preempted; checkpoints and ends at cluster time %.1f",
                 self.name, attempt_id, at)  # fmt: skip
        self._schedule(r, r.t0 + self.cluster_clock.to_wall(at))

    def _end(self, r: _Running, outcome: AttemptState, t: float, reason: str | None) -> None:
        progress = attempts.progress_dict(r.taken.run.progress_at(t), t)
        self._unserve(r)
        self.running.pop(r.taken.attempt_id, None)
        ipuof.remove_attempt_files(self.settings, r.taken.attempt_id)
        self._crash_armed.discard(r.taken.attempt_id)
        self._crash_now.discard(r.taken.attempt_id)
        r.version += 1
        self._finishes.append(Finish(r.taken.attempt_id, outcome, t, reason, progress))
        if self._first_finish_at is None:
            self._first_finish_at = self.clock()

    def _forget(self, attempt_id: int) -> None:
        r = self.running.pop(attempt_id, None)
        if r is not None:
            r.version += 1
            self._unserve(r)
            ipuof.remove_attempt_files(self.settings, attempt_id)
            log.info("agent %s: attempt %d was ended by the control plane; stopped driving it",
                     self.name, attempt_id)  # fmt: skip
        self._crash_armed.discard(attempt_id)
        self._crash_now.discard(attempt_id)

    # Ticks -------------------------------------------------------------------------------------------------

    def _has_writes(self) -> bool:
        return bool(self._logs or self._bills or self._finishes or self._compiled or self._saved)

    def _tick_due(self, now: float) -> bool:
        if now >= self._next_tick:
            return True
        return self._first_finish_at is not None and now >= self._first_finish_at + _FINISH_COALESCE_S

    def _tick(self) -> None:
        """One transaction: the heartbeat and everything since the last tick."""
        assert self.lease is not None
        lease = self.lease
        logs, bills, finishes, compiled = self._logs, self._bills, self._finishes, self._compiled
        self._logs, self._bills, self._finishes, self._compiled = [], [], [], []
        saved, self._saved = self._saved, {}
        first_finish = self._first_finish_at
        self._first_finish_at = None
        started = self.clock()
        try:
            with self.db.write() as s:
                result = attempts.record_tick(
                    session=s,
                    agent=lease,
                    lease_s=self.settings.lease_s,
                    running=len(self.running),
                    ipus_busy=self._ipus_busy(),
                    logs=logs,
                    bills=bills,
                    finishes=finishes,
                    compiled=compiled,
                    max_attempts=self.settings.max_attempts,
                    saved=list(saved.values()),
                )
        except Exception as exc:
            if self.clock() >= self._lease_deadline:
                log.error("agent %s: database unreachable until its lease ran out (%s)", self.name, exc)
                self._fence("the database could not be reached within its lease")
                return
            # Keep what it would have written for the next try; bills of the same attempt may
            # repeat (a later one bills up to a later time, the earlier is then a no-op).
            self._logs[:0], self._bills[:0], self._finishes[:0], self._compiled[:0] = (
                logs, bills, finishes, compiled
            )  # fmt: skip
            for attempt_id, checkpoint in saved.items():
                newer = self._saved.get(attempt_id)
                if newer is None or newer.step < checkpoint.step:
                    self._saved[attempt_id] = checkpoint
            self._first_finish_at = first_finish
            self._retry_delay = min(max(self._retry_delay * 2, 0.1), 2.0)
            self._next_tick = self.clock() + self._retry_delay
            log.warning("agent %s: tick failed (%s); retrying in %.1fs", self.name, exc, self._retry_delay)
            return
        self._retry_delay = 0.0
        if result.fenced:
            self._fence("its lease lapsed")
            return
        self._lease_deadline = started + self.settings.lease_s
        self._next_tick = started + self.settings.heartbeat_s
        for attempt_id in result.gone:
            self._forget(attempt_id)
        for attempt_id in result.exhausted:
            r = self.running.get(attempt_id)
            if r is not None:
                self._end(r, AttemptState.FAILED, r.last_t, "stopped: the tenant's IPU-hour grant is used up")
        hints = [(bus.job_channel(line.job_id), "log") for line in _distinct_jobs(logs)]
        if result.finished:
            hints.append((bus.WAKE_CHANNEL, "finish"))
        self.hints.send(hints)
        for bill in bills:
            if bill.attempt_id in self._crash_armed and bill.attempt_id not in result.gone:
                # Its first meter tick is written: it crashes mid-run, with time billed to refund.
                self._crash_armed.discard(bill.attempt_id)
                self._crash_now.add(bill.attempt_id)

    def _fence(self, why: str) -> None:
        """The lease is gone: drop everything without writing, and register anew."""
        log.warning(
            "agent %s (epoch %s): %s; dropping its %d attempts without writing",
            self.name, self.lease.epoch if self.lease else "?", why, len(self.running),
        )  # fmt: skip
        for r in self.running.values():
            r.version += 1
            ipuof.remove_attempt_files(self.settings, r.taken.attempt_id)
        if self._serving is not None:
            self._serving.drop_all()
        self.running.clear()
        self._timers.clear()
        self._logs, self._bills, self._finishes, self._compiled = [], [], [], []
        self._saved = {}
        self._first_finish_at = None
        self._crash_armed.clear()
        self._crash_now.clear()
        self.lease = None
        self._registered.clear()

    # The truth -------------------------------------------------------------------------------------------

    def _listen(self) -> None:
        """Stop notices from the bus, on a thread of its own (a blocking read)."""
        prefix = f"{self.name} "
        while not self._done.is_set():
            try:
                client = self._redis()
                stop_channel, preempt_channel = (
                    bus.scoped(bus.STOP_CHANNEL, client), bus.scoped(bus.PREEMPT_CHANNEL, client)
                )  # fmt: skip
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(stop_channel, preempt_channel)
                while not self._done.is_set():
                    msg = pubsub.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    data = msg.get("data")
                    text = data.decode() if isinstance(data, bytes) else str(data)
                    channel = msg.get("channel")
                    channel = channel.decode() if isinstance(channel, bytes) else str(channel)
                    if channel == preempt_channel and text.startswith(prefix):
                        try:
                            attempt_id, window, *why = text[len(prefix) :].split(maxsplit=2)
                            self._preempt_notices.append((int(attempt_id), float(window), "".join(why)))
                        except ValueError:
                            continue
                        self._wake.set()
                    elif text.startswith(prefix):
                        try:
                            self._stop_notices.append(int(text[len(prefix) :]))
                        except ValueError:
                            continue
                        self._wake.set()
            except Exception as exc:
                # The database look every IPUCLOUD_AGENT_SYNC_S still catches every stop.
                log.debug("agent %s: stop notices unavailable (%s)", self.name, exc)
                time.sleep(1.0)

    def _apply_stop_notices(self) -> None:
        while self._stop_notices:
            self._forget(self._stop_notices.popleft())
        while self._preempt_notices:
            self._warn(*self._preempt_notices.popleft())

    def _sync(self) -> None:
        """Compare what it drives with what the database says it runs."""
        assert self.lease is not None
        self._next_sync = self.clock() + self.settings.agent_sync_s
        try:
            with self.db.read() as s:
                held = agents.running_attempt_ids(session=s, lease=self.lease)
        except Exception as exc:
            log.warning("agent %s: could not look at what it runs: %s", self.name, exc)
            return
        ending = {f.attempt_id for f in self._finishes}
        for attempt_id in set(self.running) - held:
            self._forget(attempt_id)
        unknown = held - set(self.running) - ending
        if unknown:
            # Taken by a commit whose reply never arrived: it cannot be driven from here, so it
            # goes back at once rather than waiting for this agent's lease to run out.
            log.warning(
                "agent %s: handing back attempts %s it did not know it held", self.name, sorted(unknown)
            )
            self._finishes.extend(
                Finish(a, AttemptState.HANDED_BACK, 0.0, "its host agent lost track of it") for a in unknown
            )
            self._first_finish_at = self._first_finish_at or self.clock()

    # Shutdown ----------------------------------------------------------------------------------------------

    def _wind_down(self, now: float) -> None:
        left = self._stop_deadline - now
        for r in list(self.running.values()):
            t = self._cluster_t(r, now)
            remaining = self.cluster_clock.to_wall(r.taken.end_s - t)
            if left <= 0 or (not self._handed_back_at_stop and remaining > left):
                self._logs.extend(
                    _log_line(r.taken, ev, self.cluster_clock)
                    for ev in r.taken.run.events_between(r.last_t, t)
                )
                r.last_t = t
                self._save(r, t, "shutdown")
                self._end(r, AttemptState.HANDED_BACK, t, "its host agent is shutting down")
        self._handed_back_at_stop = True

    def _release(self) -> None:
        assert self.lease is not None
        try:
            with self.db.write() as s:
                agents.release(session=s, lease=self.lease)
            log.info("agent %s released its lease", self.name)
        except Exception as exc:  # it then simply lapses
            log.warning("agent %s could not release its lease: %s", self.name, exc)
        self.hints.send([(bus.WAKE_CHANNEL, "agent")])


def _log_line(taken: TakenAttempt, ev: RunEvent, clock: Clock) -> LogLine:
    """A run event as a line of its job's log; the end's line says what the grant is charged."""
    message, data = ev.message, {"t": round(ev.t, 3), "kind": ev.kind, **(ev.data or {})}
    hours = data.get("ipu_hours")
    if ev.kind == "done" and isinstance(hours, int | float):
        message = taken.done_message(message, float(hours))
        data["rate"] = taken.rate
    return LogLine(taken.job_id, taken.number, "log", message, data, clock.wall_after(taken.started_at, ev.t))


def _distinct_jobs(lines: list[LogLine]) -> list[LogLine]:
    seen: dict[str, LogLine] = {}
    for line in lines:
        seen.setdefault(line.job_id, line)
    return list(seen.values())


def default_name(hostname: str | None = None) -> str:
    """An agent's name: the Celery node name it runs as (unique per host), else the host's."""
    return hostname or f"agent@{socket.gethostname()}"
