"""Exactly-once metering: replays change nothing, platform faults are free, the grant is never passed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from scheduler.models import Attempt, AttemptState, Job, MeterEvent, Tenant
from scheduler.services import attempts, metering, tenants, usage
from scheduler.services.attempts import Directive
from scheduler.settings import get_settings
from tests.tenancy.conftest import World, finish, heartbeat, place_attempt, start_attempt, submit
from workers.runner import RunContext, run_attempt


def ledger(db: Any, tenant_id: str) -> tuple[int, int, int]:
    """(tenant's used counter, sum of its meter events, number of its meter events)."""
    with db.read() as s:
        used = s.get(Tenant, tenant_id).used_ipu_ms
        total = usage.ledger_total_ipu_ms(session=s, tenant_id=tenant_id)
        count = s.execute(
            select(func.count()).select_from(MeterEvent).where(MeterEvent.tenant_id == tenant_id)
        ).scalar_one()
    return used, total, count


def test_replayed_ticks_settles_and_finishes_leave_the_ledger_unchanged(db: Any, world: World) -> None:
    attempt_id, epoch = start_attempt(db, world.a.job_id, "meter-a")
    assert heartbeat(db, attempt_id, epoch, 1, 10.0) == Directive.CONTINUE
    after_first = ledger(db, world.a.id)
    assert after_first == (4 * 10_000, 4 * 10_000, 1)
    for _ in range(3):  # the same tick again: a heartbeat retried after a lost answer
        heartbeat(db, attempt_id, epoch, 1, 10.0)
    assert ledger(db, world.a.id) == after_first
    heartbeat(db, attempt_id, epoch, 2, 25.0)
    assert finish(db, attempt_id, epoch, AttemptState.SUCCEEDED, 30.0)
    done = ledger(db, world.a.id)
    assert done == (4 * 30_000, 4 * 30_000, 3)

    # The worker reports the same finish twice, a stale worker reports another, ticks arrive late.
    assert not finish(db, attempt_id, epoch, AttemptState.SUCCEEDED, 30.0)
    assert not finish(db, attempt_id, epoch, AttemptState.FAILED, 99.0, "late")
    assert heartbeat(db, attempt_id, epoch, 3, 40.0) == Directive.FENCED
    # Replaying the meter events themselves: their deterministic ids insert nothing twice.
    with db.write() as s:
        attempt = s.get(Attempt, attempt_id)
        job = s.get(Job, world.a.job_id)
        assert metering.settle(session=s, attempt=attempt, job=job, billable=True, outcome="succeeded") == 0
        assert (
            metering.meter_tick(session=s, attempt=attempt, job=job, seq=1, cluster_s=10.0).billed_ipu_ms == 0
        )
    assert ledger(db, world.a.id) == done
    with db.read() as s:
        job = s.get(Job, world.a.job_id)
        t = s.get(Tenant, world.a.id)
        assert job.state == "succeeded" and job.reserved_ipu_ms == 0
        assert t.reserved_ipu_ms == 0, "the end released the rest of the reservation"


def test_platform_faults_are_not_billed(db: Any, world: World) -> None:
    attempt_id, epoch = start_attempt(db, world.a.job_id, "fault-a")
    heartbeat(db, attempt_id, epoch, 1, 50.0)
    with db.read() as s:
        held = s.get(Tenant, world.a.id).reserved_ipu_ms + s.get(Tenant, world.a.id).used_ipu_ms
    assert finish(db, attempt_id, epoch, AttemptState.HANDED_BACK, 60.0, "worker shutting down")
    used, total, _ = ledger(db, world.a.id)
    assert used == total == 0
    with db.read() as s:
        t = s.get(Tenant, world.a.id)
        assert s.get(Job, world.a.job_id).state == "queued"
        assert t.reserved_ipu_ms == held, "the job holds its whole reservation again for its next attempt"
        refund = s.get(MeterEvent, f"att:{attempt_id}:settle")
        assert refund.ipu_ms == -4 * 50_000 and refund.outcome == "handed_back"
    # The second attempt succeeds and only it is billed.
    second, epoch2 = start_attempt(db, world.a.job_id, "fault-a2")
    heartbeat(db, second, epoch2, 1, 20.0)
    assert finish(db, second, epoch2, AttemptState.SUCCEEDED, 20.0)
    assert ledger(db, world.a.id)[:2] == (4 * 20_000, 4 * 20_000)


def test_a_running_job_that_exhausts_the_grant_is_stopped_with_the_reason(db: Any, world: World) -> None:
    """The real worker loop, on a simulated clock: the admin cuts the grant while the job runs."""
    job_id = submit(db, world.a.id, workload={"model": "resnet50", "batch_size": 64, "steps": 200000})
    attempt_id = place_attempt(db, job_id, "exhaust-a")
    settings = get_settings().model_copy(update={"time_scale": 500.0, "heartbeat_s": 1.0})
    now = [0.0]
    beats = [0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        beats[0] += 1
        if beats[0] == 3:
            # Leave 1.5 IPU-seconds of grant beyond what is billed: less than one more heartbeat.
            with db.write() as s:
                t = s.get(Tenant, world.a.id)
                tenants.update_tenant(
                    session=s, tenant_id=t.id, changes={"quota_ipu_hours": (t.used_ipu_ms + 1500) / 3.6e6}
                )

    ctx = RunContext(settings=settings, db=db, worker="test", sleep=sleep, clock=lambda: now[0])
    outcome = run_attempt(ctx, attempt_id=attempt_id, epoch=0)
    assert outcome == "failed"
    with db.read() as s:
        job = s.get(Job, job_id)
        t = s.get(Tenant, world.a.id)
        assert job.state == "failed" and "grant is used up" in (job.reason or ""), job.reason
        assert t.used_ipu_ms == t.quota_ipu_ms, "billed up to the grant, not a millisecond more"
        assert job.reserved_ipu_ms == 0
    used, total, _ = ledger(db, world.a.id)
    assert used == total


def test_a_finish_that_would_pass_the_grant_bills_what_is_left_and_frees_the_reservation(
    db: Any, world: World
) -> None:
    """The settle's guarded update refuses, so the settle locks the tenant and bills only the rest."""
    attempt_id, epoch = start_attempt(db, world.a.job_id, "settle-cut")
    heartbeat(db, attempt_id, epoch, 1, 10.0)
    with db.write() as s:
        t = s.get(Tenant, world.a.id)
        # 2.5 IPU-seconds left: far less than the 4 IPUs x 20 s still to settle.
        tenants.update_tenant(
            session=s, tenant_id=t.id, changes={"quota_ipu_hours": (t.used_ipu_ms + 2500) / 3.6e6}
        )
        quota = s.get(Tenant, world.a.id).quota_ipu_ms
    assert finish(db, attempt_id, epoch, AttemptState.SUCCEEDED, 30.0)
    used, total, count = ledger(db, world.a.id)
    assert used == total == quota and count == 2
    with db.read() as s:
        settle = s.get(MeterEvent, f"att:{attempt_id}:settle")
        assert settle.ipu_ms == quota - 4 * 10_000
        attempt = s.get(Attempt, attempt_id)
        assert attempt.metered_ipu_ms == total
        job = s.get(Job, world.a.job_id)
        assert job.state == "succeeded" and job.reserved_ipu_ms == 0
        assert s.get(Tenant, world.a.id).reserved_ipu_ms == 0


def test_a_tick_with_nothing_left_bills_nothing_and_writes_no_event(db: Any, world: World) -> None:
    attempt_id, epoch = start_attempt(db, world.a.job_id, "tick-none")
    heartbeat(db, attempt_id, epoch, 1, 10.0)
    with db.write() as s:
        t = s.get(Tenant, world.a.id)
        tenants.update_tenant(session=s, tenant_id=t.id, changes={"quota_ipu_hours": t.used_ipu_ms / 3.6e6})
    before = ledger(db, world.a.id)
    assert heartbeat(db, attempt_id, epoch, 2, 20.0) == Directive.QUOTA
    assert ledger(db, world.a.id) == before
    with db.read() as s:
        assert s.get(MeterEvent, f"att:{attempt_id}:tick:2") is None


def test_a_job_that_ends_on_a_platform_fault_is_refunded_and_holds_nothing(db: Any, world: World) -> None:
    """Lost on its last allowed attempt: its ticks are refunded and its whole reservation freed."""
    attempt_id, epoch = start_attempt(db, world.a.job_id, "lost-last")
    heartbeat(db, attempt_id, epoch, 1, 40.0)
    with db.write() as s:
        done = attempts.finish(
            session=s,
            attempt_id=attempt_id,
            epoch=epoch,
            outcome=AttemptState.LOST,
            cluster_s=45.0,
            reason="worker died",
            max_attempts=1,
        )
    assert done
    used, total, _ = ledger(db, world.a.id)
    assert used == total == 0
    with db.read() as s:
        job = s.get(Job, world.a.job_id)
        assert job.state == "failed" and job.reserved_ipu_ms == 0
        assert s.get(Tenant, world.a.id).reserved_ipu_ms == 0
