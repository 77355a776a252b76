"""Machine types as a tenant meets them: which a plan allows, what an IPU-hour of each costs, and
what a job that may run on several would need on each.

A grant is spent at rate x IPU-hours: the rate of the machine type a job ran on, as the tenant's
plan sets it (`plans.rates`), else the registry's default (`vipu.machine_types`). A job's rates are
fixed when it is admitted (its quota reservation was made with them) and its attempt keeps the rate
of the type it was placed on, so a plan edited later changes only what is admitted later.

What a piece of work may run on and at what rate is worked out once, by `offers`: a job's admission,
a session, an endpoint's replicas and an estimate all ask it, so what an estimate shows is what
admission reserves and what metering charges. What a rate costs is `scheduler/billing.py`'s
arithmetic; placement calls `bind_machine`, which settles an `any` job on the type it was placed on,
and `attempt_fields`, what the attempt row records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy.orm import Session

from scheduler.errors import LimitExceeded
from scheduler.models import Plan
from scheduler.services.capacity import fleet
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


@dataclass(frozen=True)
class Offers:
    """What a plan offers one piece of work: the machine types it may run on, in the order they are
    tried, and the grant units an IPU-hour costs on each type.

    `rates` covers every type of the registry (an estimate may name a type the plan does not offer,
    to see its figures); `kinds` only the ones the work may be admitted on."""

    plan: str | None  # the plan's name; None: no tenant's, the registry's terms
    allowed: tuple[str, ...]  # the types the plan allows, in registry order
    kinds: tuple[str, ...]  # the types this work may run on
    rates: Mapping[str, float]
    max_partition_size: int | None

    def check_size(self, kind: str | None, size: int, needs: str) -> None:
        """Refuse a partition over the plan's largest; `needs` says whose ("this job needs"), `kind`
        on which type (None: on any)."""
        if self.max_partition_size is not None and size > self.max_partition_size:
            raise LimitExceeded(
                f"The {self.plan} plan allows partitions of at most {self.max_partition_size} IPUs; "
                f"{needs} {size}" + (f" on {kind}." if kind is not None and len(self.kinds) > 1 else "."),
                limit="max_partition_size",
            )

    def option(self, kind: str, ipus: int, predicted_runtime_s: float) -> dict[str, float]:
        """One type's entry of a job's `options`: what it would hold, for how long, at what rate
        (the figures admission reserves and metering bills)."""
        return {"ipus": ipus, "predicted_runtime_s": predicted_runtime_s, "rate": self.rates[kind]}


def offers(
    *,
    plan: Any | None,
    machine: str | None = None,
    present: Mapping[str, int] | None = None,
    preemptible: bool = False,
    billed: bool = True,
    pinned: str | None = None,
    what: str = "jobs",
) -> Offers:
    """What `plan` (a `Plan` row; None: the registry's terms) offers a piece of work that asks for
    `machine` (a type, "any" or None).

    A named type the plan does not allow is refused here. On `any`, the work may run on every type
    the plan allows that `present` (the fleet's `largest_by_type`; None: not looked at) has, or on
    every allowed type when the fleet has none of them (admission then says why each cannot).
    `preemptible` work pays the plan's discounted rate; work that is not `billed` itself (a job in a
    session: the session pays for holding its partition) pays nothing. `pinned` is a type the work
    runs on whatever the plan allows (a partition an admin reserved for the tenant)."""
    allowed = allowed_types(plan.machine_types if plan is not None else None)
    rates = plan_rates(plan.rates if plan is not None else None)
    if preemptible:
        discount = plan.preemptible_discount if plan is not None else None
        rates = {kind: preemptible_rate(rate, discount) for kind, rate in rates.items()}
    if not billed:
        rates = dict.fromkeys(rates, 0.0)
    named = pinned or (machine if machine not in (None, "any") else None)
    if named is not None and pinned is None and named not in allowed:
        raise LimitExceeded(
            f"The {plan.name if plan is not None else 'default'} plan runs {what} on "
            f"{', '.join(allowed)}, not {named}.",
            limit="machine_types",
        )
    if named is not None:
        kinds: tuple[str, ...] = (named,)
    else:
        kinds = tuple(k for k in allowed if present is None or present.get(k, 0) > 0) or allowed
    return Offers(
        plan=plan.name if plan is not None else None,
        allowed=allowed,
        kinds=kinds,
        rates=rates,
        max_partition_size=int(plan.max_partition_size) if plan is not None else None,
    )


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


def plan_offers(*, session: Session, plan_name: str, preemptible: bool = False) -> Offers:
    """What the plan offers work on `any` on this fleet, as admission would (the fleet's answer
    up to `fleet.PODS_CACHE_S` old, as admission takes it); an estimate's terms."""
    present = fleet.largest_by_type(session=session, max_age_s=fleet.PODS_CACHE_S)
    return offers(plan=session.get(Plan, plan_name), present=present, preemptible=preemptible)


def plan_terms(
    *, session: Session, plan_name: str, preemptible: bool = False
) -> tuple[dict[str, float], tuple[str, ...]]:
    """A plan's rate for every machine type and the types it allows; with `preemptible`, the rates of
    preemptible work (the plan's discount applied), as admission bills it."""
    terms = offers(plan=session.get(Plan, plan_name), preemptible=preemptible)
    return dict(terms.rates), terms.allowed
