"""Exactly-once metering: replays change nothing, platform faults are free, the grant is never passed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from scheduler.models import Attempt, AttemptState, Job, MeterEvent, Tenant
from scheduler.services.tenancy import metering, tenants, usage
from scheduler.settings import get_settings
from tests.support import agentkit
from tests.tenancy.conftest import World, bill, finish, place_attempt, start_attempt, submit
from workers.agent import Agent


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
    attempt_id = start_attempt(db, world.a.job_id, "meter-a")
    first = bill(db, attempt_id, 1, 10.0)
    assert not (first.fenced or first.gone or first.exhausted)
    after_first = ledger(db, world.a.id)
    assert after_first == (4 * 10_000, 4 * 10_000, 1)
    for _ in range(3):  # the same tick again: a tick retried after its commit's answer was lost
        bill(db, attempt_id, 1, 10.0)
    assert ledger(db, world.a.id) == after_first
    bill(db, attempt_id, 2, 25.0)
    assert finish(db, attempt_id, AttemptState.SUCCEEDED, 30.0)
    done = ledger(db, world.a.id)
    assert done == (4 * 30_000, 4 * 30_000, 3)

    # The agent reports the same finish twice, then another, and a tick arrives late.
    assert not finish(db, attempt_id, AttemptState.SUCCEEDED, 30.0)
    assert not finish(db, attempt_id, AttemptState.FAILED, 99.0, "late")
    assert bill(db, attempt_id, 3, 40.0).gone == {attempt_id}
    # Replaying the meter events themselves: their deterministic ids insert nothing twice.
    with db.write() as s:
        attempt = s.get(Attempt, attempt_id)
        job = s.get(Job, world.a.job_id)
        assert metering.settle(session=s, attempt=attempt, job=job, billable=True, outcome="succeeded") == 0
        tick = metering.TickDue(attempt, 1, 10.0, job.reserved_ipu_ms, job.model)
        assert metering.meter_ticks(session=s, ticks=[tick]) == set()
    assert ledger(db, world.a.id) == done
    with db.read() as s:
        job = s.get(Job, world.a.job_id)
        t = s.get(Tenant, world.a.id)
        assert job.state == "succeeded" and job.reserved_ipu_ms == 0
        assert t.reserved_ipu_ms == 0, "the end released the rest of the reservation"


def test_platform_faults_are_not_billed(db: Any, world: World) -> None:
    attempt_id = start_attempt(db, world.a.job_id, "fault-a")
    bill(db, attempt_id, 1, 50.0)
    with db.read() as s:
        held = s.get(Tenant, world.a.id).reserved_ipu_ms + s.get(Tenant, world.a.id).used_ipu_ms
    assert finish(db, attempt_id, AttemptState.HANDED_BACK, 60.0, "its host agent is shutting down")
    used, total, _ = ledger(db, world.a.id)
    assert used == total == 0
    with db.read() as s:
        t = s.get(Tenant, world.a.id)
        assert s.get(Job, world.a.job_id).state == "queued"
        assert t.reserved_ipu_ms == held, "the job holds its whole reservation again for its next attempt"
        refund = s.get(MeterEvent, f"att:{attempt_id}:settle")
        assert refund.ipu_ms == -4 * 50_000 and refund.outcome == "handed_back"
    # The second attempt succeeds and only it is billed.
    second = start_attempt(db, world.a.job_id, "fault-a2")
    bill(db, second, 1, 20.0)
    assert finish(db, second, AttemptState.SUCCEEDED, 20.0)
    assert ledger(db, world.a.id)[:2] == (4 * 20_000, 4 * 20_000)


def test_a_running_job_that_exhausts_the_grant_is_stopped_with_the_reason(db: Any, world: World) -> None:
    """The real host agent, on a simulated clock: the admin cuts the grant while the job runs."""
    job_id = submit(db, world.a.id, workload={"model": "resnet50", "batch_size": 64, "steps": 200000})
    attempt_id = place_attempt(db, job_id, "exhaust-a")
    settings = get_settings().model_copy(
        update={"time_scale": 500.0, "heartbeat_s": 1.0, "meter_interval_s": 1.0, "agent_sync_s": 1000.0}
    )
    now = [0.0]
    agent = Agent(settings=settings, db=db, name="exhaust", queues=["ipucloud"], clock=lambda: now[0])
    agent.step()  # registers
    delivery = agent.deliver(attempt_id, 0)
    agent.step()
    assert delivery.outcome == "taken"
    for turn in range(1, 50):
        now[0] += 1.0
        agent.step()
        if turn == 3:
            # Leave 1.5 IPU-seconds of grant beyond what is billed: less than one more meter tick.
            with db.write() as s:
                t = s.get(Tenant, world.a.id)
                tenants.update_tenant(
                    session=s, tenant_id=t.id, changes={"quota_ipu_hours": (t.used_ipu_ms + 1500) / 3.6e6}
                )
        with db.read() as s:
            if s.get(Job, job_id).state != "running":
                break
    assert attempt_id not in agent.running
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
    attempt_id = start_attempt(db, world.a.job_id, "settle-cut")
    bill(db, attempt_id, 1, 10.0)
    with db.write() as s:
        t = s.get(Tenant, world.a.id)
        # 2.5 IPU-seconds left: far less than the 4 IPUs x 20 s still to settle.
        tenants.update_tenant(
            session=s, tenant_id=t.id, changes={"quota_ipu_hours": (t.used_ipu_ms + 2500) / 3.6e6}
        )
        quota = s.get(Tenant, world.a.id).quota_ipu_ms
    assert finish(db, attempt_id, AttemptState.SUCCEEDED, 30.0)
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
    attempt_id = start_attempt(db, world.a.job_id, "tick-none")
    bill(db, attempt_id, 1, 10.0)
    with db.write() as s:
        t = s.get(Tenant, world.a.id)
        tenants.update_tenant(session=s, tenant_id=t.id, changes={"quota_ipu_hours": t.used_ipu_ms / 3.6e6})
    before = ledger(db, world.a.id)
    assert bill(db, attempt_id, 2, 20.0).exhausted == {attempt_id}
    assert ledger(db, world.a.id) == before
    with db.read() as s:
        assert s.get(MeterEvent, f"att:{attempt_id}:tick:2") is None


def test_a_job_that_ends_on_a_platform_fault_is_refunded_and_holds_nothing(db: Any, world: World) -> None:
    """Lost on its last allowed attempt: its ticks are refunded and its whole reservation freed."""
    attempt_id = start_attempt(db, world.a.job_id, "lost-last")
    bill(db, attempt_id, 1, 40.0)
    result = agentkit.tick(
        db, finishes=[agentkit.Finish(attempt_id, AttemptState.LOST, 45.0, "its host died")], max_attempts=1
    )
    assert result.finished == {attempt_id}
    used, total, _ = ledger(db, world.a.id)
    assert used == total == 0
    with db.read() as s:
        job = s.get(Job, world.a.job_id)
        assert job.state == "failed" and job.reserved_ipu_ms == 0
        assert s.get(Tenant, world.a.id).reserved_ipu_ms == 0
