"""What a policy knows of a job's run time before it runs: the four estimate models of the simulator.

- ``perfect``: the true run time (an upper bound on what any estimate can give).
- ``predicted`` (the default): what the emulator would predict. ipucloud predicts a job's run time
  from its workload, plan and partition (``vipu.emulator.predicted_runtime_s``); a trace carries no
  workload, so the simulator models that prediction as the true run time times a log-normal error,
  ``exp(N(0, sigma))`` with ``sigma = 0.3`` by default: the median prediction is off by about 20%,
  one in ten by more than 60% either way. That is the prediction made before the job runs. Once it
  has run, its host agent reports its progress (steps done of its steps, and the time they took), and
  the live forecast frees it when that says (``scheduler.policy.running.end_by_progress``). The
  simulator models what that measurement knows: after a warm-up of ``WARMUP_S`` (600 s) of its
  attempt, its compile (the emulator's anchors: 8 minutes for BERT-Base on 4 IPUs, 9.5 for BERT-Large
  on 64) plus its first timed steps, the time it has left is known to within a log-normal error
  ``exp(N(0, MEASUREMENT_ERROR))``, 0.05 (drawn once per attempt: a step time measured over steps
  that vary by a few per cent from host I/O and data loading; the emulator's own steps do not vary,
  so the live measurement is closer still). Before the warm-up, and for a job that ends within it,
  only the prediction is known (`measured_end`).
- ``user``: what users ask for as a time limit, after the published studies of real logs. Users
  overestimate, and pick from a few round values: Mu'alem and Feitelson (IEEE TPDS 12(6), 2001)
  found the accuracy (run time / estimate) spread roughly uniformly over (0, 1]; Tsafrir, Etsion and
  Feitelson ("Modeling User Runtime Estimates", JSSPP 2005) found that some twenty round values
  cover about 90% of jobs and that the single most popular request is the queue's maximum. So: one
  job in seven asks for the limit; every other job asks for the smallest round value at or above
  ``run time / a`` with ``a ~ U(0, 1]``, never more than the limit. Requests never fall short of the
  run time, because the limit is what Slurm kills a job at, and the trace ran to completion.
  A trace that carries its users' requests (an SWF log's requested time) gives them instead, capped
  at the limit, for every job that has one.
- ``none``: no estimate at all, so every job counts as running to the limit (what Slurm assumes of a
  job submitted without ``--time``: the partition's ``DefaultTime``, here its maximum).

The limit (the queue's maximum run time) is the longest run time in the trace rounded up to a whole
day unless given. Every model is deterministic for a given seed and job order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from scheduler.policy.running import end_by_progress
from scheduler.simulator.trace import TraceJob

ESTIMATE_MODELS = ("predicted", "perfect", "user", "none")
DEFAULT_PREDICTION_ERROR = 0.3
# Of an attempt's run before its progress tells its end, and that measurement's error (above).
WARMUP_S = 600.0
MEASUREMENT_ERROR = 0.05
LIMIT_SHARE = 1 / 7  # of jobs asking for the queue's maximum run time

_MINUTE, _HOUR, _DAY = 60, 3600, 86400
# Round requests users type, from the studies above: minutes, hours, then whole days.
ROUND_VALUES: tuple[int, ...] = (
    1 * _MINUTE,
    5 * _MINUTE,
    10 * _MINUTE,
    15 * _MINUTE,
    20 * _MINUTE,
    30 * _MINUTE,
    45 * _MINUTE,
    1 * _HOUR,
    90 * _MINUTE,
    2 * _HOUR,
    3 * _HOUR,
    4 * _HOUR,
    5 * _HOUR,
    6 * _HOUR,
    8 * _HOUR,
    10 * _HOUR,
    12 * _HOUR,
    16 * _HOUR,
    18 * _HOUR,
    24 * _HOUR,
    36 * _HOUR,
    48 * _HOUR,
    72 * _HOUR,
    4 * _DAY,
    5 * _DAY,
    7 * _DAY,
    10 * _DAY,
    14 * _DAY,
    21 * _DAY,
    28 * _DAY,
)


def default_limit(jobs: Sequence[TraceJob]) -> float:
    longest = max((j.duration_s for j in jobs), default=0.0)
    return max(1.0, math.ceil(longest / _DAY)) * _DAY


def _round_request(seconds: float, limit: float) -> float:
    for value in ROUND_VALUES:
        if value >= seconds:
            return min(float(value), limit)
    # Past four weeks users ask in whole weeks.
    return min(math.ceil(seconds / (7 * _DAY)) * 7.0 * _DAY, limit)


def estimates(
    jobs: Sequence[TraceJob],
    model: str,
    *,
    seed: int,
    limit_s: float,
    prediction_error: float = DEFAULT_PREDICTION_ERROR,
) -> list[float]:
    """The run time the policy is told for every job, in order."""
    if model not in ESTIMATE_MODELS:
        raise ValueError(f"unknown estimate model {model!r}; one of {', '.join(ESTIMATE_MODELS)}")
    if model == "perfect":
        return [j.duration_s for j in jobs]
    if model == "none":
        return [max(limit_s, j.duration_s) for j in jobs]
    # Each model draws from its own stream, so changing one never changes another's numbers.
    rng = random.Random(f"{seed}:{model}")
    if model == "predicted":
        return [min(j.duration_s * math.exp(rng.gauss(0.0, prediction_error)), limit_s) for j in jobs]
    requested: list[float] = []
    for j in jobs:
        if j.requested_s is not None:
            requested.append(max(min(j.requested_s, limit_s), min(j.duration_s, limit_s)))
            continue
        if rng.random() < LIMIT_SHARE:
            requested.append(limit_s)
            continue
        accuracy = 1.0 - rng.random()  # in (0, 1]
        requested.append(max(_round_request(j.duration_s / accuracy, limit_s), min(j.duration_s, limit_s)))
    return requested


def measured_end(job_id: str, attempt: int, started_at: float, true_end: float, now: float) -> float:
    """When an attempt running since ``started_at`` (ending at ``true_end``) ends as its measured
    progress tells at ``now``; NaN before its warm-up is over. Its time past the warm-up is its steps,
    timed with the attempt's measurement error, and `end_by_progress` extrapolates them as it does
    an agent's report. Deterministic: the error is drawn from the job and attempt alone, so asking
    never moves any other draw of the replay."""
    stepped = now - started_at - WARMUP_S
    steps = true_end - started_at - WARMUP_S
    if stepped <= 0 or steps <= stepped:
        return math.nan
    error = math.exp(random.Random(f"measured:{job_id}:{attempt}").gauss(0.0, MEASUREMENT_ERROR))
    return end_by_progress(now, done=stepped, total=steps, measured_s=stepped * error)
