"""Group-committed submissions judge every job exactly as a lone submission would."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from scheduler.errors import DoesNotFit, IdempotencyConflict, InvalidRequest, LimitExceeded, QuotaExceeded
from scheduler.models import Job, JobEvent, Tenant
from scheduler.services.batch import jobs
from scheduler.services.batch.jobs import SubmitRequest, Submitted
from scheduler.services.tenancy import tenants
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.scheduler.test_lifecycle import spec


def make_tenant(db: Any, name: str, hours: float) -> str:
    with db.write() as s:
        return tenants.create_tenant(
            session=s, secret=get_settings().secret(), name=name, plan="standard", quota_ipu_hours=hours
        ).tenant.id


def test_a_batch_mixes_outcomes_and_keeps_every_rule(db: Any, seeded: Any) -> None:
    rich = make_tenant(db, "rich", 1000)
    one = spec()
    with db.write() as s:
        cost = jobs.submit_job(session=s, tenant_id=rich, spec=one).job.reserved_ipu_ms
    # A tenant whose grant covers exactly two such jobs.
    poor = make_tenant(db, "poor", 2 * cost / 3.6e6)
    requests = [
        SubmitRequest(poor, one),
        SubmitRequest(poor, spec(workload={"model": "gpt-17", "steps": 1})),
        SubmitRequest(poor, one, "k"),
        SubmitRequest(poor, one, "k"),  # the same key and body again in the same batch: a replay
        SubmitRequest(poor, spec(name="other"), "k"),  # the same key, another body
        SubmitRequest(poor, one),  # the grant is spent by now
        SubmitRequest(
            rich,
            spec(
                ipus=1,
                workload={
                    "model": "bert-large",
                    "batch_size": 4096,
                    "seq_len": 512,
                    "precision": "fp32",
                    "steps": 1,
                },
            ),
        ),
        SubmitRequest(rich, one),
    ]
    with db.write() as s:
        out = jobs.submit_jobs(session=s, requests=requests)
    kinds = [type(o).__name__ for o in out]
    assert kinds == [
        "Submitted",
        "InvalidRequest",
        "Submitted",
        "Submitted",
        "IdempotencyConflict",
        "QuotaExceeded",
        "DoesNotFit",
        "Submitted",
    ]
    assert isinstance(out[1], InvalidRequest) and isinstance(out[4], IdempotencyConflict)
    assert isinstance(out[5], QuotaExceeded) and isinstance(out[6], DoesNotFit)
    first, again = out[2], out[3]
    assert isinstance(first, Submitted) and isinstance(again, Submitted)
    assert again.replayed and again.job.id == first.job.id
    with db.read() as s:
        p = s.get(Tenant, poor)
        assert p.reserved_ipu_ms == 2 * cost <= p.quota_ipu_ms
        assert s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == poor)).scalar_one() == 2
        assert s.get(Tenant, rich).reserved_ipu_ms == 2 * cost


def test_the_queued_job_limit_is_exact_and_frees_up_as_jobs_leave_the_queue(db: Any, seeded: Any) -> None:
    """Admission judges the limit on a bound it keeps under the tenant's lock and counts the queue
    only when the bound reaches the limit: submissions never pass it, and a job that leaves the
    queue makes room for exactly one more."""
    with db.write() as s:
        tenants.update_plan(session=s, name="standard", changes={"max_queued_jobs": 3})
    tid = make_tenant(db, "queuer", 1000)
    with db.write() as s:
        out = jobs.submit_jobs(session=s, requests=[SubmitRequest(tid, spec(name=f"j{i}")) for i in range(5)])
    assert [type(o).__name__ for o in out] == ["Submitted"] * 3 + ["LimitExceeded"] * 2
    assert all(isinstance(o, LimitExceeded) and o.extra["limit"] == "max_queued_jobs" for o in out[3:])
    with db.read() as s:
        assert s.get(Tenant, tid).queued_jobs_bound == 3
        # A refused job leaves nothing behind, not even its "queued" event.
        assert s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == tid)).scalar_one() == 3
        assert s.execute(select(func.count()).select_from(JobEvent)).scalar_one() == 3

    # One submission at a time, against a full queue: refused, however often it is tried.
    for _ in range(2):
        with db.write() as s:
            (o,) = jobs.submit_jobs(session=s, requests=[SubmitRequest(tid, spec(name="late"))])
        assert isinstance(o, LimitExceeded)

    first = out[0]
    assert isinstance(first, Submitted)
    with db.write() as s:
        jobs.request_cancel(session=s, job_id=first.job.id, scope=OneTenant(tid))
    with db.write() as s:
        again = jobs.submit_jobs(
            session=s, requests=[SubmitRequest(tid, spec(name="after")), SubmitRequest(tid, spec(name="x"))]
        )
    assert [type(o).__name__ for o in again] == ["Submitted", "LimitExceeded"]
    with db.read() as s:
        assert s.get(Tenant, tid).queued_jobs_bound == 3
        queued = s.execute(
            select(func.count()).select_from(Job).where(Job.tenant_id == tid, Job.state == "queued")
        ).scalar_one()
        assert queued == 3


def test_a_long_queue_is_not_counted_per_submission(db: Any, seeded: Any) -> None:
    """Far below its limit, a tenant's bound moves with what it submits and the queue is left uncounted."""
    tid = make_tenant(db, "busy", 1000)
    for n in (1, 4, 10):
        with db.write() as s:
            out = jobs.submit_jobs(
                session=s, requests=[SubmitRequest(tid, spec(name=f"b{i}")) for i in range(n)]
            )
        assert all(isinstance(o, Submitted) for o in out)
    with db.read() as s:
        assert s.get(Tenant, tid).queued_jobs_bound == 15


