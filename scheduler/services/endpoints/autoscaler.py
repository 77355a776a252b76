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


def decide_scale(
    policy: ScalePolicy, state: ScaleState, window: WindowLike | None, serving: int, now: datetime
) -> tuple[ScaleState, str | None]:
    """How many replicas an endpoint wants now, and why it changed (None: unchanged).

    Up when the mean queue delay stays above target for `scale_up_delay_s` while every wanted replica
    serves (replicas still starting would only be doubled up): to as many as the requests arriving
    need at a replica's throughput at the configured batch (`capacity_rps`), at once (arrivals: the
    last seconds', or, when it says more, the serving replicas' throughput plus the backlog over the
    time the delay has been above target), or, when that
    says no more (a backlog to drain, no plan figures), by the ratio of delay to target, at most
    doubling; never past `replicas_max` (which create and change keep within the plan's limits).
    Down by one after the queue delay stays under half the target and the load would fit in
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
    if busy and window.queue_delay_ms > target:
        above = above or now
        below = None
        if waited(above, policy.scale_up_delay_s) and serving >= desired and desired < hi:
            grown, why = _grown(policy, desired, window, serving, max((now - above).total_seconds(), 1.0))
            return ScaleState(grown, now, None, idle_since), why
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


def _grown(
    policy: ScalePolicy, desired: int, window: WindowLike, serving: int, above_s: float
) -> tuple[int, str]:
    """How many replicas to scale up to from `desired` (see `decide_scale`), and why. ``above_s``: wall
    seconds since the queue delay rose above its target (at least the serve pass's second)."""
    target = policy.target_queue_delay_ms
    by_delay = min(2 * desired, max(desired + 1, math.ceil(desired * window.queue_delay_ms / target)))
    arriving, how = window.arrival_rps, "arriving"
    need = replicas_needed(arriving, policy.capacity_rps)
    if policy.capacity_rps and window.queued > 0:
        # Behind a backlog the serving replicas run flat out, and what they do not keep up with piles
        # up in the queue (a replica takes only what its device can start): arrivals are at least
        # their throughput plus the backlog over the time the delay has been above target. Read a
        # couple of seconds after a step, the last three seconds' arrivals still hold the old load
        # (the benchmark's 10 -> 500 requests/s asked for 3 replicas of 120/s, then waited for them).
        backed = serving * policy.capacity_rps + window.queued / above_s
        if replicas_needed(backed, policy.capacity_rps) > need:
            arriving, how = backed, f"arriving (a backlog of {window.queued} in {above_s:.0f} s)"
            need = replicas_needed(backed, policy.capacity_rps)
    grown = min(policy.replicas_max, max(by_delay, need))
    why = (
        f"queue delay {window.queue_delay_ms:.1f} ms above the target {target:g} ms for "
        f"{policy.scale_up_delay_s:g} s"
    )
    if need > by_delay:
        why += f", {arriving:.0f} requests/s {how} need {need} replicas of {policy.capacity_rps:.0f}/s"
    why += f": {desired} -> {grown} replicas"
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
    )
