"""The control plane's serve pass against the scheduler's own transactions (no processes): replicas
queued, placed, compiling, loading, ready; scaled up, down, to zero and from zero by the traffic
window; a lost replica replaced; a spent grant stopping the endpoint; the minute rolled up. The data
plane's take is stood in for by writing the running attempt and its timeline as its agent would."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text

from scheduler.clock import UNSCALED, Clock
from scheduler.endpointspec import EndpointSpec
from scheduler.models import Attempt, AttemptState, Endpoint, EndpointStat, Job, JobState, Tenant, utcnow
from scheduler.services import endpoints
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import add_event
from scheduler.services.endpoints import ScalePolicy, ScaleState, decide_scale
from scheduler.services.tenancy import usage
from scheduler.services.tenancy.scope import OneTenant
from tests.faults.harness import leader_loop, make_tenant

# Minutes ago, on a whole minute: a drain bills up to the database's now, so the test's clock stays
# close behind it.
T0 = (utcnow() - timedelta(minutes=10)).replace(second=0, microsecond=0)


@dataclass(frozen=True)
class Window:
    """The fields of `scheduler.inference.Window` (the data plane's), as the autoscaler reads them."""

    requests: int = 0
    answered: int = 0
    rejected_429: int = 0
    unavailable_503: int = 0
    cold_starts: int = 0
    rps: float = 0.0
    mean_batch: float = 0.0
    queue_delay_ms: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    queued: int = 0
    ready_replicas: int = 0
    arrival_rps: float = 0.0
    recent_queue_delay_ms: float | None = None


BUSY = Window(requests=600, answered=600, rps=10.0, mean_batch=4, queue_delay_ms=200.0, p50_ms=30, p99_ms=90)
CALM = Window(requests=60, answered=60, rps=1.0, mean_batch=1, queue_delay_ms=1.0, p50_ms=3, p99_ms=5)
IDLE = Window()
POLICY = ScalePolicy(
    replicas_min=1,
    replicas_max=4,
    target_queue_delay_ms=50,
    scale_up_delay_s=30,
    scale_down_delay_s=300,
    scale_to_zero_after_s=None,
)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


# The autoscaler as a pure function ---------------------------------------------------------------------


def test_scale_up_waits_for_the_delay_and_at_most_doubles() -> None:
    state = ScaleState(desired=1)
    state, why = decide_scale(POLICY, state, BUSY, serving=1, now=at(0))
    assert state.desired == 1 and why is None and state.above_since == at(0)
    state, why = decide_scale(POLICY, state, BUSY, serving=1, now=at(29))
    assert state.desired == 1
    state, why = decide_scale(POLICY, state, BUSY, serving=1, now=at(30))
    # 200 ms against 50 would be 4x; one step at most doubles.
    assert state.desired == 2 and why is not None and "200.0 ms" in why
    # Not again while the new replica is still starting: it would only be doubled up.
    state, _ = decide_scale(POLICY, state, BUSY, serving=1, now=at(90))
    assert state.desired == 2
    state, _ = decide_scale(POLICY, state, BUSY, serving=2, now=at(91))
    assert state.desired == 4  # the delay ran since the last step
    state, _ = decide_scale(POLICY, state, BUSY, serving=4, now=at(200))
    assert state.desired == 4  # replicas.max


STEP_POLICY = ScalePolicy(
    **{**POLICY.__dict__, "replicas_max": 16, "scale_up_delay_s": 2, "capacity_rps": 120.0, "load_s": 10.0}
)
"""The benchmark's step: the LSTM at batch 1 serves 120 requests/s a replica, and a replica added
loads in 10 s."""


def test_a_load_step_asks_at_once_for_the_arrivals_and_the_backlog_they_leave() -> None:
    # 10 -> 500 requests/s; two seconds later 950 wait behind the one replica serving.
    step = Window(requests=1300, answered=600, rps=10.0, queue_delay_ms=400.0, queued=950, arrival_rps=500.0)
    state, _ = decide_scale(STEP_POLICY, ScaleState(desired=1), step, serving=1, now=at(0))
    assert state.desired == 1
    state, why = decide_scale(STEP_POLICY, state, step, serving=1, now=at(2))
    # ceil(500 / 120) = 5 carry the arrivals; until they serve (10 s) the one replica falls 380/s
    # behind: 950 + 3,800 = 4,750 waiting, which ceil(4,750 / (120 * 10)) = 4 more clear in 10 s.
    assert state.desired == 9, why
    assert why is not None and "500 requests/s arriving need 5 replicas" in why and "1 -> 9" in why
    # Bounded by replicas.max.
    capped = ScalePolicy(**{**STEP_POLICY.__dict__, "replicas_max": 8})
    state, _ = decide_scale(capped, ScaleState(desired=1, above_since=at(0)), step, serving=1, now=at(2))
    assert state.desired == 8
    # No backlog and no one behind: the arrivals alone.
    even = replace(step, queued=0, arrival_rps=240.0)
    state, _ = decide_scale(STEP_POLICY, ScaleState(desired=2, above_since=at(0)), even, serving=2, now=at(2))
    assert state.desired == 2  # what it has: no step
    state, _ = decide_scale(STEP_POLICY, ScaleState(desired=1, above_since=at(0)), even, serving=1, now=at(2))
    assert state.desired == 3  # 2 carry 240/s; the one serving falls 120/s behind for 10 s: one more
    # Without plan figures, by the queue delay's ratio, at most doubling.
    blind = ScalePolicy(**{**STEP_POLICY.__dict__, "capacity_rps": None})
    state, _ = decide_scale(blind, ScaleState(desired=1, above_since=at(0)), step, serving=1, now=at(2))
    assert state.desired == 2


def test_no_second_step_while_the_first_ones_load_nor_for_the_backlog_they_were_sized_for() -> None:
    step = Window(requests=1300, answered=600, queue_delay_ms=400.0, queued=950, arrival_rps=500.0)
    state, _ = decide_scale(STEP_POLICY, ScaleState(desired=1, above_since=at(0)), step, serving=1, now=at(2))
    assert state.desired == 9
    # While the eight load, the backlog grows behind the one serving: capacity on its way, no step.
    for t, queued in ((5, 2100), (8, 3200), (11, 4400)):
        grown = replace(step, queued=queued, recent_queue_delay_ms=9000.0)
        state, _ = decide_scale(STEP_POLICY, state, grown, serving=1, now=at(t))
        assert state.desired == 9, t
    # They serve, behind the backlog they were sized for: the delay is still far above target (the
    # requests answered waited in it), and the rule does not fire again.
    behind = replace(step, queued=4700, recent_queue_delay_ms=9000.0)
    for t in (13, 15, 20):
        state, why = decide_scale(STEP_POLICY, state, behind, serving=9, now=at(t))
        assert state.desired == 9, why


def test_a_sustained_higher_load_still_scales_further() -> None:
    policy = ScalePolicy(**{**STEP_POLICY.__dict__, "replicas_max": 32})
    state = ScaleState(desired=9, above_since=at(0))
    more = Window(
        requests=90000,
        answered=60000,
        queue_delay_ms=400.0,
        queued=500,
        arrival_rps=1500.0,
        recent_queue_delay_ms=300.0,
    )
    state, why = decide_scale(policy, state, more, serving=9, now=at(1))
    assert state.desired == 9  # the up delay, from when it was first seen above target
    state, why = decide_scale(policy, state, more, serving=9, now=at(2))
    # ceil(1,500 / 120) = 13 carry it; 9 * 120 fall 420/s behind for 10 s: 500 + 4,200, 4 more.
    assert state.desired == 17 and why is not None and "9 -> 17" in why


def test_the_recent_queue_delay_not_the_minutes_mean_decides_up() -> None:
    # The minute's mean holds the backlog just drained; the last seconds' answers waited 3 ms.
    drained = Window(
        requests=25000,
        answered=25000,
        queue_delay_ms=900.0,
        queued=0,
        arrival_rps=500.0,
        recent_queue_delay_ms=3.0,
    )
    state = ScaleState(desired=6, above_since=at(0))
    state, why = decide_scale(STEP_POLICY, state, drained, serving=6, now=at(30))
    assert state.desired == 6 and state.above_since is None, why
    # Still waiting in the last seconds: above target, the same figure decides.
    waiting = replace(drained, recent_queue_delay_ms=100.0, queued=2000, arrival_rps=700.0)
    six = ScaleState(desired=6, above_since=at(0))
    state, _ = decide_scale(STEP_POLICY, six, waiting, serving=6, now=at(2))
    assert state.desired > 6


def test_replicas_needed_is_the_ceiling_of_load_over_a_replicas_throughput() -> None:
    assert endpoints.replicas_needed(500.0, 120.0) == 5
    assert endpoints.replicas_needed(480.0, 120.0) == 4
    assert endpoints.replicas_needed(480.0000001, 120.0) == 4  # a measured rate's wobble
    assert endpoints.replicas_needed(481.0, 120.0) == 5
    assert endpoints.replicas_needed(1.0, 120.0) == 1
    assert endpoints.replicas_needed(0.0, 120.0) == 0
    assert endpoints.replicas_needed(500.0, None) == 0


def test_a_dip_below_target_restarts_the_up_delay() -> None:
    state, _ = decide_scale(POLICY, ScaleState(desired=1), BUSY, serving=1, now=at(0))
    state, _ = decide_scale(POLICY, state, CALM, serving=1, now=at(20))
    assert state.above_since is None
    state, _ = decide_scale(POLICY, state, BUSY, serving=1, now=at(35))
    assert state.desired == 1


def test_scale_down_one_at_a_time_after_the_delay_while_the_load_fits() -> None:
    policy = ScalePolicy(**{**POLICY.__dict__, "capacity_rps": 100.0})
    state = ScaleState(desired=3)
    state, _ = decide_scale(policy, state, CALM, serving=3, now=at(0))
    assert state.below_since == at(0) and state.desired == 3
    state, why = decide_scale(policy, state, CALM, serving=3, now=at(300))
    assert state.desired == 2 and why is not None
    state, _ = decide_scale(policy, state, CALM, serving=2, now=at(599))
    assert state.desired == 2
    state, _ = decide_scale(policy, state, CALM, serving=2, now=at(600))
    assert state.desired == 1
    state, _ = decide_scale(policy, state, CALM, serving=1, now=at(2000))
    assert state.desired == 1  # replicas.min
    # A load that would not fit in one replica fewer keeps them.
    hot = Window(requests=6000, rps=150.0, queue_delay_ms=1.0)
    state, _ = decide_scale(policy, ScaleState(desired=2), hot, serving=2, now=at(0))
    state, _ = decide_scale(policy, state, hot, serving=2, now=at(1000))
    assert state.desired == 2 and state.below_since is None


def test_to_zero_after_idling_and_back_when_a_request_waits() -> None:
    policy = ScalePolicy(
        **{**POLICY.__dict__, "replicas_min": 0, "scale_to_zero_after_s": 600, "clock": Clock(60)}
    )
    state, _ = decide_scale(policy, ScaleState(desired=1), IDLE, serving=1, now=at(0))
    assert state.idle_since == at(0) and state.desired == 1
    # 600 cluster seconds at time scale 60 are 10 wall seconds.
    state, _ = decide_scale(policy, state, IDLE, serving=1, now=at(9))
    assert state.desired == 1
    state, why = decide_scale(policy, state, IDLE, serving=1, now=at(10))
    assert state.desired == 0 and why is not None and "scaled to zero" in why
    state, _ = decide_scale(policy, state, IDLE, serving=0, now=at(100))
    assert state.desired == 0
    state, why = decide_scale(policy, state, Window(queued=1), serving=0, now=at(101))
    assert state.desired == 1 and why is not None and "cold start" in why
    # Without replicas.min 0 it never goes to zero, however long it idles.
    state, _ = decide_scale(POLICY, ScaleState(desired=1, idle_since=at(0)), IDLE, serving=1, now=at(10**6))
    assert state.desired == 1


def test_no_window_holds_what_it_has_within_the_bounds() -> None:
    assert decide_scale(POLICY, ScaleState(desired=3), None, serving=0, now=at(0))[0].desired == 3
    assert decide_scale(POLICY, ScaleState(desired=9), None, serving=0, now=at(0))[0].desired == 4


# The pass on the database --------------------------------------------------------------------------------


SPEC = {
    "name": "bert",
    "model": "bert-base",
    "seq_len": 128,
    "machine": "m2000",
    "batching": {"max_batch_size": 8, "max_wait_ms": 2},
}


def create(db: Any, tenant: str, **over: Any) -> str:
    with db.write() as s:
        return endpoints.create_endpoint(
            session=s, tenant_id=tenant, spec=EndpointSpec.model_validate({**SPEC, **over})
        ).id


def serve(db: Any, now: datetime, windows: dict[str, Any] | None = None) -> endpoints.ServeResult:
    with db.write() as s:
        return endpoints.serve_pass(session=s, now=now, clock=UNSCALED, windows=windows or {})


def endpoint(db: Any, ep_id: str) -> Endpoint:
    with db.read() as s:
        row = s.get(Endpoint, ep_id)
        s.expunge(row)
        return row


def replicas(db: Any, ep_id: str, now: datetime) -> list[str]:
    with db.read() as s:
        return [r.state for r in endpoints.replicas_of(session=s, endpoint_ids=[ep_id], now=now)[ep_id]]


def run_placed(
    db: Any, ep_id: str, started: datetime, compile_s: float = 100.0, load_s: float = 10.0
) -> None:
    """What the data plane's take writes for each placed replica: running, with its timeline."""
    with db.write() as s:
        for a in s.execute(
            select(Attempt)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.endpoint_id == ep_id, Attempt.state == "placed")
        ).scalars():
            job = s.get(Job, a.job_id)
            a.state, a.epoch, a.started_at, a.worker = AttemptState.RUNNING, 1, started, "agent-test"
            # The contract's keys (compile_s, load_s, scale, end_s) beside a Timeline's, as every attempt's
            # timeline has them (attempts.stop_running reads the Timeline of what it stops).
            a.timeline = {
                "compile_s": compile_s,
                "load_s": load_s,
                "step_s": 1.0,
                "steps": 10**9,
                "samples_per_step": 1,
                "memory_per_ipu_bytes": 0,
                "scale": 1.0,
                "end_s": 10.0**9,
            }
            job.state, job.started_at = JobState.RUNNING, started


