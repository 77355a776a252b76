"""The scheduler leader's serve pass (fenced like sessions.sweep): it reads each live endpoint's last
minute of traffic (`inference.windows`), decides how many replicas it wants (`decide_scale`), creates
or drains holder jobs to get there, replaces replicas that failed, stops an endpoint whose tenant's
grant is spent (reason `quota`), sets its state and reason, and rolls each minute up into
`endpoint_stats`.

Locks are taken in the order endpoints, jobs, attempts, tenants."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.clock import Clock
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ENDPOINT_STATES,
    PLATFORM_FAULT_STATES,
    Attempt,
    AttemptState,
    Endpoint,
    EndpointState,
    Job,
    JobState,
    Plan,
    Tenant,
)
from scheduler.services.endpoints.autoscaler import ScaleState, decide_scale, policy_of
from scheduler.services.endpoints.lifecycle import _event, _scaled, _stop
from scheduler.services.endpoints.replicas import (
    Replica,
    _add_replicas,
    _drain,
    _drain_order,
    _lock_tenant,
    _matches,
    replicas_of,
)
from scheduler.services.endpoints.routes import RouteFields, WindowLike
from scheduler.services.endpoints.stats import _roll_up

log = logging.getLogger("ipucloud.endpoints")


FAILURE_LIMIT = 3  # replicas that fail to start in a row before the endpoint is `failed`
QUOTA = "quota"


@dataclass
class ServeResult:
    created: int = 0
    drained: int = 0
    stopped: list[tuple[str, str]] = field(default_factory=list)
    routes: list[RouteFields] = field(default_factory=list)
    rolled_up: int = 0
    running: dict[str, list[int]] = field(default_factory=dict)
    """Per endpoint, its replicas' running attempts: the data plane fails over what any other holds."""


def live_endpoint_ids(*, session: Session) -> list[str]:
    return list(
        session.execute(
            select(Endpoint.id).where(Endpoint.state.in_(LIVE_ENDPOINT_STATES)).order_by(Endpoint.id)
        ).scalars()
    )


def serve_pass(
    *,
    session: Session,
    now: datetime,
    clock: Clock,
    windows: Mapping[str, WindowLike],
    refresh_routes: bool = False,
) -> ServeResult:
    """Scale, replace, stop and roll up every live endpoint (the scheduler leader's transaction).
    `windows` are the endpoints' last minute from the data plane (`read_windows`); `refresh_routes`
    returns every live endpoint's route to publish again, not only those that changed."""
    result = ServeResult()
    rows = _lock_live(session)
    if not rows:
        return result
    ids = [ep.id for ep in rows]
    live = replicas_of(session=session, endpoint_ids=ids, now=now)
    result.running = {
        eid: [r.attempt.id for r in reps if r.attempt is not None and r.attempt.state == AttemptState.RUNNING]
        for eid, reps in live.items()
    }
    oldest_check = min((ep.checked_at or ep.created_at) for ep in rows)
    ended = _ended_since(session, ids, oldest_check)
    faulted = _faulted_since(session, ids, oldest_check)
    grow: list[tuple[Endpoint, int]] = []
    became_ready: list[tuple[Endpoint, str]] = []
    for ep in rows:
        before = (ep.state, ep.reason)
        replicas = live[ep.id]
        gone, lost = _ends_since_check(ep, ended.get(ep.id, []), faulted.get(ep.id))
        if _stopped_by_ends(session, ep, replicas, gone, now, result):
            continue
        if lost:
            ep.degraded_since = ep.degraded_since or now
        missing = _reach_wanted(session, ep, replicas, windows.get(ep.id), clock, now, result)
        if missing:
            grow.append((ep, missing))
        if (ep.state, ep.reason) != before:
            ep.updated_at = now
        if ep.state == EndpointState.READY and before[0] != EndpointState.READY:
            became_ready.append((ep, str(before[0])))
        if ep.state != before[0] or refresh_routes:
            result.routes.append(RouteFields.of(ep))
    # Last, since it locks the tenants' rows: the replicas to add.
    if grow:
        _add_missing(session, grow, live, now, result)
    # After the additions: one that stopped there (its grant spent) did not become ready.
    for ep, was in became_ready:
        if ep.state == EndpointState.READY:
            _event(session, ep, "endpoint.ready", key=f"{was}:{now.isoformat()}", now=now, previous_state=was)
    result.rolled_up = _roll_up(session, rows, windows, live, now)
    return result


