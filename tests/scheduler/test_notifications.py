"""The notification services on the database: one event per state change, fan-out by type, claims,
the retry schedule, what disables a webhook, and the sweep's thresholds (once per grant, again after
the grant changes)."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.clock import Clock
from scheduler.models import Tenant, utcnow
from scheduler.notify_models import Event, Webhook, WebhookDelivery
from scheduler.services.tenancy import deliveries, notifications, tenants, thresholds, webhooks
from scheduler.settings import get_settings
from scheduler.webhook_http import Outcome, refusal, retry_after

FAIL = Outcome(500, 12, "boom", "answered 500")
OK = Outcome(200, 8, "ok", None)


@pytest.fixture
def tenant_id(db: Any, seeded: Any) -> str:
    with db.write() as s:
        return tenants.create_tenant(
            session=s, secret=get_settings().secret(), name="t", plan="standard", quota_ipu_hours=10
        ).tenant.id


def hook(db: Any, tenant_id: str, events: list[str] | None = None, enabled: bool = True) -> str:
    with db.write() as s:
        row = Webhook(
            id=f"wh_{random.getrandbits(40):x}",
            tenant_id=tenant_id,
            url="https://192.0.2.1/",
            description="",
            events=events or [],
            enabled=enabled,
            secret=webhooks.new_secret(),
        )
        s.add(row)
        return row.id


def emit(db: Any, tenant_id: str, type_: str = "job.failed", key: str = "job_1:1") -> None:
    with db.write() as s:
        notifications.emit(s, tenant_id=tenant_id, type_=type_, key=key, data={"id": key})


def events(db: Any) -> list[Event]:
    with db.read() as s:
        return list(s.execute(select(Event).order_by(Event.seq)).scalars())


def stored_deliveries(db: Any) -> list[WebhookDelivery]:
    with db.read() as s:
        return list(s.execute(select(WebhookDelivery).order_by(WebhookDelivery.id)).scalars())


def test_one_event_per_id_within_and_across_transactions(db: Any, tenant_id: str) -> None:
    with db.write() as s:
        for _ in range(3):
            notifications.emit(s, tenant_id=tenant_id, type_="job.failed", key="job_1:1", data={"n": 1})
        notifications.emit(s, tenant_id=tenant_id, type_="job.succeeded", key="job_2:1", data={})
    emit(db, tenant_id)
    assert [e.id for e in events(db)] == ["job.failed:job_1:1", "job.succeeded:job_2:1"]


def test_a_rolled_back_change_writes_no_event(db: Any, tenant_id: str) -> None:
    with pytest.raises(RuntimeError), db.write() as s:
        notifications.emit(s, tenant_id=tenant_id, type_="job.failed", key="x", data={})
        raise RuntimeError("the state change failed")
    assert events(db) == []


def test_fan_out_follows_each_webhooks_types_and_skips_disabled_ones(db: Any, tenant_id: str) -> None:
    every = hook(db, tenant_id)
    failures = hook(db, tenant_id, ["job.failed"])
    hook(db, tenant_id, enabled=False)
    emit(db, tenant_id, "job.failed", "a")
    emit(db, tenant_id, "job.succeeded", "b")
    with db.write() as s:
        assert deliveries.fan_out(session=s) == 2
    with db.write() as s:
        assert deliveries.fan_out(session=s) == 0
    got = {(d.webhook_id, d.event_id) for d in stored_deliveries(db)}
    assert got == {(every, "job.failed:a"), (every, "job.succeeded:b"), (failures, "job.failed:a")}


def test_claims_are_exclusive_until_they_lapse(db: Any, tenant_id: str) -> None:
    hook(db, tenant_id)
    emit(db, tenant_id)
    with db.write() as s:
        deliveries.fan_out(session=s)
    now = utcnow()
    with db.write() as s:
        first = deliveries.claim_due(session=s, now=now, lease_s=30)
    with db.write() as s:
        assert deliveries.claim_due(session=s, now=now, lease_s=30) == []
    with db.write() as s:
        assert deliveries.claim_due(session=s, now=now + timedelta(seconds=31), lease_s=30) == first
    assert len(first) == 1


def settle(db: Any, delivery_id: int, outcome: Outcome, at: Any, **kw: Any) -> Any:
    with db.write() as s:
        return deliveries.record_outcome(
            session=s,
            delivery_id=delivery_id,
            outcome=outcome,
            now=at,
            clock=Clock(kw.get("time_scale", 1.0)),
            disable_after_s=kw.get("disable_after_s", 5 * 86400),
            rng=random.Random(1),
        )


def one_delivery(db: Any, tenant_id: str) -> tuple[str, int]:
    webhook_id = hook(db, tenant_id)
    emit(db, tenant_id)
    with db.write() as s:
        deliveries.fan_out(session=s)
    return webhook_id, stored_deliveries(db)[0].id


def test_failures_follow_the_schedule_then_fail(db: Any, tenant_id: str) -> None:
    _, delivery_id = one_delivery(db, tenant_id)
    at = utcnow()
    waits = []
    for n, planned in enumerate(deliveries.RETRY_SCHEDULE_S, start=1):
        assert settle(db, delivery_id, FAIL, at, disable_after_s=10**9)["status"] == "pending"
        (d,) = stored_deliveries(db)
        wait = (d.next_attempt_at - at).total_seconds()
        assert planned * 0.8 <= wait <= planned * 1.2 and d.attempts == n
        waits.append(wait)
        at = d.next_attempt_at
    assert settle(db, delivery_id, FAIL, at, disable_after_s=10**9)["status"] == "failed"
    assert 2.5 * 86400 < sum(waits) < 3.5 * 86400  # about three days, ten tries


def test_the_schedule_is_compressed_by_the_time_scale_and_retry_after_is_honoured(
    db: Any, tenant_id: str
) -> None:
    _, delivery_id = one_delivery(db, tenant_id)
    at = utcnow()
    settle(db, delivery_id, FAIL, at, time_scale=1000)
    assert (stored_deliveries(db)[0].next_attempt_at - at).total_seconds() < 0.01
    settle(db, delivery_id, Outcome(503, 5, "", "answered 503", retry_after_s=120), at, time_scale=1000)
    assert (stored_deliveries(db)[0].next_attempt_at - at).total_seconds() == pytest.approx(120, abs=0.01)
    assert settle(db, delivery_id, OK, at)["status"] == "succeeded"
    (d,) = stored_deliveries(db)
    assert d.attempts == 3 and d.delivered_at is not None and d.response_excerpt == "ok"


def test_410_disables_and_says_so(db: Any, tenant_id: str) -> None:
    webhook_id, delivery_id = one_delivery(db, tenant_id)
    result = settle(db, delivery_id, Outcome(410, 3, "", "answered 410"), utcnow())
    assert result == {"status": "failed", "disabled": True}
    with db.read() as s:
        row = s.get(Webhook, webhook_id)
        assert not row.enabled and "410" in (row.disabled_reason or "")
    assert [e.type for e in events(db)][-1] == "webhook.disabled"


def test_failing_for_days_disables_and_a_success_forgives(db: Any, tenant_id: str) -> None:
    webhook_id, delivery_id = one_delivery(db, tenant_id)
    start = utcnow()
    settle(db, delivery_id, FAIL, start)
    assert settle(db, delivery_id, OK, start + timedelta(days=4))["status"] == "succeeded"
    with db.read() as s:
        assert s.get(Webhook, webhook_id).failing_since is None
    emit(db, tenant_id, key="job_2:1")
    with db.write() as s:
        deliveries.fan_out(session=s)
    second = stored_deliveries(db)[-1].id
    settle(db, second, FAIL, start)
    result = settle(db, second, FAIL, start + timedelta(days=5, seconds=1))
    assert result == {"status": "failed", "disabled": True}


def test_thresholds_fire_once_per_grant_and_again_after_it_changes(db: Any, tenant_id: str) -> None:
    hour = 3_600_000
    with db.write() as s:
        t = s.get(Tenant, tenant_id)
        t.used_ipu_ms, t.reserved_ipu_ms = 7 * hour, 2 * hour  # 70% used, 90% forecast
    for _ in range(2):
        with db.write() as s:
            thresholds.sweep(session=s, now=utcnow())
    kinds = sorted((e.data["kind"], e.data["threshold_percent"]) for e in events(db))
    assert kinds == [("actual", 50), ("forecast", 50), ("forecast", 80)]
    with db.write() as s:
        s.get(Tenant, tenant_id).used_ipu_ms = 10 * hour
        thresholds.sweep(session=s, now=utcnow())
    kinds = sorted((e.data["kind"], e.data["threshold_percent"]) for e in events(db))
    assert kinds == [(k, p) for k in ("actual", "forecast") for p in (50, 80, 100)]
    with db.write() as s:
        s.get(Tenant, tenant_id).quota_ipu_ms = 12 * hour  # the admin raised the grant: 83% now
    with db.write() as s:
        thresholds.sweep(session=s, now=utcnow())
    # 10 of 12 used (83%), 12 of 12 forecast: 50% and 80% actual, 50%, 80% and 100% forecast of the
    # new grant.
    assert len(events(db)) == 6 + 5


def test_trials_are_warned_a_week_and_a_day_ahead_then_expire(db: Any, tenant_id: str) -> None:
    now = utcnow()
    with db.write() as s:
        s.get(Tenant, tenant_id).expires_at = now + timedelta(days=3)
    with db.write() as s:
        thresholds.sweep(session=s, now=now)
    with db.write() as s:
        thresholds.sweep(session=s, now=now + timedelta(days=2, hours=1))
    with db.write() as s:
        thresholds.sweep(session=s, now=now + timedelta(days=3, seconds=1))
    got = [(e.type, e.data.get("within")) for e in events(db)]
    assert got == [("trial.expiring", "7d"), ("trial.expiring", "1d"), ("trial.expired", None)]


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("8.8.8.8", False),
        ("2001:4860:4860::8888", False),
        ("127.0.0.1", True),
        ("10.0.0.1", True),
        ("172.16.5.4", True),
        ("100.64.0.1", True),
        ("169.254.169.254", True),
        ("fe80::1", True),
        ("fc00::1", True),
        ("::ffff:10.0.0.1", True),
        ("224.0.0.1", True),
    ],
)
def test_which_addresses_a_webhook_may_reach(address: str, refused: bool) -> None:
    import ipaddress

    assert (refusal(ipaddress.ip_address(address)) is not None) is refused


def test_retry_after_reads_seconds_and_dates() -> None:
    now = utcnow()
    assert retry_after("30", now) == 30
    assert retry_after(
        (now + timedelta(seconds=90)).strftime("%a, %d %b %Y %H:%M:%S GMT"), now
    ) == pytest.approx(90, abs=1.5)
    assert retry_after("soon", now) is None and retry_after(None, now) is None
    # Unicode digits are not a number of seconds (`float("²")` raised out of the notifier).
    assert retry_after("\u00b2", now) is None and retry_after("\u0664\u0665", now) is None


def test_jobs_are_warned_as_they_near_their_time_limit(db: Any, tenant_id: str) -> None:
    from scheduler.jobspec import JobSpec
    from scheduler.models import Attempt, Job
    from scheduler.services.batch import jobs
    from tests.tenancy.conftest import JOB, start_attempt

    with db.write() as s:
        spec = JobSpec.model_validate({**JOB, "max_runtime_s": 1000})
        job_id = jobs.submit_job(session=s, tenant_id=tenant_id, spec=spec).job.id
    attempt_id = start_attempt(db, job_id, "warned")

    def at_run_s(run_s: float) -> list[tuple[Any, ...]]:
        with db.write() as s:
            attempt = s.get(Attempt, attempt_id)
            scale = float(attempt.timeline["scale"])
            ran = run_s + attempt.unbilled_s
            attempt.started_at = utcnow() - timedelta(seconds=ran / scale)
        with db.write() as s:
            thresholds.sweep(session=s, now=utcnow())
        return [(e.data["percent"], e.data["id"]) for e in events(db) if e.type == "job.runtime_warning"]

    assert at_run_s(100) == []
    assert at_run_s(510) == [(50, job_id)]
    assert at_run_s(520) == [(50, job_id)]  # once
    assert at_run_s(950) == [(50, job_id), (90, job_id)]  # 80% was never seen: only the highest
    with db.read() as s:
        assert s.get(Job, job_id).max_runtime_s == 1000


def test_a_webhook_has_at_most_its_share_in_flight(db: Any, tenant_id: str) -> None:
    slow = hook(db, tenant_id)
    quick = hook(db, tenant_id)
    for n in range(10):
        emit(db, tenant_id, key=f"job_{n}:1")
    with db.write() as s:
        deliveries.fan_out(session=s)
    now = utcnow()
    with db.write() as s:
        first = deliveries.claim_due(session=s, now=now, lease_s=30, per_webhook=3)
    by_hook = {d.id: d.webhook_id for d in stored_deliveries(db)}
    assert sorted(by_hook[i] for i in first) == sorted([slow] * 3 + [quick] * 3)
    # The quick one's settle; the slow one's are still in flight: only the quick one gets more.
    for delivery_id in first:
        if by_hook[delivery_id] == quick:
            settle(db, delivery_id, OK, now)
    with db.write() as s:
        second = deliveries.claim_due(session=s, now=now, lease_s=30, per_webhook=3)
    assert [by_hook[i] for i in second] == [quick] * 3


def test_the_forecast_carries_the_recent_burn_on_to_the_grants_expiry() -> None:
    now = utcnow()
    hour = 3_600_000
    day = 86400.0

    def forecast(burn: int, window_s: float = day, expires: Any = now + timedelta(days=3)) -> int:
        return thresholds.forecast_ipu_ms(
            used_ipu_ms=10 * hour,
            reserved_ipu_ms=5 * hour,
            burn_ipu_ms=burn,
            window_s=window_s,
            now=now,
            expires_at=expires,
        )

    assert forecast(2 * hour) == 15 * hour + 3 * 2 * hour  # 2 IPU-hours a day, for three more days
    assert forecast(0) == 15 * hour
    assert forecast(2 * hour, expires=None) == 15 * hour, "a grant that never expires has no burn to come"
    assert forecast(2 * hour, expires=now - timedelta(seconds=1)) == 15 * hour, "nor one already expired"
    assert forecast(-2 * hour) == 15 * hour, "a window of refunds burns nothing"
    # At a time scale of 1000, 24 h of cluster time is 86.4 s: three days of wall time to expiry is 3,000
    # of those windows.
    assert forecast(hour, window_s=day / 1000) == 15 * hour + 3000 * hour
