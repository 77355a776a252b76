"""An agent's tick and a job's cancel lock the same job and attempt: on PostgreSQL they must take
them in the one order (job, then attempt) or they deadlock, and the cancel was answered 503."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import func, select, text

from scheduler.models import Attempt, AttemptState, Checkpoint, Job
from scheduler.services.batch import attempts, checkpoints, jobs
from scheduler.services.batch.attempts import ticks
from scheduler.services.tenancy.scope import OneTenant
from tests.faults.harness import leader_loop, make_tenant, place, submit, take

pytestmark = pytest.mark.needs_services


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


def test_a_cancel_does_not_deadlock_with_a_tick_saving_a_checkpoint(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick writes a checkpoint of an attempt it neither ends nor bills; the cancel comes while
    the tick holds its locks and before the checkpoint's row is written. The tick used to lock the
    attempt alone; the checkpoint's foreign key then waited for the cancel's lock on the job while
    the cancel waited for the attempt: PostgreSQL aborted one of them ("deadlock detected"), and the
    fleet test saw the cancel answered 503."""
    if db.sqlite:
        pytest.skip("SQLite has no row locks: one writer at a time")
    tenant = make_tenant(db)
    loop = leader_loop(db)
    job_id = submit(db, tenant)
    placed = place(db, loop, job_id)
    lease, taken = take(db, placed)
    due = checkpoints.CheckpointDue(
        attempt_id=taken.attempt_id,
        job_id=job_id,
        attempt=1,
        step=10,
        steps=50,
        samples=0,
        executable_key="k",
        machine_type=placed.machine_type,
        cluster_s=5.0,
        run_s=5.0,
        reason="interval",
    )

    locked = threading.Event()
    errors: list[BaseException] = []
    record = checkpoints.record

    def record_when_cancel_waits(*, session: Any, items: Any) -> int:
        # The tick holds what it locked; the cancel now runs into it, then the tick goes on.
        locked.set()
        deadline = time.monotonic() + 10
        while not _lock_waiters(db):
            assert time.monotonic() < deadline and canceller.is_alive(), errors
            time.sleep(0.02)
        return record(session=session, items=items)

    monkeypatch.setattr(ticks.checkpoints, "record", record_when_cancel_waits)

    def cancel() -> None:
        try:
            locked.wait(10)
            with db.write() as s:
                jobs.request_cancel(session=s, job_id=job_id, scope=OneTenant(tenant))
        except BaseException as exc:
            errors.append(exc)

    canceller = threading.Thread(target=cancel)
    canceller.start()
    try:
        with db.write() as s:
            result = attempts.record_tick(session=s, agent=lease, lease_s=30, saved=[due])
    except BaseException as exc:
        errors.append(exc)
    finally:
        locked.set()
        canceller.join(30)
    assert not errors, errors
    assert not result.gone, "the tick ran before the cancel: the attempt was still its own"
    with db.read() as s:
        assert s.get(Job, job_id).state == "cancelled"
        assert s.get(Attempt, taken.attempt_id).state == AttemptState.CANCELLED
        saved = s.execute(select(func.count()).select_from(Checkpoint).where(Checkpoint.job_id == job_id))
        assert saved.scalar_one() == 1
