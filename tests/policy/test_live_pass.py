"""The live scheduling pass on the test database: why a job waits (stored once, shown by the API),
quota checked again at every pass, fair-share samples, and preemption when it is switched on."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from scheduler import loop as loop_module
from scheduler.clock import UNSCALED
from scheduler.jobspec import JobSpec
from scheduler.loop import SchedulerLoop
from scheduler.models import LIVE_ATTEMPT_STATES, Attempt, AttemptState, Job, MeterEvent, Tenant, utcnow
from scheduler.policy import RunningJob, get_policy
from scheduler.policy.las import job_class, plan_of
from scheduler.policy.model import tenant_key
from scheduler.services.batch import checkpoints, jobs, scheduling
from scheduler.services.tenancy import tenants
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings, reset_settings_cache
from tests.scheduler.test_lifecycle import FakeCelery
from tests.support import agentkit
from vipu import emulator


def spec(ipus: int, steps: int = 100, **extra: Any) -> JobSpec:
    workload = {"model": "resnet50", "task": "train", "batch_size": 1024, "steps": steps}
    return JobSpec.model_validate({"name": f"j{ipus}", "workload": workload, "ipus": ipus, **extra})


def new_tenant(db: Any, name: str, **kw: Any) -> tuple[str, str]:
    with db.write() as s:
        made = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name=name, plan="standard", **kw
        )
        return made.tenant.id, made.api_key


def submit(db: Any, tenant: str, job_spec: JobSpec) -> str:
    with db.write() as s:
        return jobs.submit_job(session=s, tenant_id=tenant, spec=job_spec).job.id


def scheduler(db: Any) -> SchedulerLoop:
    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    assert loop.lead()
    return loop


def test_a_waiting_job_says_why_through_the_api_and_is_written_only_when_that_changes(
    db: Any, seeded: Any, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=1_000)
    first = submit(db, tenant, spec(128))
    big = submit(db, tenant, spec(128))
    small = submit(db, tenant, spec(4, steps=100_000))  # would outlast the first job: must not start
    written: list[int] = []
    real = scheduling.record_waits

    def counting(**kw: Any) -> int:
        written.append(real(**kw))
        return written[-1]

    monkeypatch.setattr(scheduling, "record_waits", counting)
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    assert loop.schedule_pass() == 0
    assert written == [2, 0]  # the second pass explains the same: nothing written
    headers = {"Authorization": f"Bearer {key}"}
    body = client.get(f"/api/v1/jobs/{big}", headers=headers).json()
    assert body["state"] == "queued"
    assert body["wait"]["reason"] == "reserved" and body["wait"]["estimated_start"] is not None
    assert "128 IPUs are reserved" in body["wait"]["detail"]
    behind = client.get(f"/api/v1/jobs/{small}", headers=headers).json()["wait"]
    assert behind["reason"] in ("behind", "no-room") and behind["behind"] == [big]
    assert client.get(f"/api/v1/jobs/{first}", headers=headers).json()["wait"]["reason"] == "starting"


def test_quota_is_checked_again_at_every_pass(db: Any, seeded: Any) -> None:
    tenant, _ = new_tenant(db, "thrifty", quota_ipu_hours=10)
    job_id = submit(db, tenant, spec(4))
    with db.write() as s:  # an admin cuts the grant after the job was accepted
        s.execute(update(Tenant).where(Tenant.id == tenant).values(quota_ipu_ms=1))
    assert scheduler(db).schedule_pass() == 0
    with db.read() as s:
        wait = s.get(Job, job_id).wait
    assert wait["reason"] == "quota" and "IPU-hours" in wait["detail"]


def test_fair_share_usage_is_sampled_from_what_was_metered(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant, _ = new_tenant(db, "busy")
    job_id = submit(db, tenant, spec(4))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == job_id)).scalar_one()
    assert agentkit.take(db, attempt.id) is not None
    agentkit.bill(db, attempt.id, 1, 30)
    submit(db, tenant, spec(1))
    loop.schedule_pass()
    with db.read() as s:
        row = s.get(Tenant, tenant)
        first_sample = row.fairshare_sampled_at
        # Sampled by the first pass; the second came within FAIRSHARE_SAMPLE_S and wrote nothing.
        assert first_sample is not None and row.fairshare_used_ipu_ms == 0 and row.used_ipu_ms == 4 * 30_000
    later = first_sample + timedelta(seconds=scheduling.FAIRSHARE_SAMPLE_S + 1)
    monkeypatch.setattr(loop_module, "db_now", lambda session: later)
    submit(db, tenant, spec(2))
    loop.schedule_pass()
    with db.read() as s:
        row = s.get(Tenant, tenant)
        assert row.fairshare_sampled_at == later
        assert row.fairshare_used_ipu_ms == 4 * 30_000
        # 120 IPU-seconds, decayed over half a minute of a 7-day half-life: a hair less.
        assert row.fairshare_usage_ipu_s == pytest.approx(120.0, rel=1e-4)
        assert row.fairshare_usage_ipu_s < 120.0


def test_preemption_stops_lower_priority_work_only_when_switched_on(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant, _ = new_tenant(db, "mixed")  # the standard plan: priority 2
    with db.write() as s:
        internal = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name="ops", plan="internal"
        ).tenant.id  # priority 3
    low = submit(db, tenant, spec(128))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == low)).scalar_one()
    agentkit.take(db, attempt.id)
    agentkit.bill(db, attempt.id, 1, 20)
    urgent = submit(db, internal, spec(64))
    # A job's own priority ranks its tenant's jobs only: it never preempts, not even its own.
    own = submit(db, tenant, spec(64, priority=100))
    assert loop.schedule_pass() == 0  # off by default: the urgent job waits for its reservation
    with db.read() as s:
        assert s.get(Attempt, attempt.id).state == AttemptState.RUNNING

    monkeypatch.setenv("IPUCLOUD_PREEMPTION", "true")
    reset_settings_cache()
    on = scheduler(db)
    with db.write() as s:
        jobs.request_cancel(session=s, job_id=own, scope=OneTenant(tenant))
    assert on.schedule_pass() == 0  # this pass warns the lower plan's attempt...
    with db.read() as s:
        warned = s.get(Attempt, attempt.id)
        assert warned.state == AttemptState.RUNNING and warned.preempt_deadline is not None
        assert s.get(Job, urgent).wait["reason"] == "preempting"
        # The forecast is told when the warned attempt stops (it frees its IPUs then, not at its
        # predicted end).
        snap = scheduling.build_snapshot(
            session=s,
            allocator=on.sync.refresh(s),  # type: ignore[union-attr]
            now=utcnow(),
            clock=UNSCALED,
            half_life_s=3600.0,
        ).snapshot
        assert snap.stopping == {low: warned.preempt_deadline.timestamp()}
    assert on.schedule_pass() == 0  # ...which keeps its IPUs while it checkpoints...
    with db.read() as s:
        assert s.get(Attempt, attempt.id).state == AttemptState.RUNNING
    with db.write() as s:  # ...but its agent never ends it: the warning runs out
        s.execute(
            update(Attempt)
            .where(Attempt.id == attempt.id)
            .values(preempt_deadline=warned.preempt_deadline - timedelta(hours=1))
        )
    assert on.schedule_pass() == 0  # the pass stops it...
    with db.read() as s:
        stopped = s.get(Attempt, attempt.id)
        assert stopped.state == AttemptState.PREEMPTED
        # Its owner is told why, not whose job it made room for.
        assert (stopped.end_reason or "").startswith("preempted for a higher-priority job of another tenant")
        assert urgent not in (stopped.end_reason or "")
        assert s.get(Job, low).state == "queued"  # ...which goes back to the queue...
        assert s.get(Job, urgent).wait["reason"] == "preempting"
        # ...and is not billed: its tick is refunded by the settle.
        assert sum(e.ipu_ms for e in s.execute(select(MeterEvent)).scalars()) == 0
        assert s.get(Tenant, tenant).used_ipu_ms == 0
    assert on.schedule_pass() == 1  # the next pass starts the urgent job
    with db.read() as s:
        assert (
            s.execute(select(Attempt.job_id).where(Attempt.state == AttemptState.PLACED)).scalar_one()
            == urgent
        )


def test_a_jobs_own_priority_orders_its_tenants_jobs_only_and_the_plan_ranks_tenants(
    db: Any, seeded: Any, client: Any
) -> None:
    """Issue: a heavy tenant's priority-100 jobs ran before a lighter tenant's earlier ones. Fair share
    ranks tenants; a job's priority orders its own tenant's jobs; only the plan (an admin's) ranks
    tenants above others, and a plan edit reaches jobs already queued."""
    heavy, heavy_key = new_tenant(db, "heavy")
    light, _ = new_tenant(db, "light")
    with db.write() as s:  # heavy has used a lot lately
        s.execute(update(Tenant).where(Tenant.id == heavy).values(fairshare_usage_ipu_s=10_000_000.0))
    # The whole fleet (128 IPUs) per job: one pass starts one job.
    old_zero = submit(db, heavy, spec(128))
    light_job = submit(db, light, spec(128))
    pushed = submit(db, heavy, spec(128, priority=100))
    loop = scheduler(db)

    def next_started() -> str:
        assert loop.schedule_pass() == 1
        with db.read() as s:
            attempt = s.execute(select(Attempt).where(Attempt.state == AttemptState.PLACED)).scalar_one()
        agentkit.take(db, attempt.id)
        assert agentkit.finish(db, attempt.id, AttemptState.SUCCEEDED, 1.0)
        return attempt.job_id

    assert next_started() == light_job  # fair share first, whatever the heavy tenant's priority says
    assert next_started() == pushed  # then the heavy tenant's jobs, in its own order
    assert next_started() == old_zero
    # The job keeps the priority its owner gave; the API shows it.
    shown = client.get(f"/api/v1/jobs/{pushed}", headers={"Authorization": f"Bearer {heavy_key}"}).json()
    assert shown["priority"] == 100

    # The plan ranks tenants: an admin raises the heavy tenant's plan, and its queued job goes first.
    first = submit(db, heavy, spec(128))
    second = submit(db, light, spec(128))
    with db.write() as s:
        s.execute(update(Tenant).where(Tenant.id == heavy).values(plan_name="internal"))
    assert next_started() == first
    assert next_started() == second


@pytest.mark.parametrize("opt_out", ["job", "plan"])
def test_an_opted_out_job_is_never_preempted_even_for_a_higher_plan(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch, opt_out: str
) -> None:
    monkeypatch.setenv("IPUCLOUD_PREEMPTION", "true")
    reset_settings_cache()
    tenant, _ = new_tenant(db, "steady")  # standard: priority 2
    with db.write() as s:
        internal = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name="ops", plan="internal"
        ).tenant.id  # priority 3
        if opt_out == "plan":
            tenants.update_plan(session=s, name="standard", changes={"never_preempt": True})
    low = submit(db, tenant, spec(128, never_preempt=opt_out == "job"))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == low)).scalar_one()
    agentkit.take(db, attempt.id)
    urgent = submit(db, internal, spec(64))
    for _ in range(2):
        assert loop.schedule_pass() == 0
    with db.read() as s:
        held = s.get(Attempt, attempt.id)
        assert held.state == AttemptState.RUNNING and held.preempt_deadline is None, "never warned"
        assert s.get(Job, urgent).wait["reason"] != "preempting"
        # Charged as without the opt-out: the plan's rate.
        assert held.rate == 1.0


def test_a_preempted_job_requeues_at_the_head_of_its_tenants_work_and_is_told_for_which_own_job(
    db: Any, seeded: Any
) -> None:
    tenant, _ = new_tenant(db, "mixed")
    spot = submit(db, tenant, spec(128, preemptible=True))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == spot)).scalar_one()
    agentkit.take(db, attempt.id)
    urgent = submit(db, tenant, spec(64))  # the same tenant's non-preemptible job preempts it
    assert loop.schedule_pass() == 0
    with db.read() as s:
        assert s.get(Attempt, attempt.id).preempt_deadline is not None  # warned...
    with db.write() as s:  # ...and its agent never ends it: the warning runs out
        s.execute(
            update(Attempt)
            .where(Attempt.id == attempt.id)
            .values(preempt_deadline=s.get(Attempt, attempt.id).preempt_deadline - timedelta(hours=1))
        )
    loop.schedule_pass()
    with db.read() as s:
        stopped = s.get(Attempt, attempt.id)
        assert stopped.state == AttemptState.PREEMPTED
        # Its own tenant's job is named.
        assert (stopped.end_reason or "").startswith(f"preempted for your job {urgent}")
    later = submit(db, tenant, spec(128, priority=100, preemptible=True))
    with db.read() as s:
        snap = scheduling.build_snapshot(
            session=s,
            allocator=loop.sync.refresh(s),  # type: ignore[union-attr]
            now=utcnow(),
            clock=UNSCALED,
            half_life_s=3600.0,
        ).snapshot
    mine = sorted((q for q in snap.queue if q.tenant_id == tenant), key=tenant_key)
    assert [q.id for q in mine][:2] == [spot, later], "ahead of every priority its owner may give"


def test_a_job_cannot_be_both_preemptible_and_opted_out() -> None:
    with pytest.raises(ValueError, match="not both"):
        spec(4, preemptible=True, never_preempt=True)


def classes_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPUCLOUD_SCHEDULER_POLICY", "default-classes")
    reset_settings_cache()


def live_attempt(db: Any, job_id: str) -> Attempt:
    with db.read() as s:
        return s.execute(
            select(Attempt).where(Attempt.job_id == job_id, Attempt.state.in_(LIVE_ATTEMPT_STATES))
        ).scalar_one()


def ran_for(db: Any, attempt_id: int, seconds: float) -> None:
    """As if the attempt had been placed and taken `seconds` ago."""
    with db.write() as s:
        row = s.get(Attempt, attempt_id)
        back = timedelta(seconds=seconds)
        row.placed_at, row.started_at = row.placed_at - back, row.started_at - back


def running_as_seen(db: Any, loop: SchedulerLoop, job_id: str) -> RunningJob:
    with db.read() as s:
        snap = scheduling.build_snapshot(
            session=s,
            allocator=loop.sync.refresh(s),  # type: ignore[union-attr]
            now=utcnow(),
            clock=UNSCALED,
            half_life_s=3600.0,
            policy=loop._policy,
        ).snapshot
    return next(r for r in snap.running if r.id == job_id)


def test_a_job_preempted_as_often_as_the_policy_allows_is_not_a_victim_again_live(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#31: the live snapshot counts a job's earlier preemptions and times its minimum run from its
    current attempt's start, so `default-classes`' guards hold live as in the simulator."""
    classes_policy(monkeypatch)
    cap = get_policy("default-classes").preempt_max
    min_run_s = get_policy("default-classes").preempt_min_run_s
    assert cap is not None and min_run_s > 0
    holder, _ = new_tenant(db, "holder")  # both on the standard plan: the guards apply
    other, _ = new_tenant(db, "other")
    long_job = submit(db, holder, spec(128, steps=2_000_000))  # the whole fleet, for days
    loop = scheduler(db)
    assert loop._policy.name == "default-classes"
    assert loop.schedule_pass() == 1
    for n in range(cap + 1):
        attempt = live_attempt(db, long_job)
        agentkit.take(db, attempt.id)
        short = submit(db, other, spec(64))  # a short job: a higher service class
        if n > 0:
            # Resumed just now: its minimum run counts from this attempt's start, not the job's.
            assert loop.schedule_pass() == 0
            assert live_attempt(db, long_job).preempt_deadline is None, "within its minimum run"
        ran_for(db, attempt.id, min_run_s + 60)
        seen = running_as_seen(db, loop, long_job)
        assert seen.preemptions == n
        assert loop.schedule_pass() == 0
        with db.read() as s:
            warned = s.get(Attempt, attempt.id).preempt_deadline is not None
            wait = s.get(Job, short).wait
        if n == cap:
            assert not warned, f"preempted {cap} times already: not a victim again"
            assert wait["reason"] != "preempting"
            break
        assert warned and wait["reason"] == "preempting", (n, wait)
        # Its agent checkpoints it and ends it as preempted; the short job starts, ends, and the
        # long one resumes (a short job of one tenant ahead of a long job's requeue).
        assert agentkit.finish(db, attempt.id, AttemptState.PREEMPTED, 1.0, "preempted (test); requeued")
        assert loop.schedule_pass() == 1
        placed = live_attempt(db, short)
        agentkit.take(db, placed.id)
        assert agentkit.finish(db, placed.id, AttemptState.SUCCEEDED, 1.0)
        assert loop.schedule_pass() == 1
    with db.read() as s:
        states = [
            a.state
            for a in s.execute(
                select(Attempt).where(Attempt.job_id == long_job).order_by(Attempt.id)
            ).scalars()
        ]
    assert states == [AttemptState.PREEMPTED] * cap + [AttemptState.RUNNING]


@pytest.mark.parametrize("policy", ["default", "default-classes"])
def test_the_setting_chooses_the_live_policy_and_default_classes_puts_short_work_first(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    if policy != "default":
        classes_policy(monkeypatch)
    first, _ = new_tenant(db, "first")
    second, _ = new_tenant(db, "second")
    long_job = submit(db, first, spec(128, steps=2_000_000))
    short_job = submit(db, second, spec(128))  # later, and both tenants have used nothing
    loop = scheduler(db)
    assert loop._policy.name == policy
    assert loop.schedule_pass() == 1
    started = live_attempt(db, long_job if policy == "default" else short_job)
    # `default`: fair share, then age. `default-classes`: the service class (predicted remaining
    # IPU-seconds) ranks within a plan before fair share does.
    assert started.state == AttemptState.PLACED


def test_an_unknown_live_policy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPUCLOUD_SCHEDULER_POLICY", "tiresias")  # simulator only
    reset_settings_cache()
    with pytest.raises(ValueError, match="scheduler_policy"):
        get_settings()


def test_a_victim_of_a_shorter_job_of_its_own_plan_is_told_so_not_higher_priority() -> None:
    from scheduler.policy.las import combined

    classes, plain = get_policy("default-classes"), get_policy("default")
    same_plan = RunningJob("job_long", "ten_a", 64, "p1", 0.0, 1e9, combined(2, -30))
    lower_plan = RunningJob("job_low", "ten_a", 64, "p2", 0.0, 1e9, combined(1, -5))
    waiting = combined(2, -10)
    assert scheduling.by_service_class(classes, [same_plan, lower_plan], waiting) == {"job_long"}
    # Under `default` a class is the plan priority itself: every victim is of a lower plan.
    assert scheduling.by_service_class(plain, [replace(same_plan, priority=2)], 3) == set()
    why = scheduling.preemption_reason(same_plan, for_job="job_secret", for_tenant="ten_b", by_class=True)
    assert why == "preempted for shorter work of another tenant"
    why = scheduling.preemption_reason(lower_plan, for_job="job_secret", for_tenant="ten_b")
    assert why == "preempted for a higher-priority job of another tenant"


def test_a_requeued_preempted_job_is_predicted_to_run_only_what_its_checkpoint_did_not_keep(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#31: a job preempted after a checkpoint that kept 90% of its predicted run is queued, ranked
    and, once resumed, timed on the 10% left (scheduler.policy.preemption.resumed_runtime_s, which the
    simulator's requeue calls too), not on its whole prediction."""
    classes_policy(monkeypatch)
    tenant, _ = new_tenant(db, "resumer")
    job_id = submit(db, tenant, spec(128, steps=2_000_000))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    attempt = live_attempt(db, job_id)
    agentkit.take(db, attempt.id)
    with db.read() as s:
        whole = s.get(Job, job_id).predicted_runtime_s
    kept = 0.9 * whole
    saved = checkpoints.CheckpointDue(
        attempt_id=attempt.id, job_id=job_id, attempt=1, step=1_800_000, steps=2_000_000,
        samples=1_800_000 * 1024, executable_key="x", machine_type="m2000", cluster_s=kept, run_s=kept,
        reason="preemption",
    )  # fmt: skip
    agentkit.tick(db, saved=[saved])
    assert agentkit.finish(db, attempt.id, AttemptState.PREEMPTED, kept, "preempted (test); requeued")
    with db.read() as s:
        snap = scheduling.build_snapshot(
            session=s,
            allocator=loop.sync.refresh(s),  # type: ignore[union-attr]
            now=utcnow(),
            clock=UNSCALED,
            half_life_s=3600.0,
            policy=loop._policy,
        ).snapshot
    (queued,) = [q for q in snap.queue if q.id == job_id]
    left = whole - kept
    assert queued.predicted_runtime_s == pytest.approx(left)
    # Its service class is that of what it has left, a few doublings above its whole prediction's.
    plan_priority = plan_of(queued.priority)
    assert queued.priority == job_class(loop._policy, plan_priority, 128, left)  # promotion: days away
    assert queued.priority > job_class(loop._policy, plan_priority, 128, whole)
    # Resumed from that checkpoint, its predicted end is what was left after its start.
    assert loop.schedule_pass() == 1
    agentkit.take(db, live_attempt(db, job_id).id)
    resumed = running_as_seen(db, loop, job_id)
    assert resumed.expected_end - resumed.started_at == pytest.approx(left)


def test_with_preemptible_work_queued_the_snapshot_carries_the_recent_non_preemptible_submissions(
    db: Any, seeded: Any
) -> None:
    """What a preemptible job's forecast expects again (Snapshot.recent, scheduler.policy.forecast):
    the non-preemptible jobs submitted within the policy's window, in the class they were queued
    in; none read while no preemptible work is queued, nor with the window 0."""
    tenant, _ = new_tenant(db, "inflow")
    plain = submit(db, tenant, spec(4))
    policy = get_policy("default-classes")
    loop = scheduler(db)

    def recent(config: Any) -> list[Any]:
        with db.read() as s:
            return list(
                scheduling.build_snapshot(
                    session=s,
                    allocator=loop.sync.refresh(s),  # type: ignore[union-attr]
                    now=utcnow(),
                    clock=UNSCALED,
                    half_life_s=3600.0,
                    policy=config,
                ).snapshot.recent
            )

    assert recent(policy) == []
    spot = submit(db, tenant, spec(4, preemptible=True))
    [seen] = recent(policy)
    assert seen.id == plain and seen.id != spot and not seen.preemptible
    with db.read() as s:
        job = s.get(Job, plain)
        assert seen.priority == job_class(policy, plan_of(seen.priority), 4, job.predicted_runtime_s)
    assert recent(policy.with_options(inflow_window_s=0.0)) == []


def test_a_running_jobs_measured_end_comes_from_its_reported_progress_once_it_has_timed_steps(
    db: Any, seeded: Any
) -> None:
    """#31: while it compiles a job is known only by its prediction; once it has timed its first
    steps the snapshot carries the end its progress tells (what the forecast frees it at), and the
    end the policy plans on stays its prediction."""
    tenant, _ = new_tenant(db, "measured")
    job_id = submit(db, tenant, spec(4, steps=20_000))
    loop = scheduler(db)
    assert loop.schedule_pass() == 1
    attempt = live_attempt(db, job_id)
    agentkit.take(db, attempt.id)
    early = running_as_seen(db, loop, job_id)
    assert math.isnan(early.measured_end), "compiling: nothing measured yet"
    with db.read() as s:
        row = s.get(Attempt, attempt.id)
        predicted, line = s.get(Job, job_id).predicted_runtime_s, emulator.Timeline.from_dict(row.timeline)
        scale = float(row.timeline["scale"])
    # Half its steps done.
    ran_for(db, attempt.id, (line.run_start_s + (line.steps // 2) * line.step_s) / scale)
    seen = running_as_seen(db, loop, job_id)
    assert seen.measured_end == pytest.approx(seen.started_at + line.total_s / scale, abs=1.0)
    assert seen.expected_end == pytest.approx(seen.started_at + predicted / scale, abs=1e-3)
