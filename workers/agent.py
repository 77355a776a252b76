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

import logging
import queue
import socket
import threading
import time
from pathlib import Path

from scheduler import bus
from scheduler.models import AttemptState
from scheduler.services.batch import attempts
from scheduler.services.batch.attempts import LogLine, TakenAttempt
from workers import faults, ipuof
from workers.agent_base import _FINISH_COALESCE_S, _TAKE_BATCH, Hints, _log_line, _Running, _Take
from workers.agent_notices import StopListener
from workers.serving import ServingHost

__all__ = ["Agent", "Hints", "default_name"]

log = logging.getLogger("ipucloud.worker")


class Agent(StopListener):
    """A host agent. `start()` it, hand it deliveries with `take()` (from any thread), `stop()` it.

    Its parts: its state (workers/agent_base.py), its attempts' timers (workers/agent_timers.py),
    its lease and the database (workers/agent_lease.py), the bus's notices (workers/agent_notices.py);
    here its life, its deliveries, the loop, takes and shutdown."""

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
            ipuof.release_runtime_root(self.settings)
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


def default_name(hostname: str | None = None) -> str:
    """An agent's name: the Celery node name it runs as (unique per host), else the host's."""
    return hostname or f"agent@{socket.gethostname()}"
