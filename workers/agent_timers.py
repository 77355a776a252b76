"""The host agent's attempts as timers (workers/agent.py): each run brought up to the agent's clock,
its events, meter ticks and checkpoints noted for the next tick, its end; preemption warnings."""

from __future__ import annotations

import heapq

from scheduler.models import AttemptState
from scheduler.services.batch import attempts, executables
from scheduler.services.batch.attempts import Bill, Finish, LogLine
from scheduler.services.batch.checkpoints import CheckpointDue
from workers import faults, ipuof
from workers.agent_base import _END_EPS, _MIN_WAIT_S, AgentBase, _log_line, _Running, log


class AttemptTimers(AgentBase):
    """Drives each running attempt from a heap of timers."""

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