def test_a_replica_goes_from_queued_to_ready_and_the_endpoint_with_it(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "server")
    loop = leader_loop(db)
    ep = create(db, tenant)
    now = at(0)
    serve(db, now)
    assert endpoint(db, ep).state == "provisioning" and replicas(db, ep, now) == ["queued"]
    assert loop.schedule_pass() == 1  # placed like any job, for an agent to take
    assert replicas(db, ep, now) == ["queued"]
    run_placed(db, ep, started=now)
    assert replicas(db, ep, at(50)) == ["compiling"]
    assert replicas(db, ep, at(105)) == ["loading"]
    serve(db, at(105))
    assert endpoint(db, ep).state == "provisioning"
    assert replicas(db, ep, at(110)) == ["ready"]
    serve(db, at(110))
    row = endpoint(db, ep)
    assert row.state == "ready" and row.reason == "1 replica serving"


def test_the_traffic_scales_replicas_up_and_down_and_drains_through_cancel(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "scaler")
    loop = leader_loop(db)
    ep = create(
        db,
        tenant,
        replicas={"min": 1, "max": 3},
        autoscaling={"scale_up_delay_s": 10, "scale_down_delay_s": 60},
    )
    loop.schedule_pass()
    run_placed(db, ep, started=at(0))
    serve(db, at(200), {ep: BUSY})
    assert endpoint(db, ep).desired_replicas == 1
    result = serve(db, at(210), {ep: BUSY})
    assert result.created == 1 and endpoint(db, ep).desired_replicas == 2
    assert sorted(replicas(db, ep, at(210))) == ["queued", "ready"]
    # Ready with one of two serving: scaling up is not degraded.
    assert endpoint(db, ep).state == "ready"
    loop.schedule_pass()
    run_placed(db, ep, started=at(210))
    serve(db, at(400), {ep: CALM})
    result = serve(db, at(460), {ep: CALM})
    assert result.drained == 1 and endpoint(db, ep).desired_replicas == 1
    assert replicas(db, ep, at(460)) == ["ready"]
    with db.read() as s:
        jobs = list(s.execute(select(Job).where(Job.endpoint_id == ep).order_by(Job.id)).scalars())
        drained = [j for j in jobs if j.state == "cancelled"]
        (gone,) = drained
        attempt = s.execute(select(Attempt).where(Attempt.job_id == gone.id)).scalar_one()
        # The newest went (nothing it held is lost: the other serves), billed up to the drain.
        assert gone.id == jobs[-1].id and attempt.state == "cancelled" and attempt.cluster_s > 0
        # Billed like any attempt, and shown per endpoint in the usage.
        (row,) = usage.by_endpoint(session=s, scope=OneTenant(tenant))
        assert row["endpoint_id"] == ep and row["name"] == "bert" and row["model"] == "bert-base"
        assert (
            row["ipu_hours"]
            == usage.breakdowns(session=s, scope=OneTenant(tenant))["by_endpoint"][0]["ipu_hours"]
        )
        # (The other replica's run is not billed yet: its agent's ticks would.)
        assert attempt.metered_ipu_ms > 0
        assert row["ipu_hours"] == pytest.approx(attempt.metered_ipu_ms / 3_600_000, abs=1e-6)
    assert endpoint(db, ep).state == "ready"


