"""Service classes: which of two jobs of equal standing goes first, and which running job may be
preempted for a waiting one.

A job's *class* ranks it against every tenant's jobs below its plan's priority; fair share then
ranks tenants within a class. Two ways to set it:

- ``las`` (Tiresias' discretised least attained service, Gu et al., NSDI 2019): by the IPU-seconds
  a job has already had, in the queues ``thresholds_ipu_s`` bound. Needs no run time: short work is
  not stuck behind long work when nobody knows which is which.
- ``predicted``: by the IPU-seconds a job is still predicted to need (its size times its predicted
  remaining run time), in classes a doubling apart. The emulator predicts run times (off by about
  20% at the median), so the cloud need not find out by running a job how long it is; a job whose
  prediction is unknown (infinite) falls back to its attained-service queue below every predicted
  class.

Classes are ``0`` (first) and negative numbers (later), so that "higher goes first" holds as for
plan priorities. `promoted` lifts a job that has waited long (Tiresias' promotion of starved jobs):
one class per ``promote_after_s`` since it was queued, so no job waits behind shorter work for ever;
and a job *starved* for its size, one that has waited ``starve_slowdown`` times its predicted run
time (and at least ``starve_min_s``: `starved_after`), straight to the top class. Classes rank by
IPU-seconds, so a wide short job ranks behind every narrower job of less work: under a steady flow
of small jobs one of them is always first in line and holds the pass's one reservation, and the wide
job never gets one (on Gaia, two 64-IPU jobs of minutes waited 128 h while 4,932 small jobs started;
docs/scheduling.md). Lifted to the top, it leads the line, is reserved for and may preempt.
The promotion goes on while the job runs: the jobs it kept waiting rise as fast as it does, so they
never overtake it and preempt it straight back.

The plan's priority stays above all of it: `combined` puts the plan priority in the high digits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduler.policy.timetable import expected_end

if TYPE_CHECKING:
    from scheduler.policy.config import PolicyConfig
    from scheduler.policy.running import RunningJob

# Classes are a doubling of predicted remaining IPU-seconds apart, counted down from this ceiling
# (2**40 IPU-seconds is 35,000 IPU-years: no job reaches it), so class 0 is the shortest.
PREDICTED_LEVELS = 40
# A plan priority (-100 .. 100) outweighs every service class.
CLASS_SPAN = 1000


def attained_class(attained_ipu_s: float, thresholds_ipu_s: Sequence[float]) -> int:
    """Tiresias' queue: minus the number of thresholds the service had has reached."""
    return -sum(1 for limit in thresholds_ipu_s if attained_ipu_s >= limit)


def predicted_class(
    remaining_ipu_s: float, attained_ipu_s: float = 0.0, thresholds_ipu_s: Sequence[float] = ()
) -> int:
    """The class of a job predicted to need ``remaining_ipu_s`` more IPU-seconds: 0 for a second or
    less, one lower per doubling. Without a prediction (inf), its attained-service queue under
    every predicted class."""
    if not math.isfinite(remaining_ipu_s):
        return -PREDICTED_LEVELS - 1 + attained_class(attained_ipu_s, thresholds_ipu_s)
    if remaining_ipu_s <= 1.0:
        return 0
    return -min(PREDICTED_LEVELS, math.ceil(math.log2(remaining_ipu_s)))


def starved_after(config: PolicyConfig, predicted_runtime_s: float) -> float:
    """How long a job predicted to run ``predicted_runtime_s`` waits before it counts as starved and
    goes to the top class: ``starve_slowdown`` times its run, at least ``starve_min_s`` (inf: never,
    or a policy without the rule, or a job without a prediction)."""
    if config.starve_slowdown is None or not math.isfinite(predicted_runtime_s):
        return math.inf
    return max(config.starve_min_s, config.starve_slowdown * predicted_runtime_s)


def promoted(
    klass: int, waited_s: float, promote_after_s: float | None, starved_after_s: float = math.inf
) -> int:
    """``klass`` raised one step for every ``promote_after_s`` waited, never above 0; 0 once the
    job has waited ``starved_after_s``."""
    if klass >= 0 or waited_s <= 0:
        return klass
    if waited_s >= starved_after_s:
        return 0
    if promote_after_s is None or promote_after_s <= 0:
        return klass
    return min(0, klass + int(waited_s // promote_after_s))


def next_promotion(
    klass: int,
    queued_at: float,
    now: float,
    promote_after_s: float | None,
    starved_after_s: float = math.inf,
) -> float:
    """When a job queued at ``queued_at`` with base class ``klass`` next moves up (inf: never)."""
    starved = queued_at + starved_after_s
    if klass >= 0 or now >= starved:
        return math.inf  # at the top already
    if promote_after_s is None or promote_after_s <= 0:
        return starved
    steps = int(max(0.0, now - queued_at) // promote_after_s) + 1
    if klass + steps > 0:
        return starved
    return min(starved, queued_at + steps * promote_after_s)


def running_class(
    config: PolicyConfig,
    r: RunningJob,
    now: float,
    queued_at: float,
    starved_after_s: float,
) -> tuple[int, float]:
    """A running job's class under ``predicted`` classes (below its plan's priority), and when it
    next changes. The class is that of what it is still expected to run (past its prediction: as
    long again, `timetable.expected_end`), so it rises as the job nears its end, and its promotion
    goes on rising while it runs, as the classes of the jobs waiting behind it do: those it kept
    waiting never overtake it and preempt it straight back. The simulator's engine and the
    forecast's replay move running jobs' classes with it (the live loop: `job_class`)."""
    end = expected_end(r, now)
    remaining = r.size * (end - now)
    base = predicted_class(remaining, 0.0, config.las_thresholds_ipu_s)
    promote_s = config.promote_after_s
    klass = promoted(base, now - queued_at, promote_s, starved_after_s)
    crosses = end if remaining <= 1.0 else end - 2.0 ** (math.ceil(math.log2(remaining)) - 1) / r.size
    due = min(max(crosses, now), end, next_promotion(base, queued_at, now, promote_s, starved_after_s))
    return klass, due if due > now else end


def combined(plan_priority: int, klass: int) -> int:
    """One integer that orders by plan priority first, then service class."""
    return plan_priority * CLASS_SPAN + klass


def plan_of(priority: int) -> int:
    """The plan priority inside a `combined` value."""
    return round(priority / CLASS_SPAN)


def job_class(
    config: PolicyConfig,
    plan_priority: int,
    size: int,
    predicted_left_s: float,
    *,
    attained_ipu_s: float = 0.0,
    waited_s: float = 0.0,
    run_s: float | None = None,
) -> int:
    """The class a live job (queued or running) takes under ``config``: its plan priority, and below
    it, for a policy of ``predicted`` classes, the class of its predicted remaining IPU-seconds,
    promoted by its wait; starved (`starved_after`) by its predicted run as queued, ``run_s``
    (a queued job's: ``predicted_left_s``). The simulator's engine computes the same from the same
    functions."""
    if config.priority_from != "predicted":
        return plan_priority
    remaining = size * predicted_left_s if math.isfinite(predicted_left_s) else math.inf
    klass = predicted_class(max(0.0, remaining), attained_ipu_s, config.las_thresholds_ipu_s)
    starve = starved_after(config, predicted_left_s if run_s is None else run_s)
    return combined(plan_priority, promoted(klass, waited_s, config.promote_after_s, starve))
