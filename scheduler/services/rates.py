"""Machine types as a tenant meets them: which a plan allows, what an IPU-hour of each costs, and
what a job that may run on several would need on each.

A grant is spent at rate x IPU-hours: the rate of the machine type a job ran on, as the tenant's
plan sets it (`plans.rates`), else the registry's default (`vipu.machine_types`). A job's rates are
fixed when it is admitted (its quota reservation was made with them) and its attempt keeps the rate
of the type it was placed on, so a plan edited later changes only what is admitted later.

What a rate costs is `scheduler/billing.py`'s arithmetic; placement calls `bind_machine`, which settles an
`any` job on the type it was placed on, and `attempt_fields`, what the attempt row records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict

from vipu.machine_types import MACHINE_TYPE_NAMES, default_rates

MAX_RATE = 1000.0


def plan_rates(rates: Mapping[str, float] | None) -> dict[str, float]:
    """Grant units per IPU-hour of every type under a plan whose own rates are `rates`."""
    out = default_rates()
    for kind, rate in (rates or {}).items():
        if kind in out:
            out[kind] = float(rate)
    return out


def preemptible_rate(rate: float, discount: float | None) -> float:
    """The rate of preemptible work under a plan that gives it `discount` (0.5: half price)."""
    return rate * (1.0 - min(1.0, max(0.0, discount if discount is not None else 0.5)))


def allowed_types(machine_types: Sequence[str] | None) -> tuple[str, ...]:
    """The types a plan's tenants may use, in registry order (None: all of them)."""
    if not machine_types:
        return MACHINE_TYPE_NAMES
    return tuple(kind for kind in MACHINE_TYPE_NAMES if kind in machine_types)


def bind_machine(job: Any, machine_type: str) -> float:
    """Settle a job on the type it was placed on: its size and predicted run time become that type's
    (they are what the scheduler plans the rest of the fleet around). Returns the rate it is billed."""
    options = job.options or {}
    option = options.get(machine_type)
    if option is None:
        return 1.0  # a job admitted before machine types had rates
    if len(options) > 1:
        # Until now it was shown as its fastest option; a job with one option is that option.
        job.ipus = int(option["ipus"])
        job.predicted_runtime_s = float(option["predicted_runtime_s"])
    return float(option["rate"])


class AttemptFields(TypedDict):
    """What an attempt row records of its placement: the type's rate and the first wait (wall s)."""

    rate: float
    queue_wait_s: float | None


def attempt_fields(job: Any, machine_type: str, now: datetime) -> AttemptFields:
    """The attempt row's rate and, for a job's first placement, how long it waited (wall seconds)."""
    rate = bind_machine(job, machine_type)
    waited = (now - job.created_at).total_seconds() if job.attempts == 1 else None
    return {"rate": rate, "queue_wait_s": waited}


def plan_terms(
    *, session: Any, plan_name: str, preemptible: bool = False
) -> tuple[dict[str, float], tuple[str, ...]]:
    """A plan's rate for every machine type and the types it allows; with `preemptible`, the rates of
    preemptible work (the plan's discount applied), as admission bills it."""
    from scheduler.models import Plan

    plan = session.get(Plan, plan_name)
    if plan is None:
        return plan_rates(None), allowed_types(None)
    rates = plan_rates(plan.rates)
    if preemptible:
        rates = {kind: preemptible_rate(rate, plan.preemptible_discount) for kind, rate in rates.items()}
    return rates, allowed_types(plan.machine_types)