def test_a_lost_replica_is_replaced_and_the_endpoint_degraded_meanwhile(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "fragile")
    loop = leader_loop(db)
    ep = create(db, tenant)
    loop.schedule_pass()
    run_placed(db, ep, started=at(0))
    serve(db, at(200))
    assert endpoint(db, ep).state == "ready"
    with db.write() as s:
        (live,) = s.execute(select(Attempt.id).where(Attempt.state == "running")).scalars()
        attempts.stop_running(
            session=s, attempt_ids=[live], outcome=AttemptState.LOST, reason="agent lapsed", max_attempts=3
        )
    serve(db, at(201))
    row = endpoint(db, ep)
    assert row.state == "degraded" and "replacing" in (row.reason or "")
    assert replicas(db, ep, at(201)) == ["queued"]  # the same holder job, queued again
    loop.schedule_pass()
    run_placed(db, ep, started=at(202), compile_s=0.0)
    serve(db, at(220))
    assert endpoint(db, ep).state == "ready"
    # A replica that failed outright is replaced by a new holder job.
    with db.write() as s:
        (live,) = s.execute(select(Attempt.id).where(Attempt.state == "running")).scalars()
        attempts.stop_running(
            session=s,
            attempt_ids=[live],
            outcome=AttemptState.FAILED,
            reason="the host crashed",
            max_attempts=1,
        )
    result = serve(db, at(230))
    assert result.created == 1 and endpoint(db, ep).state == "degraded"


