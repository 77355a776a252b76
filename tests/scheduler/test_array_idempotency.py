"""An array's Idempotency-Key under concurrency: two first submissions of one array with one key,
in two real threads with their own connections, admit one array; the loser replays the winner's
(migration 0016_array_idem's unique index backs the service's reads). On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import IntegrityError

from scheduler import billing
from scheduler.models import Job, JobArray, Tenant
from scheduler.services.batch import arrays, jobs
from tests.scheduler.test_arrays import make_tenant, spec

KEY = "sweep-nightly-7"
BODY = {"array": {"indices": "0-5", "max_running": 2}}


def _submit_replaying(db: Any, tenant: str, races: list[int]) -> tuple[str, bool]:
    """What the API does (api/routers/jobs.py submit_array): retry a lost race, which replays."""
    for _ in range(3):
        try:
            with db.write() as s:
                made = arrays.submit_array(
                    session=s, tenant_id=tenant, spec=spec(**BODY), idempotency_key=KEY
                )
                return made.array.id, made.replayed
        except jobs.IdempotencyRace:
            races.append(1)
    raise AssertionError("three lost races in a row")


def _wait_for_lock_waiter(db: Any, timeout: float = 10.0) -> None:
    """Until the second submission is blocked (PostgreSQL: on the tenant's row lock, past its first
    read of the key; SQLite: at BEGIN IMMEDIATE, before it)."""
    if db.engine.dialect.name != "postgresql":
        time.sleep(0.3)
        return
    deadline = time.monotonic() + timeout
    with db.engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            ).scalar_one()
            if waiting:
                return
            # PostgreSQL reads pg_stat_activity once per transaction: without ending it, every poll
            # after the first sees the same snapshot, and a second submission slower than the first
            # poll (a loaded machine) is never seen waiting.
            conn.rollback()
            time.sleep(0.02)
    raise AssertionError("the second submission never waited for the first's lock")


def _array_cost(db: Any, seeded: Any) -> int:
    probe = make_tenant(db, "probe", hours=1000)
    with db.write() as s:
        made = arrays.submit_array(session=s, tenant_id=probe, spec=spec(**BODY))
        cost = made.array.reserved_at_submit_ipu_ms
        s.rollback()
    return cost


def test_two_first_submissions_with_one_key_admit_one_array(db: Any, seeded: Any) -> None:
    cost = _array_cost(db, seeded)
    # The grant covers one array and half of another: had the loser been judged as new, it would
    # be refused for quota instead of given the winner's answer.
    tenant = make_tenant(db, "racer", hours=billing.ipu_hours(cost + cost // 2))
    first_in = threading.Event()
    results: dict[str, tuple[str, bool]] = {}
    races: list[int] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with db.write() as s:
                made = arrays.submit_array(
                    session=s, tenant_id=tenant, spec=spec(**BODY), idempotency_key=KEY
                )
                results["first"] = (made.array.id, made.replayed)
                first_in.set()  # admitted, not yet committed: the second submission starts now
                _wait_for_lock_waiter(db)
        except BaseException as exc:
            errors.append(exc)
            first_in.set()

    def second() -> None:
        try:
            first_in.wait(10)
            results["second"] = _submit_replaying(db, tenant, races)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert results["first"] == (results["first"][0], False)
    assert results["second"] == (results["first"][0], True), "the loser gets the winner's array"
    if db.engine.dialect.name == "postgresql":
        # The second read the key before the first committed: it lost the race, then replayed.
        assert races == [1]
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(JobArray)).scalar_one() == 1
        assert (
            s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == tenant)).scalar_one() == 6
        )
        assert s.get(Tenant, tenant).reserved_ipu_ms == cost, "reserved once"


def test_the_unique_index_stops_what_the_reads_miss(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database holds the rule itself: were both reads of the key to miss, the array's insert
    fails on the index, nothing of the second is kept, and the retry replays the first."""
    tenant = make_tenant(db)
    first_id, replayed = _submit_replaying(db, tenant, [])
    assert not replayed
    with db.read() as s:
        held = s.get(Tenant, tenant).reserved_ipu_ms
    with monkeypatch.context() as m:
        m.setattr(arrays, "_keyed", lambda *a, **k: None)  # a unit fault: both reads miss
        with pytest.raises(jobs.IdempotencyRace), db.write() as s:
            arrays.submit_array(session=s, tenant_id=tenant, spec=spec(**BODY), idempotency_key=KEY)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(JobArray)).scalar_one() == 1
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 6
        assert s.get(Tenant, tenant).reserved_ipu_ms == held
    assert _submit_replaying(db, tenant, []) == (first_id, True)
    # Straight at the table: a second row with the tenant's key is refused; no key never collides.
    with db.read() as s:
        row = {c.key: getattr(s.get(JobArray, first_id), c.key) for c in JobArray.__table__.columns}
    with pytest.raises(IntegrityError), db.write() as s:
        s.execute(insert(JobArray.__table__), [{**row, "id": "arr_copy"}])
    with db.write() as s:
        s.execute(
            insert(JobArray.__table__),
            [
                {**row, "id": "arr_n1", "idempotency_key": None},
                {**row, "id": "arr_n2", "idempotency_key": None},
            ],
        )


def test_the_migration_keeps_the_oldest_array_its_key(db: Any, seeded: Any) -> None:
    from tests.scheduler.test_migrations import _migration

    migration = _migration("0016_array_idem")
    tenant = make_tenant(db)
    array_id, _ = _submit_replaying(db, tenant, [])
    with db.read() as s:
        row = {c.key: getattr(s.get(JobArray, array_id), c.key) for c in JobArray.__table__.columns}
    with db.engine.begin() as conn:
        conn.execute(text("DROP INDEX uq_arrays_tenant_idempotency_key"))
        later = row["created_at"] + timedelta(seconds=1)
        conn.execute(insert(JobArray.__table__), [{**row, "id": "arr_dup", "created_at": later}])
        cleared = migration.clear_duplicate_keys(conn)
        conn.execute(
            text(
                "CREATE UNIQUE INDEX uq_arrays_tenant_idempotency_key ON arrays (tenant_id, idempotency_key)"
            )
        )
        keys = dict(conn.execute(text("SELECT id, idempotency_key FROM arrays")).all())
    assert cleared == ["arr_dup"]
    assert keys == {array_id: KEY, "arr_dup": None}