def _locks_tenants(statement: str) -> bool:
    # The lock's SELECT (`submit._LOCK_TENANTS`; FOR NO KEY UPDATE on PostgreSQL, a plain SELECT in
    # SQLite's immediate transaction): the only SELECT of a submission reading the queue's bound.
    return statement.lstrip().startswith("SELECT") and "tenants.queued_jobs_bound" in statement


def test_a_one_tenant_batch_its_tenant_admits_whole_takes_no_lock_of_its_own(db: Any, seeded: Any) -> None:
    """Within the grant and the queue's limit, one guarded UPDATE admits the batch (no lock's SELECT
    before it); one job more than the grant pays for, and the batch is judged job by job under the
    lock, the last one refused."""
    from sqlalchemy import event

    probe = make_tenant(db, "probe", 1000)
    one = spec()
    with db.write() as s:
        cost = jobs.submit_job(session=s, tenant_id=probe, spec=one).job.reserved_ipu_ms
    exact = make_tenant(db, "exact", 3 * cost / 3.6e6)
    over = make_tenant(db, "over", 3 * cost / 3.6e6)
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        with db.write() as s:
            whole = jobs.submit_jobs(session=s, requests=[SubmitRequest(exact, one)] * 3)
        locked_whole = [q for q in statements if _locks_tenants(q)]
        statements.clear()
        with db.write() as s:
            split = jobs.submit_jobs(session=s, requests=[SubmitRequest(over, one)] * 4)
        locked_split = [q for q in statements if _locks_tenants(q)]
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    assert [type(o).__name__ for o in whole] == ["Submitted"] * 3
    assert locked_whole == []
    assert [type(o).__name__ for o in split] == ["Submitted"] * 3 + ["QuotaExceeded"]
    assert len(locked_split) == 1, statements
    with db.read() as s:
        for tenant_id in (exact, over):
            t = s.get(Tenant, tenant_id)
            assert t.reserved_ipu_ms == 3 * cost == t.quota_ipu_ms
            assert t.queued_jobs_bound == 3
            n = s.execute(
                select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id)
            ).scalar_one()
            assert n == 3