def test_a_spent_grant_stops_the_endpoint_with_reason_quota(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "spender")
    loop = leader_loop(db)
    ep = create(db, tenant)
    loop.schedule_pass()
    run_placed(db, ep, started=at(0))
    serve(db, at(200))
    with db.write() as s:
        (live,) = s.execute(select(Attempt.id).where(Attempt.state == "running")).scalars()
        attempts.stop_running(
            session=s,
            attempt_ids=[live],
            outcome=AttemptState.FAILED,
            reason="stopped: the tenant's IPU-hour grant is used up",
            max_attempts=1,
        )
    result = serve(db, at(201))
    assert result.stopped == [(ep, "quota")]
    row = endpoint(db, ep)
    assert row.state == "stopped" and (row.reason or "").startswith("quota")
    assert [r.live for r in result.routes] == [False]  # its route is removed
    with db.read() as s:
        assert s.execute(select(Tenant.reserved_ipu_ms).where(Tenant.id == tenant)).scalar_one() == 0


def test_failing_replicas_fail_the_endpoint(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "doomed")
    ep = create(db, tenant)
    for n in range(endpoints.FAILURE_LIMIT):
        with db.write() as s:
            job = s.execute(select(Job).where(Job.endpoint_id == ep, Job.state == "queued")).scalar_one()
            from scheduler.services.batch.job_state import finalize_job

            finalize_job(session=s, job=job, state=JobState.FAILED, reason="does not fit on the partition")
        serve(db, at(n + 1))
    row = endpoint(db, ep)
    assert row.state == "failed" and "3 replicas failed" in (row.reason or "")
    assert replicas(db, ep, at(10)) == []


