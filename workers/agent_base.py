"""The host agent's state (workers/agent.py): what its loop keeps, the records it drives and the
hints it sends. The agent's parts build on it: its attempts' timers (workers/agent_timers.py), its
lease and the database (workers/agent_lease.py), the bus's stop notices (workers/agent_notices.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis

from scheduler import bus, runtime
from scheduler.clock import Clock
from scheduler.db import Database
from scheduler.services.batch.attempts import Bill, Finish, LogLine, TakenAttempt
from scheduler.services.batch.checkpoints import CheckpointDue
from scheduler.services.capacity.agents import AgentLease
from scheduler.settings import Settings
from vipu.emulator import RunEvent
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


class AgentBase:
    """What a host agent keeps; `Agent` (workers/agent.py) is the whole of it."""

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

    def _unserve(self, r: _Running) -> None:
        if r.taken.endpoint_id is not None and self._serving is not None:
            self._serving.drain(r.taken.attempt_id)

    def _ipus_busy(self) -> int:
        return sum(r.taken.partition_size for r in self.running.values())


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