def test_a_keys_unique_index_stops_what_the_replay_read_misses(
    db: Any, seeded: Any, monkeypatch: Any
) -> None:
    """Were the replay read to miss a key committed meanwhile, the batch's INSERT fails on the key's
    index: IdempotencyRace, nothing of the batch kept, and the retry replays the first job."""
    from scheduler.services.batch.jobs import submit as submit_module

    tenant = make_tenant(db, "keyed", 1000)
    one = spec()
    with db.write() as s:
        first = jobs.submit_job(session=s, tenant_id=tenant, spec=one, idempotency_key="nightly")
    with db.read() as s:
        held = s.get(Tenant, tenant).reserved_ipu_ms
    with monkeypatch.context() as m:
        m.setattr(submit_module, "_replays", lambda *a, **k: None)  # a unit fault: the read misses
        with db.write() as s:
            try:
                jobs.submit_jobs(
                    session=s,
                    requests=[SubmitRequest(tenant, one), SubmitRequest(tenant, one, "nightly")],
                )
            except jobs.IdempotencyRace:
                raced = True
            else:
                raced = False
            assert raced
            s.rollback()
    with db.read() as s:
        assert (
            s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == tenant)).scalar_one() == 1
        )
        assert s.execute(select(func.count()).select_from(JobEvent)).scalar_one() >= 1
        assert s.get(Tenant, tenant).reserved_ipu_ms == held
    with db.write() as s:
        again = jobs.submit_job(session=s, tenant_id=tenant, spec=one, idempotency_key="nightly")
    assert again.replayed and again.job.id == first.job.id


def test_rows_sent_as_json_read_back_as_written_and_are_refused_as_an_inserts(db: Any, seeded: Any) -> None:
    """The submit path's rows go to PostgreSQL as one JSON parameter a table (`db.rows_insert`): what
    it writes reads back as an INSERT's would (JSON with escapes and nulls, newlines, timestamps to
    the microsecond, floats), None in a JSON column is JSON's null as SQLAlchemy writes it, and what
    an INSERT refuses (a foreign key, a value too long for its column, a NUL) is refused with
    SQLAlchemy's error class, which the submit path (a key's race) and the API's handlers know."""
    import pytest
    from sqlalchemy import text
    from sqlalchemy.exc import DataError

    from scheduler.db import rows_insert, rows_json
    from scheduler.models import JobEvent, utcnow

    if db.engine.dialect.name != "postgresql":
        pytest.skip("json_to_recordset: PostgreSQL only")

    def insert_events(s: Any, rows: list[dict[str, Any]]) -> None:
        statement, plan = rows_insert(JobEvent.__table__, tuple(rows[0]), "rows", s.get_bind().dialect)
        s.execute(statement, {"rows": rows_json(plan, rows)})

    event = {
        "job_id": "job_none",
        "kind": "state",
        "message": "m",
        "data": None,
        "at": utcnow(),
        "attempt": None,
    }
    with pytest.raises(IntegrityError), db.write() as s:
        insert_events(s, [event])  # no such job: its foreign key refuses
    tenant = make_tenant(db, "jsoned", 1000)
    with db.write() as s:
        (done,) = jobs.submit_jobs(session=s, requests=[SubmitRequest(tenant, spec(name="jsoned"))])
        assert isinstance(done, jobs.Submitted)
    job_id = done.job.id
    with pytest.raises(DataError), db.write() as s:
        insert_events(s, [{**event, "job_id": job_id, "message": "x" * 2001}])  # VARCHAR(2000)
    with pytest.raises(DataError), db.write() as s:
        insert_events(s, [{**event, "job_id": job_id, "message": "nul\x00"}])
    at = utcnow()
    data = {"nested": {"list": [1, 2.5, None, 1e-300], "text": 'naïve "quoted" \\ tab\t \u2028'}}
    with db.write() as s:
        insert_events(
            s,
            [
                {**event, "job_id": job_id, "data": data, "at": at, "message": "line\nbreak", "attempt": 3},
                {**event, "job_id": job_id, "message": "no data"},
            ],
        )
    with db.read() as s:
        (row,) = s.execute(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.message == "line\nbreak")
        ).scalars()
        assert row.data == data and row.at == at and row.attempt == 3
        null = s.execute(
            text("SELECT data IS NULL, data::text FROM job_events WHERE job_id = :j AND message = 'no data'"),
            {"j": job_id},
        ).one()
        assert tuple(null) == (False, "null"), "JSON's null, as SQLAlchemy writes None, not SQL's NULL"
        stored = s.get(Job, job_id)
        assert stored is not None and stored.spec == done.job.spec and stored.options == done.job.options
        assert (
            stored.created_at == done.job.created_at
            and stored.predicted_runtime_s == done.job.predicted_runtime_s
        )
