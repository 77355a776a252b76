"""Sessions against the scheduler's own transactions (no processes): a session whose idle warning
fell while no scheduler was leading is warned when one sweeps again, and culled only the warning's
time after; a pass never waits for a session another transaction is changing."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.clock import Clock
from scheduler.jobspec import SessionSpec
from scheduler.models import IpuSession, JobEvent, Partition
from scheduler.services import sessions
from tests.faults.harness import leader_loop, make_tenant

SCALE = 1.0
WARNING_S = 60.0


def sweep(db: Any, at: Any) -> sessions.SweepResult:
    with db.write() as s:
        return sessions.sweep(
            session=s, now=at, clock=Clock(SCALE), warning_s=WARNING_S, meter_interval_s=3600
        )


def test_a_missed_idle_warning_is_given_its_time_before_the_session_is_culled(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "napper")
    loop = leader_loop(db)
    with db.write() as s:
        spec = SessionSpec.model_validate({"ipus": 1, "idle_timeout_s": 600, "max_duration_s": 7200})
        sid = sessions.start_session(session=s, tenant_id=tenant, spec=spec).id
    loop.schedule_pass()
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert row.state == "active" and row.started_at is not None
        started = row.started_at
    # The first sweep after the scheduler was away comes 900 s after the start: the idle deadline
    # (600 s) and its warning window (540-600 s) have both passed.
    late = started + timedelta(seconds=900)
    result = sweep(db, late)
    assert result.ended == [] and result.warned == [sid]
    with db.read() as s:
        events = [
            e
            for e in s.query(JobEvent).filter(JobEvent.job_id == s.get(IpuSession, sid).job_id)
            if e.kind == "warning"
        ]
        warnings = [e.data for e in events]
        texts = [e.message for e in events]
    assert [w["warning"] for w in warnings] == ["idle_timeout"]
    assert warnings[0]["ends_in_s"] == WARNING_S
    # The figure a person reads names its clock (#33): cluster seconds, as the session is billed.
    assert texts == [
        f"session ends in {WARNING_S:.0f} s of cluster time (idle timeout); submit a job to keep it"
    ]
    # Warned once; still held until the warning's time is up, then culled for idling.
    assert sweep(db, late + timedelta(seconds=WARNING_S - 1)).ended == []
    assert sweep(db, late + timedelta(seconds=WARNING_S)).ended == [(sid, sessions.IDLE_TIMEOUT)]


def test_the_maximum_duration_is_not_moved_by_a_missed_warning(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "overstayer")
    loop = leader_loop(db)
    with db.write() as s:
        spec = SessionSpec.model_validate({"ipus": 1, "idle_timeout_s": 100_000, "max_duration_s": 600})
        sid = sessions.start_session(session=s, tenant_id=tenant, spec=spec).id
    loop.schedule_pass()
    with db.read() as s:
        started = s.get(IpuSession, sid).started_at
    assert started is not None
    # It was paid for up to 600 s: past that it ends at once, warned or not.
    assert sweep(db, started + timedelta(seconds=900)).ended == [(sid, sessions.MAX_DURATION)]


def test_a_pass_skips_a_session_being_changed_instead_of_waiting_for_it(db: Any, seeded: Any) -> None:
    """The pass locks a holder job before its session; a change or an end locks the session first.
    On PostgreSQL the pass must skip the locked session, not wait (the two could deadlock)."""
    if db.engine.dialect.name == "sqlite":
        pytest.skip("SQLite has one writer at a time: no two transactions hold row locks at once")
    tenant = make_tenant(db, "changer")
    loop = leader_loop(db)
    with db.write() as s:
        spec = SessionSpec.model_validate({"ipus": 1, "max_duration_s": 600})
        sid = sessions.start_session(session=s, tenant_id=tenant, spec=spec).id
    passed = threading.Event()
    with db.write() as s:
        # What `change_session` and `end_session` hold first, kept while a pass runs.
        s.execute(select(IpuSession).where(IpuSession.id == sid).with_for_update()).scalar_one()
        runner = threading.Thread(target=lambda: (loop.schedule_pass(), passed.set()), daemon=True)
        runner.start()
        runner.join(timeout=15)
        assert passed.is_set(), "the pass waited for the session's lock"
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert row.state == "starting"
        # The partition the skipped pass made for it is already free.
        made = s.execute(select(Partition).where(Partition.job_id == row.job_id)).scalars().all()
        assert made and all(p.released_at is not None for p in made)
    # Once the lock is gone, the next pass activates it.
    loop.schedule_pass()
    with db.read() as s:
        assert s.get(IpuSession, sid).state == "active"
