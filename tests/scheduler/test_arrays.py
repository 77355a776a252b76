"""Job arrays, sweeps and dependencies (scheduler/services/batch/arrays.py), on the real test database:
admission, the scheduler's throttle, cancel and retry, dependency chains, quota held and released."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from scheduler.errors import InvalidRequest, LimitExceeded, NotFound, QuotaExceeded
from scheduler.jobspec import JobSpec, compress_indices, parse_indices
from scheduler.loop import SchedulerLoop
from scheduler.models import Attempt, AttemptState, Job, JobArray, JobEvent, Tenant
from scheduler.services.batch import arrays, jobs
from scheduler.services.tenancy import tenants
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.scheduler.test_lifecycle import FakeCelery
from tests.support import agentkit

WORKLOAD = {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 10}


def spec(**over: Any) -> JobSpec:
    body: dict[str, Any] = {"name": "sweep", "workload": dict(WORKLOAD), "ipus": 4}
    body.update(over)
    return JobSpec.model_validate(body)


def make_tenant(db: Any, name: str = "acme", plan: str = "standard", hours: float = 100) -> str:
    with db.write() as s:
        return tenants.create_tenant(
            session=s, secret=get_settings().secret(), name=name, plan=plan, quota_ipu_hours=hours
        ).tenant.id


@pytest.fixture
def tenant(db: Any, seeded: Any) -> str:
    return make_tenant(db)


@pytest.fixture
def loop(db: Any, env: Any) -> SchedulerLoop:
    return SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]


def submit_array(db: Any, tenant: str, **over: Any) -> JobArray:
    with db.write() as s:
        return arrays.submit_array(session=s, tenant_id=tenant, spec=spec(**over)).array


def submit_job(db: Any, tenant: str, **over: Any) -> str:
    with db.write() as s:
        return jobs.submit_job(session=s, tenant_id=tenant, spec=spec(**over)).job.id


def elements(db: Any, array_id: str) -> list[Job]:
    with db.read() as s:
        return list(
            s.execute(select(Job).where(Job.array_id == array_id).order_by(Job.array_index)).scalars()
        )


def live_attempts(db: Any) -> list[Attempt]:
    with db.read() as s:
        return list(s.execute(select(Attempt).where(Attempt.state.in_(("placed", "running")))).scalars())


def run_placed(
    db: Any, loop: SchedulerLoop, outcome: AttemptState = AttemptState.SUCCEEDED, only: set[str] | None = None
) -> list[str]:
    """One scheduler iteration (dependencies, a pass, dispatch), then every placed attempt taken and
    finished with `outcome` (those of jobs in `only`, when given). Returns the jobs finished."""
    assert loop.lead()
    loop.resolve_dependencies()
    loop.schedule_pass()
    loop.dispatch()
    done = []
    for attempt in live_attempts(db):
        if only is not None and attempt.job_id not in only:
            continue
        assert agentkit.take(db, attempt.id) is not None
        assert agentkit.finish(db, attempt.id, outcome, 5.0)
        done.append(attempt.job_id)
    return done


def reserved(db: Any, tenant: str) -> int:
    with db.read() as s:
        return s.get(Tenant, tenant).reserved_ipu_ms


# ----------------------------------------------------------------------------------------- syntax


def test_slurm_index_syntax() -> None:
    assert parse_indices("0-9:3,20,5") == [0, 3, 5, 6, 9, 20]
    assert compress_indices([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"
    with pytest.raises(ValueError, match="more than"):
        parse_indices("0-999999", limit=100)  # refused before expanding
    with pytest.raises(ValueError, match="ends before"):
        parse_indices("9-3")
    for bad in ("", "1-", "a", "1--2", "0-5:0", "-1"):
        with pytest.raises(ValidationError):
            spec(array={"indices": bad})


def test_grid_of_batch_sizes_by_ipus_yields_each_point(db: Any, tenant: str) -> None:
    array = submit_array(
        db,
        tenant,
        sweep={
            "method": "grid",
            "parameters": {"workload.batch_size": {"values": [32, 64, 128]}, "ipus": {"values": [4, 8]}},
        },
    )
    assert array.size == 6
    got = [
        (e.array_index, e.params, e.spec["workload"]["batch_size"], e.ipus) for e in elements(db, array.id)
    ]
    assert got == [
        (0, {"workload.batch_size": 32, "ipus": 4}, 32, 4),
        (1, {"workload.batch_size": 32, "ipus": 8}, 32, 8),
        (2, {"workload.batch_size": 64, "ipus": 4}, 64, 4),
        (3, {"workload.batch_size": 64, "ipus": 8}, 64, 8),
        (4, {"workload.batch_size": 128, "ipus": 4}, 128, 4),
        (5, {"workload.batch_size": 128, "ipus": 8}, 128, 8),
    ]
    assert {e.name for e in elements(db, array.id)} == {f"sweep[{i}]" for i in range(6)}


def test_an_element_is_given_its_array_environment(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    array = submit_array(db, tenant, array={"indices": "3-5"}, name="env")
    assert loop.lead()
    loop.schedule_pass()
    taken = {}
    for attempt in live_attempts(db):
        got = agentkit.take(db, attempt.id)
        assert got is not None
        taken[got.job_name] = got.environment
    assert taken["env[4]"] == {
        "IPUCLOUD_ARRAY_ID": array.id,
        "IPUCLOUD_ARRAY_INDEX": "4",
        "IPUCLOUD_ARRAY_SIZE": "3",
        "SLURM_ARRAY_JOB_ID": array.id,
        "SLURM_ARRAY_TASK_ID": "4",
        "SLURM_ARRAY_TASK_COUNT": "3",
        "SLURM_ARRAY_TASK_MIN": "3",
        "SLURM_ARRAY_TASK_MAX": "5",
    }


def test_random_sweep_draws_the_same_points_for_a_seed(db: Any, tenant: str) -> None:
    body = {
        "method": "random",
        "parameters": {"workload.steps": {"min": 5, "max": 50, "distribution": "int_uniform"}},
        "samples": 5,
        "seed": 7,
    }
    a, b = submit_array(db, tenant, sweep=body), submit_array(db, tenant, sweep=body)
    steps_a = [e.spec["workload"]["steps"] for e in elements(db, a.id)]
    assert steps_a == [e.spec["workload"]["steps"] for e in elements(db, b.id)]
    assert all(isinstance(x, int) and 5 <= x <= 50 for x in steps_a)


def test_bad_input_names_the_field_and_stores_and_reserves_nothing(db: Any, tenant: str) -> None:
    other = make_tenant(db, "other")
    foreign = submit_job(db, other)
    trial = make_tenant(db, "small", plan="trial")
    with pytest.raises(ValidationError, match="a grid needs `values`"):
        spec(sweep={"parameters": {"workload.steps": {"min": 1, "max": 9}}})
    with pytest.raises(ValidationError, match="no field of the job spec"):
        spec(sweep={"parameters": {"workload.colour": {"values": [1]}}})
    with pytest.raises(ValidationError, match="more than 10,000 points"):
        spec(
            sweep={
                "parameters": {"ipus": {"values": list(range(200))}, "priority": {"values": list(range(60))}}
            }
        )
    with pytest.raises(ValidationError):
        spec(depends_on={"all": [{"job": f"job_{i:026d}"} for i in range(65)]})
    with pytest.raises(InvalidRequest) as over:
        submit_array(db, trial, array={"indices": "0-64"})  # the trial plan allows 64
    assert over.value.extra["field"] == "array.indices" and over.value.extra["limit"] == "max_array_size"
    with pytest.raises(InvalidRequest) as throttle:
        submit_array(db, trial, array={"indices": "0-3", "max_running": 3})  # trial runs 2 at once
    assert throttle.value.extra["field"] == "array.max_running"
    with pytest.raises(InvalidRequest) as grid:
        submit_array(db, trial, sweep={"parameters": {"priority": {"values": list(range(65))}}})
    assert grid.value.extra["field"] == "sweep.parameters"
    with pytest.raises(InvalidRequest) as point:
        submit_array(db, tenant, sweep={"parameters": {"ipus": {"values": [4, 3]}}})
    assert point.value.extra["field"] == "sweep.parameters"
    with pytest.raises(NotFound):
        submit_array(db, tenant, array={"indices": "0-3"}, depends_on={"all": [{"job": foreign}]})
    with pytest.raises(NotFound):
        submit_job(db, tenant, depends_on={"any": [{"job": "arr_" + "0" * 26}]})
    up = submit_array(db, tenant, array={"indices": "0-1"}).id
    with pytest.raises(InvalidRequest, match="aftercorr"):
        submit_job(db, tenant, depends_on={"all": [{"job": up, "type": "aftercorr"}]})
    with pytest.raises(QuotaExceeded):
        submit_array(db, tenant, array={"indices": "0-999"}, workload={**WORKLOAD, "steps": 100_000})
    with db.read() as s:
        assert (
            s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == tenant)).scalar_one() == 2
        )
        assert (
            s.execute(
                select(func.count()).select_from(JobArray).where(JobArray.tenant_id == tenant)
            ).scalar_one()
            == 1
        )
        assert (
            s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == trial)).scalar_one() == 0
        )
    assert reserved(db, trial) == 0


# ----------------------------------------------------------------------------------------- quota


def test_the_whole_array_is_reserved_at_once_and_released_exactly(
    db: Any, tenant: str, loop: SchedulerLoop
) -> None:
    array = submit_array(db, tenant, array={"indices": "0-7"})
    members = elements(db, array.id)
    each = members[0].reserved_ipu_ms
    assert each > 0 and all(e.reserved_ipu_ms == each for e in members)
    assert reserved(db, tenant) == 8 * each == array.reserved_at_submit_ipu_ms
    with db.write() as s:
        cancelled = arrays.cancel_elements(
            session=s, array_id=array.id, scope=OneTenant(tenant), indices="6-7"
        )
    assert len(cancelled) == 2
    assert reserved(db, tenant) == 6 * each
    finished = run_placed(db, loop)
    assert len(finished) == 6
    with db.read() as s:
        t = s.get(Tenant, tenant)
        assert t.reserved_ipu_ms == 0 and t.used_ipu_ms == 6 * 4 * 5_000


def test_an_array_counts_once_against_queued_jobs(db: Any, seeded: Any) -> None:
    trial = make_tenant(db, "small", plan="trial")  # 20 queued jobs
    submit_array(db, trial, array={"indices": "0-63"})
    for _ in range(19):
        submit_job(db, trial, workload={**WORKLOAD, "steps": 1})
    with pytest.raises(LimitExceeded):
        submit_job(db, trial, workload={**WORKLOAD, "steps": 1})


# ---------------------------------------------------------------------------------- scheduling


def test_max_running_is_never_passed_and_every_element_succeeds(
    db: Any, tenant: str, loop: SchedulerLoop
) -> None:
    array = submit_array(db, tenant, array={"indices": "0-11", "max_running": 3})
    seen = 0
    for _ in range(10):
        assert loop.lead()
        loop.schedule_pass()
        loop.dispatch()
        live = live_attempts(db)
        assert len(live) <= 3
        seen = max(seen, len(live))
        if not live:
            break
        with db.read() as s:
            waits = [
                j.wait
                for j in s.execute(
                    select(Job).where(Job.array_id == array.id, Job.state == "queued")
                ).scalars()
            ]
        assert all(w is None or w["reason"] == "array-throttle" for w in waits), waits
        for attempt in live:
            assert agentkit.take(db, attempt.id) is not None
            assert agentkit.finish(db, attempt.id, AttemptState.SUCCEEDED, 5.0)
    assert seen == 3
    assert {e.state for e in elements(db, array.id)} == {"succeeded"}
    with db.read() as s:
        (summary,) = arrays.summaries(session=s, arrays=[s.get(JobArray, array.id)])
    assert summary.by_state == {"succeeded": 12} and compress_indices(summary.completed) == "0-11"
    assert arrays.array_state(summary.by_state, 12) == "succeeded"


def test_max_running_can_be_raised_while_it_runs(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    array = submit_array(db, tenant, array={"indices": "0-5", "max_running": 1})
    assert loop.lead()
    loop.schedule_pass()
    assert len(live_attempts(db)) == 1
    with db.write() as s:
        arrays.update_array(session=s, array_id=array.id, scope=OneTenant(tenant), max_running=4)
    loop.schedule_pass()
    assert len(live_attempts(db)) == 4
    with db.write() as s, pytest.raises(InvalidRequest):
        arrays.update_array(session=s, array_id=array.id, scope=OneTenant(tenant), max_running=33)


def test_singleton_runs_one_job_of_a_name_at_a_time(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    a = submit_job(db, tenant, name="nightly", singleton=True)
    b = submit_job(db, tenant, name="nightly", singleton=True)
    assert loop.lead()
    loop.schedule_pass()
    assert [x.job_id for x in live_attempts(db)] == [a]
    with db.read() as s:
        assert s.get(Job, b).wait["reason"] == "singleton"
    run_placed(db, loop)  # a ends; b may start on the next pass
    loop.schedule_pass()
    assert [x.job_id for x in live_attempts(db)] == [b]


# --------------------------------------------------------------------------------- cancel, retry


def test_cancel_and_retry_some_indices(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    array = submit_array(db, tenant, array={"indices": "0-5"})
    members = {e.array_index: e.id for e in elements(db, array.id)}
    each = elements(db, array.id)[0].reserved_ipu_ms
    run_placed(db, loop, AttemptState.FAILED, only={members[1], members[4]})
    with db.write() as s:
        arrays.cancel_elements(session=s, array_id=array.id, scope=OneTenant(tenant), indices="0,2-3,5")
    states = {e.array_index: e.state for e in elements(db, array.id)}
    assert states == {
        0: "cancelled",
        1: "failed",
        2: "cancelled",
        3: "cancelled",
        4: "failed",
        5: "cancelled",
    }
    assert reserved(db, tenant) == 0
    with db.write() as s:
        retried = arrays.retry_elements(session=s, array_id=array.id, scope=OneTenant(tenant), indices="1,3")
    assert sorted(retried) == sorted([members[1], members[3]])
    assert reserved(db, tenant) == 2 * each
    assert run_placed(db, loop) and {e.array_index: e.state for e in elements(db, array.id)}[1] == "succeeded"
    with db.write() as s:
        again = arrays.retry_elements(session=s, array_id=array.id, scope=OneTenant(tenant), indices="failed")
    assert sorted(again) == sorted([members[0], members[2], members[4], members[5]])
    run_placed(db, loop)
    assert {e.state for e in elements(db, array.id)} == {"succeeded"}
    assert reserved(db, tenant) == 0
    with db.read() as s:
        history = s.execute(select(JobEvent.message).where(JobEvent.job_id == members[1])).scalars().all()
    assert any("retried" in m for m in history)


def test_another_tenant_cannot_see_or_touch_an_array(db: Any, tenant: str) -> None:
    array = submit_array(db, tenant, array={"indices": "0-1"})
    other = make_tenant(db, "other")
    with db.write() as s:
        for call in (
            lambda: arrays.get_array(session=s, array_id=array.id, scope=OneTenant(other)),
            lambda: arrays.cancel_elements(
                session=s, array_id=array.id, scope=OneTenant(other), indices=None
            ),
            lambda: arrays.retry_elements(
                session=s, array_id=array.id, scope=OneTenant(other), indices="failed"
            ),
            lambda: arrays.update_array(session=s, array_id=array.id, scope=OneTenant(other), max_running=1),
        ):
            with pytest.raises(NotFound):
                call()
    assert {e.state for e in elements(db, array.id)} == {"queued"}


# ---------------------------------------------------------------------------------- dependencies


def test_afterok_waits_for_the_whole_array_then_starts(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    array = submit_array(db, tenant, array={"indices": "0-2", "max_running": 2})
    after = submit_job(
        db, tenant, name="fine-tune", depends_on={"all": [{"job": array.id, "type": "afterok"}]}
    )
    started_before_end: list[str] = []
    for _ in range(5):
        done = run_placed(db, loop)
        if after in done:
            assert {e.state for e in elements(db, array.id)} == {"succeeded"}
            break
        with db.read() as s:
            job = s.get(Job, after)
            if {e.state for e in elements(db, array.id)} != {"succeeded"}:
                assert job.state == "queued" and job.held_for == "dependency"
                assert job.wait is None or (
                    job.wait["reason"] == "dependency" and array.id in job.wait["detail"]
                )
                started_before_end.append(job.state)
    with db.read() as s:
        assert s.get(Job, after).state == "succeeded"


def test_afternotok_and_unsatisfiable_chains(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    first = submit_job(db, tenant, name="pretrain")
    on_fail = submit_job(
        db, tenant, name="report", depends_on={"all": [{"job": first, "type": "afternotok"}]}
    )
    on_ok = submit_job(db, tenant, name="finetune", depends_on={"all": [{"job": first, "type": "afterok"}]})
    held = submit_job(
        db,
        tenant,
        name="held",
        depends_on={"all": [{"job": first, "type": "afterok"}]},
        on_unsatisfiable="hold",
    )
    downstream = submit_job(db, tenant, name="eval", depends_on={"all": [{"job": on_ok, "type": "afterany"}]})
    assert run_placed(db, loop, AttemptState.FAILED) == [first]
    run_placed(db, loop)  # the resolver acts: report starts, finetune is cancelled, held is kept
    with db.read() as s:
        got = {
            j.id: j
            for j in s.execute(select(Job).where(Job.id.in_([on_fail, on_ok, held, downstream]))).scalars()
        }
    assert got[on_fail].state == "succeeded"
    assert got[on_ok].state == "cancelled" and "can never be satisfied" in (got[on_ok].reason or "")
    assert got[held].state == "queued" and got[held].wait["reason"] == "dependency-never"
    # afterany fires on a cancelled upstream
    run_placed(db, loop)
    with db.read() as s:
        assert s.get(Job, downstream).state == "succeeded"
        assert s.get(Job, on_ok).reserved_ipu_ms == 0


def test_any_of_and_aftercorr(db: Any, tenant: str, loop: SchedulerLoop) -> None:
    a = submit_job(db, tenant, name="a")
    b = submit_job(db, tenant, name="b")
    either = submit_job(
        db,
        tenant,
        name="either",
        depends_on={"any": [{"job": a, "type": "afterok"}, {"job": b, "type": "afterok"}]},
    )
    up = submit_array(db, tenant, array={"indices": "0-2"})
    down = submit_array(
        db, tenant, array={"indices": "0-2"}, depends_on={"all": [{"job": up.id, "type": "aftercorr"}]}
    )
    ups = {e.array_index: e.id for e in elements(db, up.id)}
    run_placed(db, loop, AttemptState.FAILED, only={a, ups[1]})
    run_placed(db, loop, AttemptState.SUCCEEDED, only={b, ups[0], ups[2]})
    for _ in range(3):
        run_placed(db, loop)
    with db.read() as s:
        assert s.get(Job, either).state == "succeeded"
    states = {e.array_index: e.state for e in elements(db, down.id)}
    assert states == {0: "succeeded", 1: "cancelled", 2: "succeeded"}


def test_the_job_list_folds_queued_elements(db: Any, tenant: str) -> None:
    array = submit_array(db, tenant, array={"indices": "5-99"})
    single = submit_job(db, tenant)
    with db.read() as s:
        folded = jobs.folded_elements(session=s, scope=OneTenant(tenant))
        listed = jobs.list_jobs(session=s, scope=OneTenant(tenant), after=None, limit=50, fold=True)
        expanded = jobs.list_jobs(session=s, scope=OneTenant(tenant), after=None, limit=500)
    assert [(f.first.array_index, f.count, f.indices) for f in folded] == [(5, 95, "5-99")]
    assert folded[0].first.array_id == array.id
    assert [j.id for j in listed] == [single]
    assert len(expanded) == 96


def test_forecasts_keep_an_arrays_elements_to_its_max_running(
    db: Any, tenant: str, loop: SchedulerLoop
) -> None:
    """12 elements, at most 3 at once, on a fleet with room for all: the 9 held back are forecast in
    waves of 3, each wave when the one before is predicted to end (never more than 3 together)."""
    array = submit_array(db, tenant, array={"indices": "0-11", "max_running": 3})
    assert loop.lead()
    loop.schedule_pass()
    placed = {a.job_id for a in live_attempts(db)}
    assert len(placed) == 3
    members = elements(db, array.id)
    runtime = members[0].predicted_runtime_s / get_settings().time_scale
    assert runtime > 5, "the waves must be told apart on a clock of whole seconds"
    starts = []
    for e in members:
        if e.id in placed:
            continue
        assert e.wait is not None and e.wait["reason"] == "array-throttle", e.wait
        assert e.wait.get("estimated_start"), f"element {e.array_index} has no forecast: {e.wait}"
        starts.append(datetime.fromisoformat(e.wait["estimated_start"]).timestamp())
    waves = sorted(set(starts))
    assert [starts.count(t) for t in waves] == [3, 3, 3], starts
    for earlier, later in itertools.pairwise(waves):
        assert later - earlier == pytest.approx(runtime, abs=1.5)
    # Each start and the predicted run time (starts are whole seconds): never more than 3 elements
    # at once, the 3 placed running until the first wave starts.
    intervals = [(t, t + runtime - 1.5) for t in starts] + [(waves[0] - runtime, waves[0])] * 3
    for t in waves:
        assert sum(1 for a, b in intervals if a <= t < b) <= 3
