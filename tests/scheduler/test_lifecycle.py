"""The state changes of a job, one function at a time, on the real test database."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.errors import DoesNotFit, IdempotencyConflict, InvalidRequest, LimitExceeded, QuotaExceeded
from scheduler.jobspec import JobSpec
from scheduler.loop import SchedulerLoop
from scheduler.models import (
    Attempt,
    AttemptState,
    IpuAssignment,
    Job,
    MeterEvent,
    OutboxMessage,
    Partition,
    Tenant,
)
from scheduler.services.batch import attempts, jobs
from scheduler.services.capacity import agents, leader, reconciler
from scheduler.services.tenancy import tenants
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.support import agentkit


def spec(**over: Any) -> JobSpec:
    body: dict[str, Any] = {
        "name": "resnet",
        "workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 10},
        "ipus": 4,
    }
    body.update(over)
    return JobSpec.model_validate(body)


class FakeCelery:
    """Records what the dispatcher publishes (the broker itself is exercised by the e2e tests)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []

    def producer_or_acquire(self) -> Any:
        from contextlib import nullcontext

        return nullcontext(None)

    def send_task(self, name: str, args: list[Any], queue: str, producer: Any = None) -> None:
        self.sent.append((name, args, queue))


@pytest.fixture
def tenant(db: Any, seeded: Any) -> str:
    with db.write() as s:
        created = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name="acme", plan="standard", quota_ipu_hours=100
        )
        return created.tenant.id


@pytest.fixture
def loop(db: Any, env: Any) -> SchedulerLoop:
    return SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]


def submit(db: Any, tenant: str, **over: Any) -> str:
    with db.write() as s:
        return jobs.submit_job(session=s, tenant_id=tenant, spec=spec(**over)).job.id


def test_submit_reserves_predicted_cost_and_queues(db: Any, tenant: str) -> None:
    job_id = submit(db, tenant)
    with db.read() as s:
        job = s.get(Job, job_id)
        t = s.get(Tenant, tenant)
        assert job.state == "queued" and job.ipus == 4
        assert job.reserved_ipu_ms == round(4 * job.predicted_runtime_s * 1000) > 0
        assert t.reserved_ipu_ms == job.reserved_ipu_ms and t.used_ipu_ms == 0


def test_bad_jobs_are_refused_and_change_nothing(db: Any, tenant: str) -> None:
    with pytest.raises(InvalidRequest):
        submit(db, tenant, workload={"model": "gpt-17", "steps": 1})
    with pytest.raises(InvalidRequest, match="larger than any"):
        submit(db, tenant, ipus=256)  # the seeded fleet has two POD64s: 128 IPUs at most
    with pytest.raises(DoesNotFit):
        submit(
            db,
            tenant,
            ipus=1,
            workload={
                "model": "bert-large",
                "batch_size": 4096,
                "seq_len": 512,
                "precision": "fp32",
                "steps": 1,
            },
        )
    huge = {"model": "bert-large", "seq_len": 512, "samples": 10**11}
    # 24.9 million cluster seconds: far past the standard plan's 14 days per job. Accepted, it would
    # be stopped unfinished and billed; refused, the user learns what would fit.
    with pytest.raises(LimitExceeded) as refused:
        submit(db, tenant, ipus=64, workload=huge)
    assert refused.value.extra["max_runtime_s"] == 1_209_600
    assert refused.value.extra["predicted_runtime_s"] > 24_000_000
    assert 0 < refused.value.extra["fitting_samples"] < 10**11
    assert "set max_runtime_s" in refused.value.detail and "1,209,600 s" in refused.value.detail
    # Asked to stop at the limit, it is judged on what that costs: more than the grant.
    with pytest.raises(QuotaExceeded):
        submit(db, tenant, ipus=64, workload=huge, max_runtime_s=1_209_600)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 0
        assert s.get(Tenant, tenant).reserved_ipu_ms == 0


