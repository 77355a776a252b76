"""The host agent's lease and the database (workers/agent.py): registering, the tick (one
transaction for all its attempts), fencing when the lease is gone, the periodic look at what the
database says it runs, and releasing the lease at the end."""

from __future__ import annotations

import os
import socket

from scheduler import bus
from scheduler.models import AttemptState
from scheduler.services.batch import attempts
from scheduler.services.batch.attempts import Finish
from scheduler.services.capacity import agents
from workers import ipuof
from workers.agent_base import _FINISH_COALESCE_S, _distinct_jobs, log
from workers.agent_timers import AttemptTimers


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


class LeaseSync(AttemptTimers):
    """The agent's lease, renewed by its ticks, and what it writes with them."""

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

    def _release(self) -> None:
        assert self.lease is not None
        try:
            with self.db.write() as s:
                agents.release(session=s, lease=self.lease)
            log.info("agent %s released its lease", self.name)
        except Exception as exc:  # it then simply lapses
            log.warning("agent %s could not release its lease: %s", self.name, exc)
        self.hints.send([(bus.WAKE_CHANNEL, "agent")])
