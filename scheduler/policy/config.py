"""Named scheduling policies: how a pass orders the queue, whether it backfills, how it sees the fleet.

- ``default``: fair share (decayed usage with weights) inside priority classes, EASY backfill on
  predicted run times, topology-aware placement through the Virtual-IPU allocator's ``default``
  (demand-aware) policy.
- ``fifo-firstfit``: what V-IPU under a plain FIFO queue gives: strict submission order (a job that
  cannot start blocks every later one) and the allocator's ``first-fit`` placement.
- ``slurm-backfill``: Slurm's ``sched/backfill`` with a count-only IPU resource: FIFO, EASY backfill
  on user-requested time limits, and a planner that believes any N free IPUs make a partition of N.
  The partition itself is then created by V-IPU (``first-fit``); when the IPUs the count promised are
  not a valid partition, the launch fails and the job goes back to the queue.

The other names are ablations of ``default`` for the simulator's report: each turns one of its
ingredients off, so the figures say what each is worth. ``type-blind`` is ``default`` without
heterogeneity-aware placement: a job that may run on several machine types takes the first type with
room for it (``scheduler.policy.machine_choice``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from scheduler.policy.fairshare import DEFAULT_HALF_LIFE_S


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    ordering: Literal["fair", "fifo"]
    backfill: bool
    planner: Literal["topology", "count"]  # how the policy sees free space
    placement: str  # the Virtual-IPU allocator policy placements go through
    estimates: str | None = None  # forces an estimate model in the simulator (Slurm: "user")
    preemption: bool = False
    half_life_s: float = DEFAULT_HALF_LIFE_S
    # Waiting this long is worth halving the tenant's fair-share standing (see ordering); None: no aging.
    aging_s: float | None = 3 * 24 * 3600.0
    # Jobs a pass considers behind the first blocked one (Slurm's bf_max_job_test, default 500).
    max_backfill_tests: int = 500
    # Where a job that may run on several machine types goes: where it finishes first, or (the
    # type-blind baseline) the first type with room (scheduler.policy.machine_choice).
    machine_choice: Literal["finish", "first-fit"] = "finish"
    description: str = ""

    def with_options(self, **changes: object) -> PolicyConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


POLICIES: dict[str, PolicyConfig] = {
    p.name: p
    for p in (
        PolicyConfig(
            "default",
            ordering="fair",
            backfill=True,
            planner="topology",
            placement="default",
            description="fair share, EASY backfill on predicted run times, topology-aware placement",
        ),
        PolicyConfig(
            "fifo-firstfit",
            ordering="fifo",
            backfill=False,
            planner="topology",
            placement="first-fit",
            description="V-IPU under plain FIFO: strict submission order, first-fit placement",
        ),
        PolicyConfig(
            "slurm-backfill",
            ordering="fifo",
            backfill=True,
            planner="count",
            placement="first-fit",
            estimates="user",
            description="Slurm sched/backfill: FIFO, EASY backfill on user time limits, count-only IPUs",
        ),
        PolicyConfig(
            "fifo-backfill",
            ordering="fifo",
            backfill=True,
            planner="topology",
            placement="default",
            description="ablation: default without fair share (FIFO order)",
        ),
        PolicyConfig(
            "fair-nobackfill",
            ordering="fair",
            backfill=False,
            planner="topology",
            placement="default",
            description="ablation: default without backfill (fair share, strict order)",
        ),
        PolicyConfig(
            "type-blind",
            ordering="fair",
            backfill=True,
            planner="topology",
            placement="default",
            machine_choice="first-fit",
            description="baseline: default, but a job that may run on any type takes the first with room",
        ),
        PolicyConfig(
            "default-firstfit",
            ordering="fair",
            backfill=True,
            planner="topology",
            placement="first-fit",
            description="ablation: default with V-IPU's first-fit placement",
        ),
    )
}

BASELINES = ("default", "fifo-firstfit", "slurm-backfill")


def get_policy(name: str) -> PolicyConfig:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scheduling policy {name!r}; available: {', '.join(POLICIES)}") from None