def test_idempotency_key_replays_or_conflicts(db: Any, tenant: str) -> None:
    with db.write() as s:
        first = jobs.submit_job(session=s, tenant_id=tenant, spec=spec(), idempotency_key="k1")
    with db.write() as s:
        again = jobs.submit_job(session=s, tenant_id=tenant, spec=spec(), idempotency_key="k1")
    assert again.replayed and again.job.id == first.job.id
    with db.write() as s, pytest.raises(IdempotencyConflict):
        jobs.submit_job(session=s, tenant_id=tenant, spec=spec(name="other"), idempotency_key="k1")


def test_a_retry_replays_across_a_release_that_adds_a_defaulted_field(db: Any, tenant: str) -> None:
    class NewerSpec(JobSpec):
        # A field a later release might add: a client that never sends it asks for the same thing.
        colour: str = "blue"

    body = spec().model_dump(mode="json", exclude_defaults=True)
    older, newer = JobSpec.model_validate(body), NewerSpec.model_validate(body)
    assert jobs.request_hash(newer) == jobs.request_hash(older)
    # Spelling a default out is the same request as leaving it out; changing it is not.
    assert jobs.request_hash(spec(priority=0)) == jobs.request_hash(spec())
    assert jobs.request_hash(spec(priority=3)) != jobs.request_hash(spec())

    with db.write() as s:
        first = jobs.submit_job(session=s, tenant_id=tenant, spec=older, idempotency_key="upgrade")
    with db.write() as s:
        again = jobs.submit_job(session=s, tenant_id=tenant, spec=newer, idempotency_key="upgrade")
    assert again.replayed and again.job.id == first.job.id


def test_a_key_stored_with_the_whole_spec_hashed_still_replays(db: Any, tenant: str) -> None:
    with db.write() as s:
        first = jobs.submit_job(session=s, tenant_id=tenant, spec=spec(), idempotency_key="old")
        first.job.request_hash = jobs._legacy_request_hash(spec())  # as a release before the change stored it
    with db.write() as s:
        again = jobs.submit_job(session=s, tenant_id=tenant, spec=spec(), idempotency_key="old")
    assert again.replayed and again.job.id == first.job.id


def run_to_end(db: Any, loop: SchedulerLoop, job_id: str, cluster_s: float, ticks: int = 3) -> Attempt:
    assert loop.lead()
    assert loop.schedule_pass() == 1
    assert loop.dispatch() == 1
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == job_id)).scalar_one()
    taken = agentkit.take(db, attempt.id)
    assert taken is not None and taken.epoch == 1
    for i in range(1, ticks + 1):
        result = agentkit.bill(db, attempt.id, i, cluster_s * i / (ticks + 1))
        assert not result.fenced and not result.gone and not result.exhausted
    assert agentkit.finish(db, attempt.id, AttemptState.SUCCEEDED, cluster_s)
    with db.read() as s:
        return s.get(Attempt, attempt.id)