def test_scaled_to_zero_and_back_and_the_minutes_rolled_up(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "sleeper")
    ep = create(db, tenant, replicas={"min": 0, "max": 2}, autoscaling={"scale_to_zero_after_s": 60})
    assert endpoint(db, ep).state == "scaled-to-zero" and replicas(db, ep, at(0)) == []
    serve(db, at(0), {ep: IDLE})
    assert endpoint(db, ep).state == "scaled-to-zero"
    result = serve(db, at(1), {ep: Window(queued=1)})
    assert result.created == 1 and endpoint(db, ep).state == "provisioning"
    serve(db, at(61), {ep: IDLE})
    result = serve(db, at(122), {ep: IDLE})
    assert result.drained == 1 and endpoint(db, ep).state == "scaled-to-zero"
    with db.read() as s:
        minutes = list(s.execute(select(EndpointStat).where(EndpointStat.endpoint_id == ep)).scalars())
    # One row per minute passed (12:00 and 12:01 when the pass at 12:02 came), never two for one.
    assert [m.minute for m in minutes] == [at(-60), at(0), at(60)][: len(minutes)] and len(minutes) >= 2


def test_replicas_are_exempt_from_the_plans_job_count_limits() -> None:
    """A tenant at its limits of running and queued jobs still gets its replicas placed, and they do not
    take a place its jobs could have had (they count against the endpoint limits)."""
    from scheduler.policy.admission import Admission
    from scheduler.policy.model import QueuedJob, TenantState

    tenant = TenantState("t", max_concurrent_jobs=2, max_queued_jobs=1, running_jobs=2)
    admission = Admission({"t": tenant}, now=0.0)
    replica = QueuedJob("r", "t", 1, 0.0, 3600.0, counted=False)
    job = QueuedJob("j", "t", 1, 0.0, 60.0)
    assert admission.check(replica) is None
    admission.started(replica)
    wait = admission.check(job)
    assert wait is not None and wait.reason == "limit" and "2 jobs at once" in wait.detail
    # With room for one more job, the replica started before it does not take it.
    admission = Admission({"t": TenantState("t", max_concurrent_jobs=3, running_jobs=2)}, now=0.0)
    admission.started(replica)
    assert admission.check(job) is None


