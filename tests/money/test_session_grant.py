"""A session's hold never bills past its tenant's grant, however late its meter tick comes, and an
admin who lowers the grant below what was already used takes nothing back and lets nothing more be
billed. The scheduler's sweep in the test's own transactions, at chosen moments (`now`), so a slow
tick is a sweep that comes many intervals late."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from api.views import tenant_out
from scheduler import billing
from scheduler.clock import UNSCALED
from scheduler.jobspec import SessionSpec
from scheduler.models import Attempt, IpuSession, MeterEvent, Partition, Tenant
from scheduler.services import sessions
from scheduler.services.tenancy import tenants
from tests.faults.harness import leader_loop, make_tenant

INTERVAL_S = 60.0


def start(db: Any, tenant: str) -> tuple[str, int, datetime]:
    with db.write() as s:
        spec = SessionSpec.model_validate({"ipus": 1, "max_duration_s": 7200, "idle_timeout_s": 100_000})
        sid = sessions.start_session(session=s, tenant_id=tenant, spec=spec).id
    leader_loop(db).schedule_pass()
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert row.state == "active" and row.started_at is not None and row.attempt_id is not None
        return sid, row.attempt_id, row.started_at


def sweep(db: Any, at: datetime) -> sessions.SweepResult:
    with db.write() as s:
        return sessions.sweep(session=s, now=at, clock=UNSCALED, warning_s=60, meter_interval_s=INTERVAL_S)


def set_grant(db: Any, tenant: str, quota_ipu_ms: int) -> None:
    with db.write() as s:
        tenants.update_tenant(
            session=s, tenant_id=tenant, changes={"quota_ipu_hours": quota_ipu_ms / billing.IPU_MS_PER_HOUR}
        )
    with db.read() as s:
        assert s.get(Tenant, tenant).quota_ipu_ms == quota_ipu_ms


def used(db: Any, tenant: str) -> int:
    with db.read() as s:
        return int(s.get(Tenant, tenant).used_ipu_ms)


def assert_ended_exact(db: Any, tenant: str, sid: str) -> None:
    """Ended for its grant, the ledger the sum of its events, nothing held, the partition freed."""
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert row.state == "ended" and row.ended_reason == "quota", (row.state, row.ended_reason)
        t = s.get(Tenant, tenant)
        events = s.execute(select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.tenant_id == tenant)).scalar()
        assert t.used_ipu_ms == events and t.reserved_ipu_ms == 0
        assert s.get(Partition, row.partition_pk).released_at is not None


def test_a_slow_tick_past_a_lowered_grant_bills_exactly_what_was_left(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "late-tick", hours=10)
    sid, hold_id, started = start(db, tenant)
    sweep(db, started + timedelta(seconds=INTERVAL_S))
    with db.read() as s:
        rate = s.get(Attempt, hold_id).rate
    first = used(db, tenant)
    assert first == billing.charged_ipu_ms(1, INTERVAL_S, rate)
    # 36 IPU-seconds left, then a tick nine intervals late: it is due 540 s of the hold.
    set_grant(db, tenant, first + 36_000)
    result = sweep(db, started + timedelta(seconds=10 * INTERVAL_S))
    assert result.ended == [(sid, "quota")]
    assert used(db, tenant) == first + 36_000
    assert_ended_exact(db, tenant, sid)
    with db.read() as s:
        hold = s.get(Attempt, hold_id)
        # Its clock stopped where the grant did: the late tick ran none of the time it could not pay.
        assert hold.metered_ipu_ms == first + 36_000
    # Ended: later sweeps bill it nothing.
    sweep(db, started + timedelta(seconds=20 * INTERVAL_S))
    assert used(db, tenant) == first + 36_000


def test_a_grant_lowered_below_what_was_used_bills_nothing_more(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "overdrawn", hours=10)
    sid, _, started = start(db, tenant)
    sweep(db, started + timedelta(seconds=10 * INTERVAL_S))
    spent = used(db, tenant)
    assert spent > 36_000
    set_grant(db, tenant, 36_000)
    # Nothing is taken back; the tenant is shown what it used, above its new grant, and none left.
    with db.read() as s:
        view = tenant_out(s.get(Tenant, tenant))
        assert view.used_ipu_hours == billing.ipu_hours(spent) > view.quota_ipu_hours == 0.01
        assert view.remaining_ipu_hours == 0
    result = sweep(db, started + timedelta(seconds=11 * INTERVAL_S))
    assert result.ended == [(sid, "quota")]
    assert used(db, tenant) == spent
    assert_ended_exact(db, tenant, sid)
    sweep(db, started + timedelta(seconds=20 * INTERVAL_S))
    assert used(db, tenant) == spent
