"""Events no single transaction writes: thresholds of the grant, a trial's end, a job running long.

Usage grows in the agents' ticks and time passes, so `sweep` (the notifier's periodic pass) writes these
events, with ids naming the threshold and the grant (or the expiry), so each fires once and fires again
when an admin changes the grant.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypedDict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.clock import UNSCALED, Clock
from scheduler.models import Job, MeterEvent, Tenant
from scheduler.notify_models import Event, NotificationSetting
from scheduler.services.tenancy.notifications import HIDDEN_TASKS, emit, event_id, job_event

# Share of the grant at which `usage.threshold` fires, actual (used) and forecast (used + reserved),
# besides every share a member of the tenant chose for their mail.
USAGE_THRESHOLDS = (50, 80, 100)
# `trial.expiring` this long before a trial's end.
TRIAL_WARNINGS = (("7d", timedelta(days=7)), ("1d", timedelta(days=1)))


class SweepResult(TypedDict):
    usage: int
    trials: int
    runtime: int


# `job.runtime_warning` at these shares of a job's time limit (`max_runtime_s`).
RUNTIME_WARNINGS = (50, 80, 90)


def _runtime_warnings(session: Session, now: datetime) -> int:
    """Warn the owners of running jobs that have used 50, 80 or 90% of their time limit. The run
    time counts as the limit does: what earlier attempts ran since the owner last started or resumed
    the job, and this attempt's run after its restore (scheduler/services/batch/attempts/taking.py,
    take_many)."""
    from scheduler.models import Attempt, AttemptState

    rows = session.execute(
        select(Attempt, Job)
        .join(Job, Job.id == Attempt.job_id)
        .where(
            Attempt.state == AttemptState.RUNNING,
            Attempt.gcd >= 0,
            Job.max_runtime_s.is_not(None),
            Job.task.not_in(list(HIDDEN_TASKS)),
        )
    ).all()
    due: list[tuple[Job, int, float]] = []
    for attempt, job in rows:
        timeline = attempt.timeline or {}
        if attempt.started_at is None or not timeline or not job.max_runtime_s:
            continue
        ran = Clock(float(timeline["scale"])).cluster_since(
            attempt.started_at, now
        )  # the clock it was taken at
        before = max(0.0, float(timeline.get("run_base_s", 0.0)) - job.runtime_base_s)
        run_s = before + max(0.0, ran - attempt.unbilled_s)
        crossed = [pct for pct in RUNTIME_WARNINGS if 100 * run_s >= pct * job.max_runtime_s]
        if crossed:
            # Only the highest: a sweep that first sees 85% says 80%, not 50% and 80%.
            due.append((job, crossed[-1], run_s))
    keys = {event_id("job.runtime_warning", f"{job.id}:{job.attempts}:{pct}") for job, pct, _ in due}
    known: set[str] = set()
    for chunk in _chunks(sorted(keys), 500):
        known.update(session.execute(select(Event.id).where(Event.id.in_(chunk))).scalars())
    written = 0
    for job, pct, run_s in due:
        key = f"{job.id}:{job.attempts}:{pct}"
        if event_id("job.runtime_warning", key) in known:
            continue
        job_event(
            session,
            job,
            "job.runtime_warning",
            key=key,
            percent=pct,
            max_runtime_s=job.max_runtime_s,
            run_s=round(run_s, 3),
        )
        written += 1
    return written


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# The forecast's recent burn: the grant's charge over this much cluster time, as a rate.
BURN_WINDOW_CLUSTER_S = 86400.0


def forecast_ipu_ms(
    *,
    used_ipu_ms: int,
    reserved_ipu_ms: int,
    burn_ipu_ms: int,
    window_s: float,
    now: datetime,
    expires_at: datetime | None,
) -> int:
    """What the grant will have spent by its expiry: what is used, what queued and running work holds,
    and the recent burn (`burn_ipu_ms` charged over the last `window_s` wall seconds) carried on at the
    same rate until `expires_at`. A grant with no expiry, or one already past it, has no burn to come;
    a window of refunds burns nothing."""
    ahead_s = (expires_at - now).total_seconds() if expires_at is not None else 0.0
    burn = max(0, burn_ipu_ms) * max(0.0, ahead_s) / window_s if window_s > 0 else 0.0
    return used_ipu_ms + reserved_ipu_ms + int(burn)


def _recent_burn(session: Session, tenant_ids: list[str], since: datetime) -> dict[str, int]:
    """Each tenant's charge (rate x IPU-ms, refunds netted) metered since `since`."""
    found: dict[str, int] = {}
    for chunk in _chunks(tenant_ids, 500):
        rows = session.execute(
            select(MeterEvent.tenant_id, func.coalesce(func.sum(MeterEvent.ipu_ms), 0))
            .where(MeterEvent.tenant_id.in_(chunk), MeterEvent.at >= since)
            .group_by(MeterEvent.tenant_id)
        ).tuples()
        found.update((tenant_id, int(total)) for tenant_id, total in rows)
    return found