def test_a_new_batch_size_is_rolled_out_without_a_gap(db: Any, seeded: Any) -> None:
    """PATCH batching: the old replica serves until a replica of the new layout does, then drains."""
    from scheduler.endpointspec import EndpointChange
    from scheduler.services.tenancy.scope import OneTenant

    tenant = make_tenant(db, "roller")
    loop = leader_loop(db)
    ep = create(db, tenant)
    loop.schedule_pass()
    run_placed(db, ep, started=at(0))
    serve(db, at(200))
    with db.write() as s:
        row = endpoints.change_endpoint(
            session=s,
            endpoint_id=ep,
            scope=OneTenant(tenant),
            change=EndpointChange.model_validate({"batching": {"max_batch_size": 16, "max_wait_ms": 3}}),
        )
        assert row.workload["batch_size"] == 16 and row.batching == {"max_batch_size": 16, "max_wait_ms": 3}
        assert [b["batch_size"] for b in row.serve["m2000"]["batches"]][-1] == 16
    result = serve(db, at(201))
    assert result.created == 1 and result.drained == 0
    assert sorted(replicas(db, ep, at(201))) == ["queued", "ready"]
    assert endpoint(db, ep).state == "ready"  # the old one still serves
    loop.schedule_pass()
    run_placed(db, ep, started=at(202))
    serve(db, at(250))
    assert sorted(replicas(db, ep, at(250))) == ["compiling", "ready"]
    result = serve(db, at(400))
    assert result.drained == 1 and replicas(db, ep, at(400)) == ["ready"]
    with db.read() as s:
        (live,) = s.execute(select(Job).where(Job.endpoint_id == ep, Job.state == "running")).scalars()
        assert live.spec["workload"]["batch_size"] == 16


