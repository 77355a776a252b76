"""The autoscaler: how many replicas an endpoint wants, from its last minute of traffic (a pure
function of its scaling terms, its memory and the window)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime

from scheduler.clock import UNSCALED, Clock
from scheduler.models import Endpoint
from scheduler.services.endpoints.plans import ServeFigures
from scheduler.services.endpoints.routes import WindowLike


@dataclass(frozen=True)
class ScalePolicy:
    """An endpoint's scaling terms: replica bounds, the target and delays in cluster seconds, the clock
    turning them into wall seconds, and a replica's throughput at its largest batch (requests/s on the
    wall clock) when the serve plan gives one."""

    replicas_min: int
    replicas_max: int
    target_queue_delay_ms: float
    scale_up_delay_s: float
    scale_down_delay_s: float
    scale_to_zero_after_s: float | None
    clock: Clock = UNSCALED
    capacity_rps: float | None = None
    load_s: float | None = None
    """Wall seconds a replica added now takes to load before it serves (the plan's warm load), when
    the serve plan gives it."""


@dataclass(frozen=True)
class ScaleState:
    """The autoscaler's memory between passes (wall clock)."""

    desired: int
    above_since: datetime | None = None
    below_since: datetime | None = None
    idle_since: datetime | None = None


# Scale down only while the rest would run below this share of their capacity, so a replica removed
# is not added back a moment later.
DOWN_UTILISATION = 0.7

CLEAR_S = 10.0
"""Wall seconds within which a step's replicas are to clear the backlog there will be once they serve."""

LOAD_S = 10.0
"""Wall seconds a replica added now is taken to load when the plan cannot say (the emulator's warm load)."""


def decide_scale(
    policy: ScalePolicy, state: ScaleState, window: WindowLike | None, serving: int, now: datetime
) -> tuple[ScaleState, str | None]:
    """How many replicas an endpoint wants now, and why it changed (None: unchanged).

    Up when the recent queue delay (`WindowLike.recent_queue_delay_ms`: the last seconds' answers,
    not the minute's mean, which stays above target long after a backlog is gone) stays above target
    for `scale_up_delay_s` while every wanted replica serves: replicas ordered but still compiling or
    loading are capacity on its way, so no second step is taken for the backlog they are to clear.
    With the plan's throughput at the configured batch (`capacity_rps`) the step is sized at once
    (`_grown`): the replicas the arriving requests need plus those that clear, within `CLEAR_S`, the
    backlog there will be once the new ones serve; without it, by the ratio of delay to target, at
    most doubling (likewise when no arrivals are counted). Never past `replicas_max` (which create and
    change keep within the plan's limits).
    Down by one after the minute's queue delay stays under half the target and the load would fit in
    one replica fewer for `scale_down_delay_s`. To zero after `scale_to_zero_after_s` with no request
    (only with replicas.min 0). From zero at once when a request waits. No window (the data plane
    cannot say): as it is."""
    lo, hi = policy.replicas_min, policy.replicas_max
    desired = min(max(state.desired, lo), hi)
    why: str | None = None if desired == state.desired else f"within replicas {lo}..{hi}"
    if window is None:
        return replace(state, desired=desired), why

    def waited(since: datetime | None, cluster_s: float) -> bool:
        return since is not None and policy.clock.cluster_since(since, now) >= cluster_s

    busy = window.requests > 0 or window.queued > 0
    idle_since = None if busy else (state.idle_since or now)
    above, below = state.above_since, state.below_since
    if desired == 0:
        if busy:
            up = max(1, lo)
            return ScaleState(up, None, None, None), f"a request waits: starting {up} (cold start)"
        return ScaleState(0, None, None, idle_since), why
    target = policy.target_queue_delay_ms
    delay = recent_delay_ms(window)
    if busy and delay > target:
        above = above or now
        below = None
        if waited(above, policy.scale_up_delay_s) and serving >= desired and desired < hi:
            grown, reason = _grown(policy, desired, window, serving, delay)
            if grown > desired:
                return ScaleState(grown, now, None, idle_since), reason
        return ScaleState(desired, above, below, idle_since), why
    above = None
    if (
        lo == 0
        and policy.scale_to_zero_after_s is not None
        and waited(idle_since, policy.scale_to_zero_after_s)
    ):
        return ScaleState(0, None, None, idle_since), (
            f"no request for {policy.scale_to_zero_after_s:g} s: scaled to zero"
        )
    fits = policy.capacity_rps is None or window.rps <= DOWN_UTILISATION * policy.capacity_rps * (desired - 1)
    if desired > max(lo, 1) and window.queue_delay_ms <= target / 2 and fits:
        below = below or now
        if waited(below, policy.scale_down_delay_s):
            why = (
                f"load fits in {desired - 1} replicas for {policy.scale_down_delay_s:g} s: "
                f"{desired} -> {desired - 1}"
            )
            return ScaleState(desired - 1, None, now, idle_since), why
    else:
        below = None
    return ScaleState(desired, above, below, idle_since), why


def recent_delay_ms(window: WindowLike) -> float:
    """The queue delay the autoscaler goes by: the recent seconds' answers' mean, or, when none was
    answered in them, the minute's (a window without the recent figure reads as the minute's)."""
    recent = getattr(window, "recent_queue_delay_ms", None)
    return window.queue_delay_ms if recent is None else float(recent)


def _grown(
    policy: ScalePolicy, desired: int, window: WindowLike, serving: int, delay_ms: float
) -> tuple[int, str]:
    """How many replicas to scale up to from `desired` (see `decide_scale`), and why; `desired` when
    the plan's figures say what is wanted already carries the load and its backlog."""
    target = policy.target_queue_delay_ms
    why = f"queue delay {delay_ms:.1f} ms above the target {target:g} ms for {policy.scale_up_delay_s:g} s"
    capacity = policy.capacity_rps
    if not capacity or capacity <= 0 or window.arrival_rps <= 0:
        # No plan figures, or no arrivals counted (a data plane that does not count them): the delay.
        by_delay = max(desired + 1, math.ceil(desired * delay_ms / target))
        grown = min(policy.replicas_max, 2 * desired, by_delay)
        return grown, f"{why}: {desired} -> {grown} replicas"
    arriving = window.arrival_rps
    carry = replicas_needed(arriving, capacity)
    # Until the replicas ordered now serve, the ready ones fall behind by what they do not keep up
    # with: that backlog too is theirs to clear, so the rule need not fire again once they serve.
    load_s = LOAD_S if policy.load_s is None else policy.load_s
    backlog = window.queued + max(0.0, arriving - serving * capacity) * load_s
    clear = math.ceil(backlog / (capacity * CLEAR_S) - 1e-6) if backlog > 0 else 0
    need = carry + clear
    grown = min(policy.replicas_max, max(desired, need))
    why += (
        f", {arriving:.0f} requests/s arriving need {carry} replicas of {capacity:.0f}/s and a backlog of "
        f"{backlog:.0f} (queued {window.queued}, {serving} serving) {clear} more to clear it within "
        f"{CLEAR_S:g} s: {desired} -> {grown} replicas"
    )
    return grown, why


def replicas_needed(arrival_rps: float, capacity_rps: float | None) -> int:
    """Replicas that serve `arrival_rps` at `capacity_rps` each (0: the figures cannot say)."""
    if not capacity_rps or capacity_rps <= 0 or arrival_rps <= 0:
        return 0
    # A hair over a whole number of replicas is that number (a measured rate wobbles).
    return max(1, math.ceil(arrival_rps / capacity_rps - 1e-6))


def _throughput_at(figures: ServeFigures, batch: int) -> float | None:
    """A replica's planned throughput (cluster requests/s) at the largest planned batch up to `batch`."""
    rows = [r for r in figures["batches"] if int(r["batch_size"]) <= batch] or list(figures["batches"][:1])
    return float(rows[-1]["throughput"]) if rows else None


def policy_of(ep: Endpoint, clock: Clock) -> ScalePolicy:
    a = ep.autoscaling
    capacity = None
    batch = int(ep.batching["max_batch_size"])
    # At the configured batch, on the slowest machine type the replicas may be placed on. The plan's
    # figures are cluster requests/s; a wall second holds `to_cluster(1.0)` cluster seconds.
    each = [t for t in (_throughput_at(f, batch) for f in ep.serve.values()) if t is not None]
    if each:
        capacity = min(each) * clock.to_cluster(1.0)
    # The slowest machine type's warm load, in wall seconds.
    loads = [float(f["load_s"]) for f in ep.serve.values() if f.get("load_s") is not None]
    load_s = max(loads) / clock.to_cluster(1.0) if loads else None
    zero = a.get("scale_to_zero_after_s")
    return ScalePolicy(
        replicas_min=ep.replicas_min,
        replicas_max=ep.replicas_max,
        target_queue_delay_ms=float(a["target_queue_delay_ms"]),
        scale_up_delay_s=float(a["scale_up_delay_s"]),
        scale_down_delay_s=float(a["scale_down_delay_s"]),
        scale_to_zero_after_s=None if zero is None else float(zero),
        clock=clock,
        capacity_rps=capacity,
        load_s=load_s,
    )
