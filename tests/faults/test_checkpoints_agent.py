"""Checkpoints and preemption warnings in the real host agent (workers/agent.py), driven turn by turn
on a clock of the test's own against the real test database (as tests/faults/test_agent.py does):
what is written, what a new attempt resumes from, and what the tenant is billed.

The same guarantees on real processes (a SIGKILLed agent, a preemption by the scheduler process)
are in tests/faults/test_checkpoints.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.billing import charged_ipu_ms
from scheduler.models import Attempt, AttemptState, Checkpoint, Job, MeterEvent, Plan, Tenant, utcnow
from scheduler.services.batch import checkpoints
from scheduler.settings import get_settings, reset_settings_cache
from tests.faults.harness import agent as harness_agent
from tests.faults.harness import leader_loop, make_tenant, place, submit
from tests.faults.harness import take as harness_take
from tests.faults.test_agent import FakeClock, make_agent, run_for, take


@pytest.fixture
def tenant(db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    # 100 cluster seconds per (fake) wall second; the lease is long: only a new incarnation ends it.
    monkeypatch.setenv("IPUCLOUD_TIME_SCALE", "100")
    monkeypatch.setenv("IPUCLOUD_HEARTBEAT_S", "1")
    monkeypatch.setenv("IPUCLOUD_LEASE_S", "60")
    monkeypatch.setenv("IPUCLOUD_METER_INTERVAL_S", "1")
    monkeypatch.setenv("IPUCLOUD_AGENT_SYNC_S", "600")
    reset_settings_cache()
    return make_tenant(db)


def checkpoints_of(db: Any, job_id: str) -> list[Checkpoint]:
    with db.read() as s:
        return list(
            s.execute(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.id)).scalars()
        )


def attempts_of(db: Any, job_id: str) -> list[Attempt]:
    with db.read() as s:
        return list(
            s.execute(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)).scalars()
        )


def billed(db: Any, job_id: str) -> int:
    with db.read() as s:
        return sum(s.execute(select(MeterEvent.ipu_ms).where(MeterEvent.job_id == job_id)).scalars())


def test_a_crashed_agents_attempt_resumes_from_its_last_checkpoint_and_is_billed_once(
    db: Any, tenant: str
) -> None:
    loop = leader_loop(db)
    # ResNet-50 on 4 IPUs: some 650 cluster seconds of compile and load, then 0.012 s a step.
    job_id = submit(db, tenant, steps=200_000, checkpoint_every_s=60)
    first = place(db, loop, job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [first.id])
    run_for(agent, clock, 10.6)  # to 1,060 cluster seconds: checkpoints about every 60 once it runs
    saved = checkpoints_of(db, job_id)
    # One every 60 cluster seconds once it runs, of which a tick (100 cluster seconds here) writes
    # the latest: at most a row per attempt per tick.
    assert len(saved) >= 3, "checkpoints written by the ticks"
    steps = [c.step for c in saved]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    last = saved[-1]
    assert last.reason == "periodic" and last.executable_key and last.steps == 200_000
    # The agent dies (nothing more is written); its host's next agent registers and ends what it held.
    make_agent(db, clock, name="agent-under-test")
    lost = attempts_of(db, job_id)[0]
    assert lost.state == AttemptState.LOST and lost.cluster_s > last.cluster_s
    # The work up to the checkpoint is kept and billed; what ran after it is refunded.
    assert billed(db, job_id) == charged_ipu_ms(lost.size, last.cluster_s, lost.rate)

    second = place(db, loop, job_id)
    agent2 = make_agent(db, clock, name="agent-2")
    take(agent2, [second.id])
    resumed = attempts_of(db, job_id)[1]
    assert resumed.timeline is not None and resumed.timeline["first_step"] == last.step
    assert resumed.unbilled_s > 0, "restoring the checkpoint (load) is not the tenant's"
    run_for(agent2, clock, 2)
    with db.read() as s:
        progress = checkpoints.latest_by_job(session=s, job_ids=[job_id])[job_id]
    assert progress.step > last.step and progress.attempt == 2, "progress continues from the checkpoint"
    run_for(agent2, clock, 600)
    done = attempts_of(db, job_id)
    assert [a.state for a in done] == [AttemptState.LOST, AttemptState.SUCCEEDED]
    with db.read() as s:
        assert s.get(Job, job_id).state == "succeeded"
        used = s.get(Tenant, tenant).used_ipu_ms
    # Every step billed once: the kept part of attempt 1 (its compile and load, steps 1..k) and steps
    # k+1..N of attempt 2, which is what a run without the fault costs (to rounding, a ms per record).
    run = done[0].timeline
    assert run is not None
    clean = charged_ipu_ms(lost.size, run["compile_s"] + run["load_s"] + 200_000 * run["step_s"], lost.rate)
    assert abs(billed(db, job_id) - clean) <= 3
    assert used == billed(db, job_id), "the ledger equals the counter"


def test_a_warned_attempt_checkpoints_ends_itself_and_loses_at_most_the_warning(db: Any, tenant: str) -> None:
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=200_000, checkpoint_every_s=600, preemptible=True)
    attempt = place(db, loop, job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [attempt.id])
    run_for(agent, clock, 8)  # 800 cluster seconds, running: no periodic checkpoint yet
    assert checkpoints_of(db, job_id) == []
    window = get_settings().preemption_warning_s
    agent._preempt_notices.append((attempt.id, window, ""))  # as the bus delivers it (no reason)
    warned_at = agent._cluster_t(agent.running[attempt.id], clock.now)
    run_for(agent, clock, 2)
    (saved,) = checkpoints_of(db, job_id)
    ended = attempts_of(db, job_id)[0]
    assert saved.reason == "preemption" and ended.state == AttemptState.PREEMPTED
    assert warned_at <= ended.cluster_s <= warned_at + window
    lost_s = ended.cluster_s - saved.cluster_s
    assert 0 <= lost_s <= window, "it loses at most the work since the warning"
    with db.read() as s:
        assert s.get(Job, job_id).state == "queued", "it requeued by itself"
    # Billed for the work it keeps, at the preemptible (discounted) rate.
    assert ended.rate < 1.0
    assert billed(db, job_id) == charged_ipu_ms(ended.size, saved.cluster_s, ended.rate)


def test_pruning_keeps_what_is_read_and_drops_a_finished_jobs_past_its_retention(
    db: Any, tenant: str
) -> None:
    loop = leader_loop(db)
    ids = [submit(db, tenant, name=f"long-{n}", steps=1_000_000) for n in range(2)]

    def note(a: Attempt, steps: range) -> None:
        with db.write() as s:
            checkpoints.record(
                session=s,
                items=[
                    checkpoints.CheckpointDue(
                        attempt_id=a.id,
                        job_id=a.job_id,
                        attempt=a.number,
                        step=100 * n,
                        steps=1_000_000,
                        samples=6400 * n,
                        executable_key="k",
                        machine_type="m2000",
                        cluster_s=60.0 * n,
                        run_s=60.0 * n,
                        reason="periodic",
                    )
                    for n in steps
                ],
            )

    # The first job's first attempt notes 3 checkpoints and is lost with its agent (a new incarnation
    # of the host registers); its second attempt notes many more.
    lost = place(db, loop, ids[0])
    note(lost, range(1, 4))
    harness_take(db, lost, worker="host-a")
    harness_agent(db, "host-a")
    assert attempts_of(db, ids[0])[0].state == AttemptState.LOST
    many = checkpoints.KEPT + 15
    attempts = [place(db, loop, job_id) for job_id in ids]
    for a in attempts:
        note(a, range(4, 4 + many))
    with db.read() as s:
        last = checkpoints.latest_by_job(session=s, job_ids=ids)
        kept = checkpoints.kept_by_attempt(session=s, attempt_ids=[lost.id] + [a.id for a in attempts])

    pruned = loop.prune_checkpoints()
    # The first job: 3 + 35 noted, its newest 20 and the lost attempt's last kept.
    assert pruned.thinned == (3 + many - checkpoints.KEPT - 1) + (many - checkpoints.KEPT)
    assert pruned.expired == 0
    first, second = (checkpoints_of(db, job_id) for job_id in ids)
    assert [c.step for c in first] == [300] + [100 * n for n in range(4 + many - checkpoints.KEPT, 4 + many)]
    assert len(second) == checkpoints.KEPT and second[-1].step == 100 * (3 + many)
    with db.read() as s:
        # Everything read after pruning reads as before: the checkpoint to resume from, the work
        # kept by each attempt and the listed newest ones.
        assert {j: c.id for j, c in checkpoints.latest_by_job(session=s, job_ids=ids).items()} == {
            j: c.id for j, c in last.items()
        }
        assert (
            checkpoints.kept_by_attempt(session=s, attempt_ids=[lost.id] + [a.id for a in attempts]) == kept
        )
        listed, total = checkpoints.list_for_job(session=s, job_id=ids[1])
        assert total == checkpoints.KEPT and listed[0].step == 100 * (3 + many)
    assert loop.prune_checkpoints().total == 0  # nothing more to do

    # Both jobs stop by their time limit; one stopped within its plan's retention, one long before.
    with db.write() as s:
        retention = (
            s.execute(select(Plan.checkpoint_retention_s).join(Tenant, Tenant.plan_name == Plan.name))
            .scalars()
            .first()
        )
        for job_id, ago in zip(ids, (60, retention + 2 * 3600), strict=True):
            job = s.get(Job, job_id)
            job.state = "failed"
            job.finished_at = utcnow() - timedelta(seconds=ago)
    pruned = loop.prune_checkpoints()
    assert pruned.expired == checkpoints.KEPT and pruned.thinned == 0
    assert len(checkpoints_of(db, ids[0])) == checkpoints.KEPT + 1  # still resumable: kept
    assert checkpoints_of(db, ids[1]) == []