def test_deleting_an_endpoint_does_not_deadlock_with_its_agents_billing_tick(db: Any, seeded: Any) -> None:
    """DELETE locks the replica's job, then its attempt; the agent's tick locks the attempt it bills,
    then writes a meter event whose foreign key takes a KEY SHARE lock on the job. With the job
    locked FOR UPDATE the two waited on each other, PostgreSQL aborted one, and DELETE answered 503
    ("the database is unavailable"), as the endpoint fault test saw once. Jobs are locked FOR NO KEY
    UPDATE, which a foreign key's check does not wait for."""
    if db.sqlite:
        pytest.skip("SQLite has no row locks: one writer at a time")
    tenant = make_tenant(db, "server")
    loop = leader_loop(db)
    ep = create(db, tenant)
    serve(db, at(0))
    assert loop.schedule_pass() == 1
    run_placed(db, ep, started=at(0))
    with db.read() as s:
        attempt = s.execute(
            select(Attempt).join(Job, Job.id == Attempt.job_id).where(Job.endpoint_id == ep)
        ).scalar_one()
        job_id, attempt_id = attempt.job_id, attempt.id

    billed = threading.Event()
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            billed.wait(10)
            with db.write() as s:
                endpoints.delete_endpoint(session=s, endpoint_id=ep, scope=OneTenant(tenant))
        except BaseException as exc:
            errors.append(exc)

    deleter = threading.Thread(target=delete)
    deleter.start()
    try:
        with db.write() as tick:
            # The tick's `_lock_billing`: the attempt it bills, locked.
            tick.execute(select(Attempt).where(Attempt.id == attempt_id).with_for_update()).scalar_one()
            billed.set()
            # DELETE now holds the job and waits for the attempt.
            deadline = time.monotonic() + 10
            while not _lock_waiters(db):
                assert time.monotonic() < deadline and deleter.is_alive(), errors
                time.sleep(0.02)
            # Its meter event: a row whose foreign key names the job.
            add_event(tick, job_id, "meter", "billed a tick", at=at(1))
            tick.flush()
    finally:
        billed.set()
        deleter.join(30)
    assert not errors, errors
    assert endpoint(db, ep).state == "stopped"


def _lock_waiters(db: Any) -> int:
    with db.read() as probe:
        return int(
            probe.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            ).scalar_one()
        )