def sweep(*, session: Session, now: datetime, clock: Clock = UNSCALED) -> SweepResult:
    """Write the events no single transaction makes: jobs near their time limit, grant thresholds
    crossed and trials ending.
    Their ids name the threshold and the grant (or the expiry), so each is written once, and again
    after an admin changes the grant (or the expiry).

    A threshold's `forecast` counts used + reserved + the recent burn to the grant's expiry: the charge
    of the last 24 h of cluster time (`clock.scale` cluster seconds a wall second) extrapolated at that
    rate to `expires_at`."""
    result = SweepResult(usage=0, trials=0, runtime=_runtime_warnings(session, now))
    # Members choose their own thresholds (scheduler/services/tenancy/mail.py): the events are written
    # at every threshold one of a tenant's members chose, as well as the defaults.
    chosen: dict[str, set[int]] = {}
    for tenant_id, thresholds in session.execute(
        select(NotificationSetting.tenant_id, NotificationSetting.budget_thresholds)
    ).tuples():
        chosen.setdefault(tenant_id, set()).update(int(t) for t in thresholds)
    lowest = min([*USAGE_THRESHOLDS, *(t for ts in chosen.values() for t in ts)]) / 100
    window_s = clock.to_wall(BURN_WINDOW_CLUSTER_S)
    columns = (Tenant.id, Tenant.quota_ipu_ms, Tenant.used_ipu_ms, Tenant.reserved_ipu_ms, Tenant.expires_at)
    live = (Tenant.quota_ipu_ms > 0, Tenant.status == "active")
    crossed = list(
        session.execute(
            select(*columns).where(
                *live,
                Tenant.used_ipu_ms + Tenant.reserved_ipu_ms >= Tenant.quota_ipu_ms * lowest,
            )
        ).all()
    )
    # A grant that expires may cross a forecast threshold on its burn alone: those below the lowest
    # threshold on used + reserved are read with their burn (only they: a grant with no expiry has none).
    below = list(
        session.execute(
            select(*columns).where(
                *live,
                Tenant.expires_at > now,
                Tenant.used_ipu_ms + Tenant.reserved_ipu_ms < Tenant.quota_ipu_ms * lowest,
            )
        ).all()
    )
    burning = [t.id for t in [*crossed, *below] if t.expires_at is not None and t.expires_at > now]
    burns = _recent_burn(session, burning, now - timedelta(seconds=window_s)) if burning else {}
    for t in [*crossed, *below]:
        burn = burns.get(t.id, 0)
        forecast = forecast_ipu_ms(
            used_ipu_ms=t.used_ipu_ms,
            reserved_ipu_ms=t.reserved_ipu_ms,
            burn_ipu_ms=burn,
            window_s=window_s,
            now=now,
            expires_at=t.expires_at,
        )
        for pct in sorted({*USAGE_THRESHOLDS, *chosen.get(t.id, ())}):
            for kind, amount in (("actual", t.used_ipu_ms), ("forecast", forecast)):
                if amount * 100 >= t.quota_ipu_ms * pct:
                    emit(
                        session,
                        tenant_id=t.id,
                        type_="usage.threshold",
                        key=f"{t.id}:{t.quota_ipu_ms}:{kind}:{pct}",
                        data={
                            "tenant_id": t.id,
                            "threshold_percent": pct,
                            "kind": kind,
                            "grant_ipu_hours": t.quota_ipu_ms / 3_600_000,
                            "used_ipu_hours": t.used_ipu_ms / 3_600_000,
                            "reserved_ipu_hours": t.reserved_ipu_ms / 3_600_000,
                            "recent_burn_ipu_hours": burn / 3_600_000,
                            "forecast_ipu_hours": forecast / 3_600_000,
                            "expires_at": t.expires_at.isoformat() if t.expires_at else None,
                            "url": "/api/v1/usage",
                        },
                        at=now,
                    )
                    result["usage"] += 1
    ending = session.execute(
        select(Tenant.id, Tenant.expires_at).where(
            Tenant.expires_at.is_not(None),
            Tenant.expires_at <= now + max(w for _, w in TRIAL_WARNINGS),
            Tenant.expires_at > now - timedelta(days=1),
        )
    ).all()
    for trial in ending:
        expires = trial.expires_at.isoformat()
        data = {"tenant_id": trial.id, "expires_at": expires, "url": "/api/v1/usage"}
        if trial.expires_at <= now:
            emit(
                session,
                tenant_id=trial.id,
                type_="trial.expired",
                key=f"{trial.id}:{expires}",
                data=data,
                at=now,
            )
            result["trials"] += 1
            continue
        for name, ahead in TRIAL_WARNINGS:
            if trial.expires_at - ahead <= now:
                emit(
                    session,
                    tenant_id=trial.id,
                    type_="trial.expiring",
                    key=f"{trial.id}:{expires}:{name}",
                    data={**data, "within": name},
                    at=now,
                )
                result["trials"] += 1
    return result
