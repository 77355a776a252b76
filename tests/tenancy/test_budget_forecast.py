"""The `forecast` budget threshold counts the recent burn: a grant that expires fires a forecast threshold
when the last 24 h of cluster time's charge, carried on at that rate to its expiry, would cross it, though
what is used and reserved is far below; once per threshold per grant, as the actual ones do."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from scheduler.clock import UNSCALED, Clock
from scheduler.models import MeterEvent, Tenant, utcnow
from scheduler.notify_models import Event
from scheduler.services.tenancy import thresholds
from tests.tenancy.conftest import World, bill, start_attempt

SCALE = 1000.0  # cluster seconds a wall second, as the tests' clouds run: 24 h of cluster time is 86.4 s


def threshold_events(db: Any, tenant_id: str) -> list[tuple[str, int]]:
    with db.read() as s:
        rows = s.execute(
            select(Event).where(Event.tenant_id == tenant_id, Event.type == "usage.threshold")
        ).scalars()
        return sorted((e.data["kind"], e.data["threshold_percent"]) for e in rows)


def test_the_recent_burn_to_expiry_fires_forecast_thresholds_once(db: Any, world: World) -> None:
    attempt_id = start_attempt(db, world.a.job_id, "burn-a")
    bill(db, attempt_id, 1, 10.0)  # 4 IPUs for 10 cluster seconds, charged just now
    with db.write() as s:
        burn = int(  # PostgreSQL sums BIGINTs as NUMERIC
            s.execute(
                select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.tenant_id == world.a.id)
            ).scalar_one()
        )
        t = s.get(Tenant, world.a.id)
        held = t.used_ipu_ms + t.reserved_ipu_ms
        assert burn == t.used_ipu_ms == 40_000
        # A grant of which used + reserved is a tenth, expiring when this pace would have spent 65% of it.
        t.quota_ipu_ms = 10 * held
        window_s = 86400 / SCALE
        now = utcnow()
        t.expires_at = now + timedelta(seconds=(0.65 * t.quota_ipu_ms - held) / burn * window_s)
        quota, expires = t.quota_ipu_ms, t.expires_at
        # The same burn on a grant that never expires forecasts nothing beyond used + reserved.
        other = s.get(Tenant, world.b.id)
        other.used_ipu_ms, other.reserved_ipu_ms, other.quota_ipu_ms = 40_000, held - 40_000, 10 * held

    for _ in range(2):
        with db.write() as s:
            thresholds.sweep(session=s, now=now, clock=Clock(SCALE))
    assert threshold_events(db, world.a.id) == [("forecast", 50)], (
        "once, and no actual threshold: 10% is used"
    )
    with db.read() as s:
        (event,) = s.execute(
            select(Event).where(Event.tenant_id == world.a.id, Event.type == "usage.threshold")
        ).scalars()
    assert event.data["recent_burn_ipu_hours"] == burn / 3_600_000
    assert abs(event.data["forecast_ipu_hours"] - 0.65 * quota / 3_600_000) < 1e-6
    assert event.data["expires_at"] == expires.isoformat()
    assert threshold_events(db, world.b.id) == []

    # Read a day of wall time as 24 h of cluster time (time scale 1): the same charge is a slower pace,
    # and forecasts less; the threshold already written is not written again.
    with db.write() as s:
        thresholds.sweep(session=s, now=now, clock=UNSCALED)
    assert threshold_events(db, world.a.id) == [("forecast", 50)]

    # More is charged at the same moment: the pace doubles and the forecast passes 80% and 100%, once each.
    bill(db, attempt_id, 2, 20.0)
    for _ in range(2):
        with db.write() as s:
            thresholds.sweep(session=s, now=now, clock=Clock(SCALE))
    assert threshold_events(db, world.a.id) == [("forecast", 50), ("forecast", 80), ("forecast", 100)]

    # Once the charge is older than the window, the burn is gone: nothing new, and nothing fires twice.
    with db.write() as s:
        thresholds.sweep(session=s, now=now + timedelta(seconds=2 * window_s), clock=Clock(SCALE))
    assert threshold_events(db, world.a.id) == [("forecast", 50), ("forecast", 80), ("forecast", 100)]
