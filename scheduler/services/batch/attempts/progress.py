"""A running attempt's progress, derived from its timeline and its agent's last answer, never written
every second."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, TypedDict, cast

from sqlalchemy.orm import object_session

from scheduler.clock import Clock
from scheduler.models import (
    Agent,
    Attempt,
    AttemptState,
)
from scheduler.policy.running import MEASURED_STEPS, end_by_progress
from vipu import emulator


def answered_until(attempt: Attempt, agent: Agent | None) -> datetime | None:
    """The wall time past which a running attempt's clock does not run: its agent's last heartbeat
    plus a quarter of the agent's lease. An agent that stops answering stops its attempts' clocks
    then, instead of their progress climbing for the rest of its lease and falling back when the
    lease lapses. A live agent renews every `IPUCLOUD_HEARTBEAT_S`, well inside that grace, so its
    runs are never held back. None (no limit): no agent, or another incarnation of it."""
    if agent is None or attempt.agent_epoch is None or agent.epoch != attempt.agent_epoch:
        return None
    grace = max(timedelta(0), (agent.lease_expires_at - agent.heartbeat_at) / 4)
    return agent.heartbeat_at + grace


def agent_of(attempt: Attempt) -> Agent | None:
    """The agent row of a running attempt, through the session the attempt was loaded in."""
    s = object_session(attempt)
    if s is None or not attempt.worker or attempt.state != AttemptState.RUNNING:
        return None
    return s.get(Agent, attempt.worker)


def derived_cluster_s(attempt: Attempt, now: datetime, *, agent: Agent | None = None) -> float:
    """How far a running attempt's run has got, from its start and its timeline: what the agent
    driving it reaches at `now`, without asking the agent, but no further than its agent answered
    (`answered_until`; the agent is looked up when not given)."""
    timeline = attempt.timeline
    if attempt.started_at is None or not timeline:
        return attempt.cluster_s
    until = answered_until(attempt, agent if agent is not None else agent_of(attempt))
    if until is not None and until < now:
        now = until
    # The clock it was taken at (its timeline's), not the process's: it runs on that to its end.
    t = Clock(float(timeline["scale"])).cluster_since(attempt.started_at, now)
    return max(attempt.cluster_s, min(float(timeline["end_s"]), max(0.0, t)))


class ProgressView(TypedDict):
    """How far a run has got at a cluster time: phase, step, samples, rate, memory."""

    phase: str
    step: int
    steps: int
    samples: int
    percent: float
    eta_s: float
    throughput: float
    memory_per_ipu_bytes: int
    cluster_s: float


def progress_of(attempt: Attempt, now: datetime) -> ProgressView | None:
    """The attempt's progress: derived while it runs, as recorded once it ended."""
    if attempt.state != AttemptState.RUNNING or not attempt.timeline:
        return cast("ProgressView | None", attempt.progress)  # what progress_dict gave, stored
    t = derived_cluster_s(attempt, now)
    return progress_dict(emulator.Timeline.from_dict(attempt.timeline).progress_at(t), t)


def progress_at(attempt: Attempt, cluster_s: float) -> ProgressView | None:
    """Where the attempt's timeline has it `cluster_s` into its run (None without a timeline)."""
    if not attempt.timeline:
        return None
    return progress_dict(emulator.Timeline.from_dict(attempt.timeline).progress_at(cluster_s), cluster_s)


def progress_dict(progress: emulator.Progress, cluster_s: float) -> ProgressView:
    return {
        "phase": progress.phase,
        "step": progress.step,
        "steps": progress.steps,
        "samples": progress.samples,
        "percent": round(progress.percent, 2),
        "eta_s": round(progress.eta_s, 3),
        "throughput": round(progress.throughput, 3),
        "memory_per_ipu_bytes": progress.memory_per_ipu_bytes,
        "cluster_s": round(cluster_s, 3),
    }


def measured_end(timeline: dict[str, Any] | None, started: datetime, now: datetime) -> float:
    """When a running attempt ends (wall, epoch seconds) by the progress it has reported: the steps it
    has left at the step time it measured (`end_by_progress`), once it has timed `MEASURED_STEPS` of
    them this attempt; NaN before (compiling, loading, its first steps) or without a timeline. The
    forecast frees it then (`RunningJob.measured_end`); the policy still plans on its prediction."""
    if not timeline:
        return math.nan
    clock = Clock(float(timeline.get("scale") or 1.0))  # the one it was taken at
    line = emulator.Timeline.from_dict(timeline)
    t = min(line.total_s, max(0.0, clock.cluster_since(started, now)))
    progress = line.progress_at(t)
    if progress.phase != "run" or progress.steps <= 0:
        return math.nan
    # Steps done this attempt, the one in flight by its share (a resumed run's checkpoint excluded).
    done = progress.percent / 100.0 * progress.steps - line.first_step
    if done < MEASURED_STEPS:
        return math.nan
    end = end_by_progress(
        t, done=done, total=progress.steps - line.first_step, measured_s=t - line.run_start_s
    )
    return started.timestamp() + clock.to_wall(end)
