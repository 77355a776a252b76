"""#32 item 12: a platform fault under a session's job refunds the held IPU-seconds it made useless,
for the IPUs that job held, as a batch job is refunded for the same fault (billed only up to its
last checkpoint). The control plane's own transactions on the test database; the agent is the
services it calls (tests/support/agentkit.py)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from scheduler import billing
from scheduler.clock import UNSCALED, Clock
from scheduler.jobspec import SessionSpec
from scheduler.models import Attempt, AttemptState, IpuSession, Job, MeterEvent, Tenant, utcnow
from scheduler.services import sessions
from scheduler.services.batch import attempts
from scheduler.services.tenancy.scope import OneTenant
from tests.faults.harness import leader_loop, make_tenant, submit
from tests.support import agentkit

SCALE = 60.0  # the agent's clock: a second of wall time is a minute of cluster time


def ledger(db: Any, tenant: str) -> tuple[int, int, int]:
    with db.read() as s:
        t = s.get(Tenant, tenant)
        events = s.execute(select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.tenant_id == tenant)).scalar()
        return t.used_ipu_ms, t.reserved_ipu_ms, int(events or 0)


def test_a_lost_session_job_refunds_the_held_ipu_seconds_the_fault_wasted(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "holder")
    loop = leader_loop(db)
    with db.write() as s:
        spec = SessionSpec.model_validate({"ipus": 16, "gcds": 4, "max_duration_s": 7200})
        row = sessions.start_session(session=s, tenant_id=tenant, spec=spec)
        sid, holder = row.id, row.job_id
    loop.schedule_pass()
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert row.state == "active" and row.started_at is not None
        started, hold_id = row.started_at, row.attempt_id
        reserved_at_start = s.get(Job, holder).reserved_ipu_ms
    job_id = submit(db, tenant, name="in-session", steps=200_000, ipus=4, session=sid)
    with db.read() as s:
        job_attempt = s.execute(select(Attempt).where(Attempt.job_id == job_id)).scalar_one()
    taken = agentkit.take(db, job_attempt.id, clock=Clock(SCALE))
    assert taken is not None and taken.partition_size == 4
    time.sleep(1.0)  # the job runs a minute of cluster time; then its host agent dies
    # The scheduler bills the hold ten minutes on, then the reconciler finds the agent's lease gone.
    with db.write() as s:
        sessions.sweep(
            session=s, now=started + timedelta(seconds=600), clock=UNSCALED, warning_s=60, meter_interval_s=60
        )
    billed_before = ledger(db, tenant)[0]
    assert billed_before > 0
    with db.write() as s:
        lapsed = attempts.lapse_agents(session=s, max_attempts=3, now=utcnow() + timedelta(seconds=120))
    assert [a.id for lapse in lapsed for a in lapse.ended] == [job_attempt.id]
    with db.read() as s:
        lost = s.get(Attempt, job_attempt.id)
        hold = s.get(Attempt, hold_id)
        assert lost.state == AttemptState.LOST and hold.state == AttemptState.RUNNING
        wasted_s = (lost.ended_at - lost.started_at).total_seconds() * SCALE  # no checkpoint: all of it
        refund = s.get(MeterEvent, f"att:{job_attempt.id}:fault-refund")
        assert refund is not None and refund.kind == "refund" and refund.job_id == holder
        # Its 4 IPUs of the session's 16, for the time the fault wasted, at the hold's rate.
        expected = billing.charged_ipu_ms(4, wasted_s, hold.rate)
        assert abs(-refund.ipu_ms - expected) <= 2, (refund.ipu_ms, expected)
        assert refund.partition_size == 4 and abs(refund.cluster_s - wasted_s) < 1e-6
    used, reserved, events = ledger(db, tenant)
    assert used == billed_before + refund.ipu_ms == events
    # A replay of the same end refunds nothing more.
    with db.write() as s:
        again = attempts.lapse_agents(session=s, max_attempts=3, now=utcnow() + timedelta(seconds=120))
    assert not [a for lapse in again for a in lapse.ended] and ledger(db, tenant)[0] == used
    # The session's ticks to come do not bill the refunded time again, and its end leaves the ledger
    # exact: what was used plus what was released is what was reserved.
    with db.write() as s:
        sessions.sweep(
            session=s,
            now=started + timedelta(seconds=1200),
            clock=UNSCALED,
            warning_s=60,
            meter_interval_s=60,
        )
    with db.read() as s:
        hold = s.get(Attempt, hold_id)
        assert hold.metered_ipu_ms == billing.charged_ipu_ms(16, 1200, hold.rate) - expected
    held_before_end = ledger(db, tenant)[1]
    with db.write() as s:
        sessions.end_session(session=s, session_id=sid, scope=OneTenant(tenant), clock=UNSCALED)
    used, reserved, events = ledger(db, tenant)
    assert used == events and reserved == 0
    with db.read() as s:
        assert s.get(Job, holder).reserved_ipu_ms == 0
    # Everything the session reserved was either used (refund deducted) or released at its end.
    assert used + held_before_end == reserved_at_start