def test_place_take_tick_finish_meters_exactly_once(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    job_id = submit(db, tenant)
    attempt = run_to_end(db, loop, job_id, cluster_s=12.5)
    with db.read() as s:
        job = s.get(Job, job_id)
        assert job.state == "succeeded" and job.reserved_ipu_ms == 0
        events = s.execute(select(MeterEvent).where(MeterEvent.attempt_id == attempt.id)).scalars().all()
        assert sum(e.ipu_ms for e in events) == 4 * 12_500
        assert [e.kind for e in events].count("settle") == 1
        assert [e.kind for e in events].count("tick") == 3
        t = s.get(Tenant, tenant)
        assert t.used_ipu_ms == 4 * 12_500 and t.reserved_ipu_ms == 0
        assert s.execute(select(func.count()).select_from(IpuAssignment)).scalar_one() == 0
        assert (
            s.execute(select(Partition.released_at).where(Partition.job_id == job_id)).scalar_one()
            is not None
        )
        assert s.execute(select(OutboxMessage.acked_at)).scalar_one() is not None
        assert attempt.timeline is not None and attempt.timeline["scale"] == 1.0


def test_stale_epoch_and_duplicate_finish_change_nothing(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    job_id = submit(db, tenant)
    attempt = run_to_end(db, loop, job_id, cluster_s=10)
    with db.read() as s:
        before = s.get(Tenant, tenant).used_ipu_ms
    assert not agentkit.finish(db, attempt.id, AttemptState.SUCCEEDED, 99)
    assert agentkit.take(db, attempt.id, 0, agent=agentkit.register(db, "dup")) is None
    assert agentkit.bill(db, attempt.id, 9, 50).gone == {attempt.id}
    with db.read() as s:
        assert s.get(Tenant, tenant).used_ipu_ms == before


def test_a_replaced_agent_incarnation_can_change_nothing(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    job_id = submit(db, tenant)
    assert loop.lead() and loop.schedule_pass() == 1
    with db.read() as s:
        aid = s.execute(select(Attempt.id).where(Attempt.job_id == job_id)).scalar_one()
    old = agentkit.lease(db)
    assert agentkit.take(db, aid, agent=old) is not None
    new = agentkit.register(db)  # the agent restarted: its earlier run's attempts end with it
    assert new.epoch == old.epoch + 1
    assert agentkit.tick(db, agent=old).fenced
    assert not agentkit.finish(db, aid, AttemptState.SUCCEEDED, 5, agent=old)
    with db.read() as s:
        attempt = s.get(Attempt, aid)
        assert attempt.state == "lost" and "restarted" in (attempt.end_reason or "")
        assert s.get(Job, job_id).state == "queued"


def test_replayed_tick_bills_once(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    job_id = submit(db, tenant)
    assert loop.lead() and loop.schedule_pass() == 1
    with db.read() as s:
        aid = s.execute(select(Attempt.id).where(Attempt.job_id == job_id)).scalar_one()
    agentkit.take(db, aid)
    for _ in range(3):  # the same tick written three times (a retried tick whose commit went through)
        agentkit.bill(db, aid, 1, 5)
    with db.read() as s:
        assert s.get(Tenant, tenant).used_ipu_ms == 4 * 5000
        assert s.execute(select(func.count()).select_from(MeterEvent)).scalar_one() == 1


def test_a_lapsed_agent_loses_its_attempts_which_are_refunded_and_requeued(
    db: Any, tenant: str, loop: SchedulerLoop
) -> None:
    from datetime import timedelta

    from scheduler.models import utcnow

    job_id = submit(db, tenant)
    assert loop.lead() and loop.schedule_pass() == 1
    with db.read() as s:
        aid = s.execute(select(Attempt.id).where(Attempt.job_id == job_id)).scalar_one()
    agent = agentkit.lease(db)
    agentkit.take(db, aid, agent=agent)
    agentkit.bill(db, aid, 1, 5, agent=agent)
    with db.read() as s:
        reserved_while_running = s.get(Tenant, tenant).reserved_ipu_ms
    with db.write() as s:
        lapses = attempts.lapse_agents(session=s, now=utcnow() + timedelta(seconds=120), max_attempts=3)
    assert [[a.id for a in lapse.ended] for lapse in lapses] == [[aid]]
    with db.read() as s:
        job = s.get(Job, job_id)
        t = s.get(Tenant, tenant)
        assert job.state == "queued" and job.attempts == 1
        assert t.used_ipu_ms == 0, "a platform fault is never billed"
        assert t.reserved_ipu_ms == reserved_while_running + 4 * 5000
        settle = s.get(MeterEvent, f"att:{aid}:settle")
        assert settle.ipu_ms == -4 * 5000 and settle.outcome == "lost"
    assert agentkit.tick(db, agent=agent).fenced, "a lapsed agent can change nothing"
    # The job runs again on a new attempt and partition.
    assert loop.schedule_pass() == 1


def test_a_running_attempt_no_live_agent_holds_is_ended_by_the_reconciler(
    db: Any, tenant: str, loop: SchedulerLoop
) -> None:
    job_id = submit(db, tenant)
    assert loop.lead() and loop.schedule_pass() == 1
    with db.read() as s:
        aid = s.execute(select(Attempt.id).where(Attempt.job_id == job_id)).scalar_one()
    agent = agentkit.lease(db)
    agentkit.take(db, aid, agent=agent)
    with db.write() as s:  # it stopped without handing back what it ran
        agents.release(session=s, lease=agent)
    with db.write() as s:
        repairs = reconciler.reconcile(session=s, leader_epoch=1, max_attempts=3, outbox_retry_s=15)
    assert repairs.count(reconciler.LEASE_EXPIRED) == 1
    with db.read() as s:
        assert s.get(Attempt, aid).state == "lost"
        assert s.get(Job, job_id).state == "queued"


def test_cancel_before_start_frees_everything(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    queued = submit(db, tenant)
    placed = submit(db, tenant)
    with db.write() as s:
        jobs.request_cancel(session=s, job_id=queued, scope=OneTenant(tenant))
    assert loop.lead() and loop.schedule_pass() == 1
    with db.write() as s:
        jobs.request_cancel(session=s, job_id=placed, scope=OneTenant(tenant))
    with db.read() as s:
        assert s.get(Job, queued).state == "cancelled"
        assert s.get(Job, placed).state == "cancelled"
        assert s.get(Tenant, tenant).reserved_ipu_ms == 0
        assert s.execute(select(func.count()).select_from(IpuAssignment)).scalar_one() == 0


def test_another_tenants_job_is_not_found(db: Any, tenant: str) -> None:
    from scheduler.errors import NotFound

    job_id = submit(db, tenant)
    with db.write() as s:
        other = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name="other", plan="standard"
        )
    with db.read() as s, pytest.raises(NotFound):
        jobs.get_job(session=s, job_id=job_id, scope=OneTenant(other.tenant.id))


def test_only_the_leader_schedules(db: Any, tenant: str) -> None:
    settings = get_settings()
    a = SchedulerLoop(settings=settings, db=db, celery=FakeCelery(), holder="a")  # type: ignore[arg-type]
    b = SchedulerLoop(settings=settings, db=db, celery=FakeCelery(), holder="b")  # type: ignore[arg-type]
    assert a.lead() and not b.lead()
    submit(db, tenant)
    with pytest.raises(leader.NotLeader), db.write() as s:
        leader.fence(session=s, fence=leader.Fence("scheduler", "b", 1), ttl_s=5)
    assert a.schedule_pass() == 1


def test_a_cancel_that_commits_during_a_pass_is_not_placed(
    db: Any, tenant: str, loop: SchedulerLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass decides on a snapshot; a cancel committed after it must win over the placement."""
    if db.sqlite:
        pytest.skip("SQLite serialises writers: no cancel can commit while a pass holds the write lock")
    import scheduler.loop as loop_module

    job_id = submit(db, tenant)
    real_decide = loop_module.decide

    def decide_then_cancel(*args: Any, **kwargs: Any) -> Any:
        decision = real_decide(*args, **kwargs)
        with db.write() as s:  # another connection: the user's cancel, committed mid-pass
            jobs.request_cancel(session=s, job_id=job_id, scope=OneTenant(tenant))
        return decision

    monkeypatch.setattr(loop_module, "decide", decide_then_cancel)
    assert loop.lead()
    assert loop.schedule_pass() == 0
    with db.read() as s:
        assert s.get(Job, job_id).state == "cancelled"
        assert s.execute(select(func.count()).select_from(Attempt)).scalar_one() == 0
        assert s.execute(select(func.count()).select_from(IpuAssignment)).scalar_one() == 0
    monkeypatch.setattr(loop_module, "decide", real_decide)
    assert loop.sync is not None and loop.sync.allocator is not None
    assert loop.sync.allocator.partitions() == {}, "the dropped placement is released in memory too"