def _lock_live(session: Session) -> list[Endpoint]:
    """Every live endpoint, locked until commit (the first lock of the pass: endpoints, then jobs)."""
    return list(
        session.execute(
            select(Endpoint)
            .where(Endpoint.state.in_(LIVE_ENDPOINT_STATES))
            .order_by(Endpoint.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalars()
    )


def _ended_since(session: Session, endpoint_ids: Sequence[str], since: datetime) -> dict[str, list[Job]]:
    """Per endpoint, its replicas that ended by themselves (not drained) after `since`, oldest first."""
    ended: dict[str, list[Job]] = {}
    for job in session.execute(
        select(Job)
        .where(
            Job.endpoint_id.in_(list(endpoint_ids)),
            Job.state.in_(tuple(FINAL_JOB_STATES)),
            Job.finished_at > since,
            Job.cancel_requested.is_(False),
        )
        .order_by(Job.id)
    ).scalars():
        assert job.endpoint_id is not None
        ended.setdefault(job.endpoint_id, []).append(job)
    return ended


def _ends_since_check(
    ep: Endpoint, ended: Sequence[Job], fault_at: datetime | None
) -> tuple[list[Job], bool]:
    """The endpoint's replicas that ended by themselves since it was last looked at (`checked_at`), and
    whether it lost any since (those, or one a platform fault ended); moves `checked_at` past them."""
    checked = ep.checked_at or ep.created_at
    # Replicas that ended by themselves since the last pass: replaced, unless the grant is spent.
    gone = [j for j in ended if j.finished_at is not None and j.finished_at > checked]
    faulted = fault_at if fault_at is not None and fault_at > checked else None
    # The watermark is the latest end looked at (the clocks that wrote them), not this pass's now:
    # an end is looked at once, whichever process's clock stamped it.
    seen = [checked, *(j.finished_at for j in gone if j.finished_at is not None)]
    if faulted is not None:
        seen.append(faulted)
    ep.checked_at = max(seen)
    return gone, bool(gone) or faulted is not None


def _stopped_by_ends(
    session: Session,
    ep: Endpoint,
    replicas: Sequence[Replica],
    gone: Sequence[Job],
    now: datetime,
    result: ServeResult,
) -> bool:
    """Stop the endpoint if what ended says so: a replica that ended on the spent grant (`quota`), or
    `FAILURE_LIMIT` replicas that failed to start in a row (`failed`). True if it stopped."""
    quota = next((j for j in gone if j.state == JobState.FAILED and "grant" in (j.reason or "")), None)
    if quota is not None:
        _drain(session, [r.job for r in replicas], f"endpoint {ep.name} stopped: the grant is spent")
        _stop(ep, QUOTA, "the tenant's IPU-hour grant is spent", now)
        result.stopped.append((ep.id, QUOTA))
        result.routes.append(RouteFields.of(ep))
        return True
    failed = [j for j in gone if j.state == JobState.FAILED]
    if any(r.state == "ready" for r in replicas):
        ep.failures = 0
    ep.failures += len(failed)
    if failed and ep.failures >= FAILURE_LIMIT:
        _drain(session, [r.job for r in replicas], f"endpoint {ep.name} failed")
        ep.state = EndpointState.FAILED
        ep.reason = f"{ep.failures} replicas failed to start in a row; the last: {failed[-1].reason}"[:1000]
        ep.desired_replicas = 0
        ep.stopped_at = now
        ep.updated_at = now
        # Failed is final: one event per endpoint.
        _event(session, ep, "endpoint.failed", key="failed", now=now, reason=ep.reason)
        result.stopped.append((ep.id, "failed"))
        result.routes.append(RouteFields.of(ep))
        return True
    return False


def _reach_wanted(
    session: Session,
    ep: Endpoint,
    replicas: Sequence[Replica],
    window: WindowLike | None,
    clock: Clock,
    now: datetime,
    result: ServeResult,
) -> int:
    """Decide how many replicas the endpoint wants (the autoscaler), drain the extra and those of an
    older layout once the new ones serve, and set its state; returns how many replicas are missing (to
    be queued once the tenants' rows are locked)."""
    current = [r for r in replicas if _matches(r.job, ep) and r.state != "draining"]
    stale = [r for r in replicas if not _matches(r.job, ep) and r.state != "draining"]
    serving = sum(1 for r in replicas if r.state == "ready")
    state0 = ScaleState(ep.desired_replicas, ep.above_since, ep.below_since, ep.idle_since)
    scaled, why = decide_scale(policy_of(ep, clock), state0, window, serving, now)
    ep.desired_replicas = scaled.desired
    ep.above_since, ep.below_since, ep.idle_since = (
        scaled.above_since,
        scaled.below_since,
        scaled.idle_since,
    )
    if why is not None and scaled.desired != state0.desired:
        log.info("endpoint %s: %s", ep.id, why)
    _scaled(session, ep, state0.desired, why or "autoscaler", now)
    # Reach the wanted count: drain the extra (those not serving first), queue what is missing.
    extra = len(current) - scaled.desired
    if extra > 0:
        victims = sorted(current, key=_drain_order)[:extra]
        result.drained += len(_drain(session, [r.job for r in victims], f"endpoint {ep.name} scaled down"))
        current = [r for r in current if r not in victims]
    # Replicas of an older layout serve until as many of the new one do.
    ready_now = sum(1 for r in current if r.state == "ready")
    if stale and (ready_now >= scaled.desired):
        result.drained += len(_drain(session, [r.job for r in stale], f"endpoint {ep.name} changed"))
        stale = []
    ready = ready_now + sum(1 for r in stale if r.state == "ready")
    _set_state(ep, scaled.desired, ready, len(current) + len(stale), why)
    return max(0, -extra)


def _add_missing(
    session: Session,
    grow: Sequence[tuple[Endpoint, int]],
    live: Mapping[str, Sequence[Replica]],
    now: datetime,
    result: ServeResult,
) -> None:
    """Queue the replicas each endpoint misses, tenant by tenant (their rows locked, in order); stop an
    endpoint whose tenant's grant is spent (`quota`)."""
    plans = dict(
        session.execute(
            select(Tenant.id, Plan)
            .join(Plan, Plan.name == Tenant.plan_name)
            .where(Tenant.id.in_({ep.tenant_id for ep, _ in grow}))
        )
        .tuples()
        .all()
    )
    for ep, n in sorted(grow, key=lambda g: (g[0].tenant_id, g[0].id)):
        tenant = _lock_tenant(session, ep.tenant_id)
        made = _add_replicas(session, ep, plans[ep.tenant_id], tenant, n, now)
        result.created += made
        if made == 0 and billing.left_ipu_ms(tenant) <= 0:
            _drain(session, [r.job for r in live[ep.id]], f"endpoint {ep.name} stopped: the grant is spent")
            _stop(ep, QUOTA, "the tenant's IPU-hour grant is spent", now)
            result.stopped.append((ep.id, QUOTA))
            result.routes.append(RouteFields.of(ep))


def _faulted_since(session: Session, endpoint_ids: Sequence[str], since: datetime) -> dict[str, datetime]:
    """Per endpoint, the latest end after `since` of a replica's attempt that a platform fault ended (a
    lost agent, a failed machine, a preemption): its job is queued again, to be placed anew."""
    return {
        str(e): at
        for e, at in session.execute(
            select(Job.endpoint_id, func.max(Attempt.ended_at))
            .join(Attempt, Attempt.job_id == Job.id)
            .where(
                Job.endpoint_id.in_(list(endpoint_ids)),
                Attempt.state.in_(tuple(PLATFORM_FAULT_STATES)),
                Attempt.ended_at > since,
            )
            .group_by(Job.endpoint_id)
        ).tuples()
        if at is not None
    }


def _set_state(ep: Endpoint, desired: int, ready: int, held: int, why: str | None) -> None:
    """The endpoint's state and reason from its replicas (see EndpointState)."""
    if ready >= desired and ep.degraded_since is not None:
        ep.degraded_since = None
    if desired == 0 and held == 0:
        ep.state, ep.reason = EndpointState.SCALED_TO_ZERO, why or "idle: no replica held"
    elif desired == 0:
        ep.state, ep.reason = (
            EndpointState.SCALED_TO_ZERO,
            f"draining {held} replica{'s' if held != 1 else ''}",
        )
    elif ep.degraded_since is not None:
        ep.state = EndpointState.DEGRADED
        ep.reason = f"{ready} of {desired} replicas serving: replacing a replica that was lost or failed"
    elif ready == 0:
        ep.state = EndpointState.PROVISIONING
        ep.reason = f"starting {desired} replica{'s' if desired != 1 else ''} (queued, compiling or loading)"
    else:
        ep.state = EndpointState.READY
        ep.reason = (
            f"{ready} of {desired} replicas serving" + (f"; {why}" if why else "")
            if ready < desired
            else f"{ready} replica{'s' if ready != 1 else ''} serving" + (f"; {why}" if why else "")
        )
    ep.reason = ep.reason[:1000] if ep.reason else None
