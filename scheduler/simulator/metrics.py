"""The report of one replay: completion times, queueing delay, utilisation, fragmentation, fairness.

- Job completion time (JCT): completion minus submission. Queueing delay (wait): start minus
  submission (the last start, for a job that was preempted).
- Makespan: last completion minus first submission. Utilisation: IPU-seconds run over the fleet's
  IPU-seconds during the makespan.
- Fragmentation: while some job is first in line and cannot start, the share of free IPUs that no
  partition of its size could include (``Allocator.fragmentation``), averaged over that time.
- Refused while free: the share of that time during which enough IPUs were free in total for the
  first job in line, which still could not start: capacity lost to the shape of free space.
- Fairness: Jain's index (1 is perfectly even) over tenants of their slowdown, the sum of their
  jobs' completion times over the sum of their run times: how much longer the tenant's work took
  than it ran. ``fairness_jobs`` is the same index over each tenant's mean per-job bounded slowdown,
  ``max(1, JCT / max(run time, 10 s))``; it weighs a ten-second job that waited an hour like a
  360-hour delay, so a tenant with three tiny jobs can decide it (see docs/scheduling.md).
  ``worst_tenant_slowdown`` is the largest per-tenant slowdown: how the worst-off tenant fared.
- With preemptible work (docs/checkpoints.md): ``preemptible`` gives how many jobs were, the average
  JCT of those and of the others, and the run time each preemption cost its victim
  (``lost_per_preemption_s``: mean, p50, max; work redone after it resumed from its checkpoint).
- On a fleet of several machine types, ``by_machine_type`` counts the jobs each type ran and their
  average JCT there, and utilisation counts the IPU-seconds jobs actually ran (longer on a slower type).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from scheduler.simulator.engine import SimResult

SLOWDOWN_BOUND_S = 10.0


def percentile(sorted_values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(share * len(sorted_values)))
    return sorted_values[rank - 1]


def jain(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def bounded_slowdown(jct_s: float, duration_s: float) -> float:
    return max(1.0, jct_s / max(duration_s, SLOWDOWN_BOUND_S))


def summarize(result: SimResult) -> dict[str, Any]:
    """Figures of one replay, JSON-ready. The fields the contract names come first."""
    jobs, outcomes = result.jobs, result.outcomes
    jct = sorted(o.end_s - j.submit_s for j, o in zip(jobs, outcomes, strict=True))
    wait = sorted(o.start_s - j.submit_s for j, o in zip(jobs, outcomes, strict=True))
    n = len(jobs)
    makespan = max((o.end_s for o in outcomes), default=0.0) - min((j.submit_s for j in jobs), default=0.0)
    work = result.extra.get("work_ipu_s", sum(j.size * j.duration_s for j in jobs))
    slowdowns: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {}
    for j, o in zip(jobs, outcomes, strict=True):
        slowdowns.setdefault(j.tenant, []).append(bounded_slowdown(o.end_s - j.submit_s, j.duration_s))
        total = totals.setdefault(j.tenant, [0.0, 0.0])
        total[0] += o.end_s - j.submit_s
        total[1] += max(j.duration_s, SLOWDOWN_BOUND_S)
    per_tenant = {t: jct_sum / run_sum for t, (jct_sum, run_sum) in totals.items()}
    per_tenant_jobs = {t: sum(v) / len(v) for t, v in slowdowns.items()}
    waiting = result.waiting_s
    by_type: dict[str, list[float]] = {}
    for j, o in zip(jobs, outcomes, strict=True):
        if o.machine_type:
            by_type.setdefault(o.machine_type, []).append(o.end_s - j.submit_s)
    return {
        "avg_jct_s": _r(sum(jct) / n if n else math.nan),
        "p50_jct_s": _r(percentile(jct, 0.50)),
        "p99_jct_s": _r(percentile(jct, 0.99)),
        "avg_wait_s": _r(sum(wait) / n if n else math.nan),
        "p50_wait_s": _r(percentile(wait, 0.50)),
        "p99_wait_s": _r(percentile(wait, 0.99)),
        "utilization": _r(work / (result.capacity_ipus * makespan) if makespan > 0 else 0.0, 4),
        "fragmentation": _r(result.stranded_ipu_s / waiting if waiting > 0 else 0.0, 4),
        "fairness": _r(jain(list(per_tenant.values())), 4),
        "fairness_jobs": _r(jain(list(per_tenant_jobs.values())), 4),
        "worst_tenant_slowdown": _r(max(per_tenant.values(), default=math.nan), 3),
        "refused_while_free": _r(result.refused_with_room_s / waiting if waiting > 0 else 0.0, 4),
        "makespan_s": _r(makespan),
        "avg_slowdown": _r(sum(sum(v) for v in slowdowns.values()) / n if n else math.nan, 3),
        "jobs": n,
        "estimates": result.estimates,
        "passes": result.passes,
        "backfilled": result.backfilled,
        "launch_failures": result.launch_failures,
        "preemptions": result.preemptions,
        # Per hour of the jobs' own run time (the trace's durations): how often work is stopped.
        "preemptions_per_job_hour": _r(
            result.preemptions / max(1e-9, sum(j.duration_s for j in result.jobs) / 3600.0), 5
        ),
        "replay_wall_s": _r(result.wall_s, 2),
        "decision_hash": decision_hash(result),
        **({"estimate_error": errors} if (errors := estimate_error(result)) else {}),
        "tenant_slowdown": {t: _r(v, 3) for t, v in sorted(per_tenant.items())},
        "tenant_job_slowdown": {t: _r(v, 3) for t, v in sorted(per_tenant_jobs.items())},
        **_preemptible(result),
        **(
            {
                "by_machine_type": {
                    kind: {"jobs": len(v), "avg_jct_s": _r(sum(v) / len(v))}
                    for kind, v in sorted(by_type.items())
                }
            }
            if by_type
            else {}
        ),
    }


def _preemptible(result: SimResult) -> dict[str, Any]:
    flags = result.preemptible
    if not any(flags):
        return {}
    mine = [o.end_s - j.submit_s for j, o, f in zip(result.jobs, result.outcomes, flags, strict=True) if f]
    rest = [
        o.end_s - j.submit_s for j, o, f in zip(result.jobs, result.outcomes, flags, strict=True) if not f
    ]
    losses = sorted(result.preemption_losses)
    return {
        "preemptible": {
            "jobs": len(mine),
            "avg_jct_s": _r(sum(mine) / len(mine)),
            "avg_jct_other_s": _r(sum(rest) / len(rest) if rest else math.nan),
            "preempted_jobs": sum(
                1 for o, f in zip(result.outcomes, flags, strict=True) if f and o.preempted
            ),
            "lost_per_preemption_s": {
                "mean": _r(sum(losses) / len(losses) if losses else 0.0, 2),
                "p50": _r(percentile(losses, 0.5) if losses else 0.0, 2),
                "max": _r(losses[-1] if losses else 0.0, 2),
            },
        }
    }


def decision_hash(result: SimResult) -> str:
    """A digest of what the policy did to every job: its first start, last start, end and how often
    it was preempted. Two replays of the same jobs with the same digest made the same decisions, so
    a change meant to be only faster (or only to the wait estimate, which decides nothing) is
    checked by it (docs/scheduling.md)."""
    digest = hashlib.sha256()
    for job, o in zip(result.jobs, result.outcomes, strict=True):
        digest.update(f"{job.id}:{o.first_start_s!r}:{o.start_s!r}:{o.end_s!r}:{o.preempted};".encode())
    return digest.hexdigest()[:16]


IMMEDIATE_S = 1.0  # a job that started within this of its submission started at once
PROMPT_S = 60.0  # an estimate under this says "at once" to a user


def estimate_error(result: SimResult) -> dict[str, Any]:
    """How the wait estimate made at submission (``JobOutcome.estimated_start_s``) compares with the
    start that happened, over the jobs that got one.

    For jobs that waited (actual wait > ``IMMEDIATE_S``): the median absolute error as a share of
    the actual wait, and the share of them estimated within 25% of it. For jobs that started at once:
    the share estimated to wait under ``PROMPT_S``. A job the forecast gave no start (inf) counts as
    an error of 100% or more. Empty when nothing was estimated.

    With preemptible work among the waited jobs, the median is also given for each side: a
    preemptible job waits for non-preemptible work submitted after it too, which no forecast made
    at its submission can know (docs/scheduling.md, "Gaia's estimate")."""
    waited: list[float] = []
    sides: dict[bool, list[float]] = {True: [], False: []}
    flags = result.preemptible
    absolute: list[float] = []
    immediate = prompt = missing = 0
    for index, (job, o) in enumerate(zip(result.jobs, result.outcomes, strict=True)):
        if math.isnan(o.estimated_start_s):
            continue
        if math.isinf(o.estimated_start_s):
            missing += 1
        # The estimate foretells when the job starts, so it is held against its first start (a job
        # preempted later started again after it).
        first = o.start_s if math.isnan(o.first_start_s) else o.first_start_s
        wait = first - job.submit_s
        guess = o.estimated_start_s - job.submit_s
        absolute.append(abs(guess - wait))
        if wait <= IMMEDIATE_S:
            immediate += 1
            prompt += guess < PROMPT_S
        else:
            waited.append(abs(guess - wait) / wait)
            sides[bool(flags) and flags[index]].append(waited[-1])
    if not absolute:
        return {}
    waited.sort()
    absolute.sort()
    split: dict[str, Any] = {}
    if sides[True]:
        for preemptible, name in ((True, "preemptible"), (False, "not_preemptible")):
            errors = sorted(sides[preemptible])
            split[f"waited_jobs_{name}"] = len(errors)
            split[f"median_abs_error_share_{name}"] = _r(percentile(errors, 0.5), 4)
    return {
        "estimated_jobs": len(absolute),
        "no_forecast": missing,
        "median_abs_error_s": _r(percentile(absolute, 0.5)),
        "waited_jobs": len(waited),
        "median_abs_error_share": _r(percentile(waited, 0.5), 4),
        "within_25pct": _r(sum(1 for e in waited if e <= 0.25) / len(waited), 4) if waited else math.nan,
        "immediate_jobs": immediate,
        "immediate_under_60s": _r(prompt / immediate, 4) if immediate else math.nan,
        **split,
    }


def _r(value: float, digits: int = 1) -> float:
    return round(value, digits) if math.isfinite(value) else value
