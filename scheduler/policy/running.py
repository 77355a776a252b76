"""A running job as the policy sees it, in a module of its own: the time table
(scheduler/policy/timetable.py) keeps these, and the snapshot (scheduler/policy/model.py) keeps a
time table, so neither imports the other for it."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding a partition. ``expected_end`` is its start plus its predicted runtime.

    ``preemptible`` work may be stopped for non-preemptible work of any tenant. It checkpoints every
    ``checkpoint_every`` (the caller's clock; inf: never) from its start, so what it has run since
    its last checkpoint, which a stop without warning loses, follows from the time (`at_risk`)."""

    id: str
    tenant_id: str
    size: int
    partition: str
    started_at: float
    expected_end: float
    priority: int = 0
    reserved: bool = False  # runs in a reserved partition (which outlives it)
    preemptible: bool = False
    checkpoint_every: float = math.inf
    # A session's hold on its partition (scheduler/services/sessions/): its owner works in it
    # interactively and has nothing to checkpoint, so it is never stopped for other work.
    session: bool = False
    # Its owner opted it out of preemption (a job or plan setting): never stopped for other work.
    never_preempt: bool = False
    # How often this job was preempted before this attempt (a policy bounds it).
    preemptions: int = 0
    # When it was submitted (NaN: not known): preempted, it goes back to the queue as submitted then,
    # at the head of its tenant's newer work, and the forecast's replay requeues it the same way.
    submitted_at: float = math.nan
    # When its measured progress says it ends (`end_by_progress`; NaN: not measured yet). Only the
    # forecast reads it: the policy plans on ``expected_end``, and the forecast replays the policy.
    measured_end: float = math.nan

    def at_risk(self, now: float) -> float:
        """Run time since its last checkpoint at ``now``."""
        ran = max(0.0, now - self.started_at)
        return ran if ran < self.checkpoint_every else ran % self.checkpoint_every


# Complete steps a run must have timed before its step time is trusted: the first steps after a
# compile and load run slower (caches and host buffers fill), and one step is a sample of one.
MEASURED_STEPS = 3


def end_by_progress(at: float, *, done: float, total: float, measured_s: float) -> float:
    """When a running job ends by its measured progress: ``done`` of its ``total`` units of work
    (steps) took ``measured_s`` by ``at``, and the rest go at that rate. NaN with nothing measured.

    The live snapshot gives it the steps an attempt's agent reported and the time they took; the
    simulator, which has no steps, its model of the same measurement (scheduler/simulator/estimates.py).
    Either way it is far closer than the prediction made before the job ran (off by some 20% at the
    median), and the forecast frees a running job at it (`forecast.likely_end`)."""
    if done <= 0 or measured_s <= 0 or total < done:
        return math.nan
    return at + (total - done) * measured_s / done
