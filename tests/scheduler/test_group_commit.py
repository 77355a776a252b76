"""Group commit on the submit path, through the API: requests that arrive together are admitted
in one transaction, each answered with its own outcome after its own job is durable."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from api.views import render_submitted
from scheduler import billing, emulation
from scheduler.jobspec import JobSpec
from scheduler.models import Job, JobEvent, Tenant
from scheduler.runtime import Runtime
from scheduler.services.batch import submitter
from scheduler.services.batch.submitter import GroupSubmitter
from tests.support.services import Seeded

JOB = {"name": "sample", "workload": {"model": "mcmc", "task": "infer", "steps": 50}, "ipus": 1}
# Valid JSON and a valid spec, refused by admission (the emulator knows no such model).
BAD = {"name": "bad", "workload": {"model": "gpt-17", "steps": 1}, "ipus": 1}


def tenant(client: Any, seeded: Seeded, name: str, hours: float = 1000) -> tuple[str, dict[str, str]]:
    r = client.post(
        "/api/v1/admin/tenants",
        json={"name": name, "plan": "standard", "quota_ipu_hours": hours},
        headers={"Authorization": f"Bearer {seeded.admin_key}"},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"], {"Authorization": f"Bearer {r.json()['api_key']}"}


def job_cost_ipu_ms(max_runtime_s: int) -> int:
    spec = JobSpec.model_validate(JOB)
    resolved = emulation.resolve(spec.workload, spec.ipus, None)
    return billing.ipu_ms(resolved.ipus, min(resolved.predicted_runtime_s, float(max_runtime_s)))


class Commits:
    """Counts the transactions committed on the database's engine, and the job INSERTs."""

    def __init__(self, db: Any) -> None:
        self.engine = db.engine
        self.commits = 0
        self.job_inserts = 0
        self.lock = threading.Lock()

    def _commit(self, conn: Any) -> None:
        with self.lock:
            self.commits += 1

    def _execute(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO JOBS "):
            with self.lock:
                self.job_inserts += 1

    def __enter__(self) -> Commits:
        event.listen(self.engine, "commit", self._commit)
        event.listen(self.engine, "before_cursor_execute", self._execute)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "commit", self._commit)
        event.remove(self.engine, "before_cursor_execute", self._execute)


async def post_all(app: Any, bodies: list[tuple[dict[str, Any], dict[str, str]]]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as c:
        return list(await asyncio.gather(*(c.post("/api/v1/jobs", json=b, headers=h) for b, h in bodies)))


@pytest.fixture
def held(runtime: Runtime) -> Iterator[GroupSubmitter]:
    """The runtime's submitter, its writer not started: the test queues a batch, then starts it."""
    s = GroupSubmitter(runtime, render_submitted, start=False)
    runtime.extras[GroupSubmitter] = s
    yield s
    submitter.stop(runtime)


def run_as_one_batch(app: Any, held: GroupSubmitter, bodies: list[tuple[dict[str, Any], dict[str, str]]]):
    """Send the requests in order, each once the one before is queued, then start the writer:
    one batch, in the order sent."""

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as c:
            tasks = []
            deadline = time.monotonic() + 30
            for n, (body, headers) in enumerate(bodies):
                tasks.append(asyncio.ensure_future(c.post("/api/v1/jobs", json=body, headers=headers)))
                while held.queue.qsize() < n + 1:
                    assert time.monotonic() < deadline, "a request never reached the submitter"
                    await asyncio.sleep(0.005)
            held.start()
            return list(await asyncio.gather(*tasks))

    out = asyncio.run(go())
    assert held.batches == 1
    return out


def test_the_api_process_starts_its_submitter_in_its_lifespan(app: Any, runtime: Runtime) -> None:
    with TestClient(app):
        s = runtime.extras.get(GroupSubmitter)
        assert isinstance(s, GroupSubmitter) and s.thread.is_alive()
    assert GroupSubmitter not in runtime.extras and not s.thread.is_alive()
    # Its wake-up thread too: one left running per stopped submitter would publish on a closed client.
    assert not s.waker._thread.is_alive()


def test_concurrent_submissions_share_transactions_each_with_its_own_job(
    app: Any, client: Any, db: Any, seeded: Seeded, runtime: Runtime
) -> None:
    _, headers = tenant(client, seeded, "many")
    n = 48
    # Warm the caches (keys, fleet) so that what is counted is the submissions.
    assert client.post("/api/v1/jobs", json=JOB, headers=headers).status_code == 202
    with Commits(db) as counted:
        responses = asyncio.run(post_all(app, [({**JOB, "name": f"j{i}"}, headers) for i in range(n)]))
    assert [r.status_code for r in responses] == [202] * n, [
        r.text for r in responses if r.status_code != 202
    ]
    ids = [r.json()["id"] for r in responses]
    assert len(set(ids)) == n
    assert [r.json()["name"] for r in responses] == [f"j{i}" for i in range(n)]
    assert counted.job_inserts < n and counted.commits < n, (counted.commits, counted.job_inserts)
    with db.read() as s:
        assert set(s.execute(select(Job.id).where(Job.id.in_(ids))).scalars()) == set(ids)


def test_one_batch_admits_exactly_what_the_grant_allows(
    app: Any, client: Any, db: Any, seeded: Seeded, held: GroupSubmitter
) -> None:
    plan = client.get("/api/v1/admin/plans", headers={"Authorization": f"Bearer {seeded.admin_key}"}).json()
    max_runtime = next(p for p in plan["items"] if p["name"] == "standard")["max_runtime_s"]
    cost = job_cost_ipu_ms(max_runtime)
    allowed, submitted = 5, 12
    tid, headers = tenant(client, seeded, "grant", hours=(allowed * cost + cost // 2) / 3.6e6)
    responses = run_as_one_batch(app, held, [({**JOB, "name": f"q{i}"}, headers) for i in range(submitted)])
    codes = [r.status_code for r in responses]
    assert codes.count(202) == allowed, codes
    for r in responses:
        if r.status_code != 202:
            assert r.status_code == 403 and r.json()["type"] == "/problems/quota-exceeded", r.text
    with db.read() as s:
        t = s.get(Tenant, tid)
        assert t.reserved_ipu_ms == allowed * cost <= t.quota_ipu_ms
        assert (
            s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == tid)).scalar_one()
            == allowed
        )


def test_a_bad_spec_and_a_replay_in_one_batch_leave_the_others_alone(
    app: Any, client: Any, db: Any, seeded: Seeded, held: GroupSubmitter
) -> None:
    tid, headers = tenant(client, seeded, "mixed")
    keyed = {**headers, "Idempotency-Key": "build-7"}
    bodies = [
        ({**JOB, "name": "a"}, headers),
        (BAD, headers),
        ({**JOB, "name": "k"}, keyed),
        ({**JOB, "name": "b"}, headers),
        ({**JOB, "name": "k"}, keyed),  # the same key and body: replays the first
        ({**JOB, "name": "other"}, keyed),  # the same key, another body: a conflict
    ]
    a, bad, first, b, again, other = run_as_one_batch(app, held, bodies)
    assert a.status_code == b.status_code == first.status_code == 202
    assert bad.status_code == 422 and bad.headers["content-type"].startswith("application/problem+json")
    assert again.status_code == 202 and again.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert again.json() == first.json()
    assert other.status_code == 409, other.text
    with db.read() as s:
        names = sorted(s.execute(select(Job.name).where(Job.tenant_id == tid)).scalars())
    assert names == ["a", "b", "k"]
    # Across batches too: the key replays the job of the first batch.
    r = client.post("/api/v1/jobs", json={**JOB, "name": "k"}, headers=keyed)
    assert r.status_code == 202 and r.headers["Idempotent-Replayed"] == "true"
    assert r.json()["id"] == first.json()["id"]


def test_a_lone_submission_is_not_held_for_company(runtime: Runtime, db: Any, seeded: Seeded) -> None:
    """After a big batch the writer waits at most its short deadline once; a lone client then
    pays nothing (the writer commits at once when nothing else is waiting)."""
    from scheduler.services.batch.jobs import SubmitRequest
    from scheduler.services.tenancy.tenants import create_tenant
    from scheduler.settings import get_settings

    with db.write() as s:
        tid = create_tenant(session=s, secret=get_settings().secret(), name="lone", plan="standard").tenant.id
    s = GroupSubmitter(runtime, render_submitted, max_wait_s=0.5)
    try:
        spec = JobSpec.model_validate(JOB)
        s.submit(SubmitRequest(tid, spec)).result(30)  # warm up
        t0 = time.monotonic()
        s.submit(SubmitRequest(tid, spec)).result(30)
        assert time.monotonic() - t0 < 0.4
    finally:
        s.close()


def test_a_batch_waits_for_every_client_the_last_commit_saw_submitting(
    runtime: Runtime, seeded: Seeded
) -> None:
    """Two clients answered while two more queued: four are submitting, and the next batch waits (up
    to its deadline) for the answered two to come back rather than going with the two queued, which
    under a steady load would split every round of requests into two half batches."""
    from concurrent.futures import Future

    from scheduler.services.batch.jobs import SubmitRequest
    from scheduler.services.batch.submitter import _Item

    writer = GroupSubmitter(runtime, render_submitted, start=False, max_wait_s=5.0)
    request = SubmitRequest("tenant", JobSpec.model_validate(JOB))

    def put(n: int) -> None:
        for _ in range(n):
            writer.queue.put(_Item(request, Future()))

    try:
        put(2)
        first, _ = writer._collect(writer.queue.get())
        assert len(first) == 2  # nothing was expected yet: no wait
        put(2)  # queued while the first two were written
        writer._learn(first)
        returning = threading.Timer(0.2, put, args=(2,))  # the first two's next requests
        returning.start()
        started = time.monotonic()
        second, _ = writer._collect(writer.queue.get())
        assert len(second) == 4 and 0.15 < time.monotonic() - started < 4.0
        writer._learn([second[0]])  # one client left submitting: it waits for no company
        put(1)
        started = time.monotonic()
        third, _ = writer._collect(writer.queue.get())
        assert len(third) == 1 and time.monotonic() - started < 1.0
    finally:
        writer.waker.close()


def test_a_batch_reads_the_executable_cache_once_per_workload(
    runtime: Runtime, db: Any, seeded: Seeded
) -> None:
    """Twenty identical jobs in a batch: one look-up of their executable, not twenty."""
    from scheduler.services.batch import jobs
    from scheduler.services.batch.jobs import SubmitRequest, Submitted
    from scheduler.services.tenancy.tenants import create_tenant
    from scheduler.settings import get_settings

    with db.write() as s:
        tid = create_tenant(session=s, secret=get_settings().secret(), name="same", plan="standard").tenant.id
    lookups = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM executables" in statement:
            lookups.append(statement)

    spec = JobSpec.model_validate(JOB)
    event.listen(db.engine, "before_cursor_execute", count)
    try:
        with db.write() as s:
            out = jobs.submit_jobs(session=s, requests=[SubmitRequest(tid, spec) for _ in range(20)])
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    assert all(isinstance(o, Submitted) for o in out)
    assert len(lookups) == 1, lookups


def test_a_writer_reads_an_executable_seen_compiled_no_more_and_one_not_compiled_each_batch(
    runtime: Runtime, db: Any, seeded: Seeded
) -> None:
    """The writer's `CompiledKeys`: once a batch has found a workload's executable compiled, later
    batches plan it as compiled without a read; a workload not compiled is read by every batch, so
    the batch after its compile finds it."""
    from scheduler.services.batch import executables, jobs
    from scheduler.services.batch.jobs import CompiledKeys, SubmitRequest, Submitted
    from scheduler.services.tenancy.tenants import create_tenant
    from scheduler.settings import get_settings

    with db.write() as s:
        tid = create_tenant(session=s, secret=get_settings().secret(), name="memo", plan="standard").tenant.id
    lookups: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM executables" in statement:
            lookups.append(statement)

    spec = JobSpec.model_validate(JOB)
    compiled = CompiledKeys()

    def batch() -> list[Any]:
        with db.write() as s:
            out = jobs.submit_jobs(session=s, requests=[SubmitRequest(tid, spec)] * 3, compiled=compiled)
        assert all(isinstance(o, Submitted) for o in out), out
        return [o.job for o in out]

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        cold = batch()
        cold_again = batch()  # not compiled: read again
        assert len(lookups) == 2 and not compiled.keys
        with db.write() as s:  # an agent records the compile
            (kind,) = {j.machine_type or next(iter(j.options)) for j in cold}
            resolved = emulation.resolve(spec.workload, spec.ipus, kind, None)
            key = executables.tenant_key(tenant_id=tid, key=resolved.executable_key)
            compile_s = resolved.predicted_runtime_s - (resolved.cached_runtime_s or 0.0)
            executables.record(session=s, key=key, machine_type=kind, compile_s=compile_s)
        warm = batch()
        assert len(lookups) == 3 and key in compiled.keys
        warm_again = batch()
        assert len(lookups) == 3, "a key seen compiled is not read again"
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    # Planned without the compile once it is cached, the same with or without the read.
    assert cold[0].predicted_runtime_s == cold_again[0].predicted_runtime_s
    assert warm[0].predicted_runtime_s < cold[0].predicted_runtime_s
    assert warm_again[0].predicted_runtime_s == warm[0].predicted_runtime_s
    assert warm_again[0].reserved_ipu_ms == warm[0].reserved_ipu_ms < cold[0].reserved_ipu_ms


def test_only_a_keyed_job_stores_its_answer(runtime: Runtime, db: Any, seeded: Seeded) -> None:
    """The answer stored with a job is what an Idempotency-Key replay returns; a job without a key is
    never replayed, so nothing is stored for it (nor the digest a key is bound to)."""
    from scheduler.services.batch import jobs
    from scheduler.services.batch.jobs import SubmitRequest, Submitted
    from scheduler.services.tenancy.tenants import create_tenant
    from scheduler.settings import get_settings

    spec = JobSpec.model_validate(JOB)
    with db.write() as s:
        made = create_tenant(session=s, secret=get_settings().secret(), name="keyed", plan="standard")
        tid = made.tenant.id
    with db.write() as s:
        keyed, plain = jobs.submit_jobs(
            session=s,
            requests=[SubmitRequest(tid, spec, "stored-answer"), SubmitRequest(tid, spec)],
            render=render_submitted,
        )
    assert isinstance(keyed, Submitted) and isinstance(plain, Submitted)
    with db.read() as s:
        k, p = s.get(Job, keyed.job.id), s.get(Job, plain.job.id)
        assert k is not None and p is not None
        assert k.submit_response == render_submitted(keyed.job) and k.request_hash is not None
        assert p.submit_response is None and p.request_hash is None
    with db.write() as s:
        (again,) = jobs.submit_jobs(
            session=s, requests=[SubmitRequest(tid, spec, "stored-answer")], render=render_submitted
        )
    assert isinstance(again, Submitted) and again.replayed
    assert again.job.submit_response == k.submit_response


def test_a_batch_writes_its_jobs_their_first_events_and_its_reservation_in_one_statement(
    runtime: Runtime, db: Any, seeded: Seeded
) -> None:
    """However many jobs a batch admits, their rows go in by one statement: on PostgreSQL the
    reservation's guarded UPDATE with the `jobs` and `job_events` INSERTs as its CTEs, every row in
    one JSON parameter each (`db.rows_insert`), one round trip where two COPYs and the UPDATE took
    five (docs/performance.md); elsewhere one INSERT into each executed once with every row's
    parameters. Every other statement of the batch is a read. A refused job is not among the rows."""
    import json

    import psycopg

    from scheduler.services.batch import jobs
    from scheduler.services.batch.jobs import SubmitRequest, Submitted
    from scheduler.services.tenancy.tenants import create_tenant
    from scheduler.settings import get_settings

    with db.write() as s:
        tid = create_tenant(session=s, secret=get_settings().secret(), name="rows", plan="standard").tenant.id
    good, bad = JobSpec.model_validate(JOB), JobSpec.model_validate(BAD)
    requests = [SubmitRequest(tid, bad if n % 10 == 3 else good) for n in range(30)]
    statements: list[tuple[str, bool, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, params: Any, _ctx: Any, many: bool) -> None:
        statements.append((" ".join(statement.split()), many, params))

    copies: list[str] = []
    real_copy = psycopg.Cursor.copy

    def counted_copy(cursor: Any, statement: str, *args: Any, **kwargs: Any) -> Any:
        copies.append(statement)
        return real_copy(cursor, statement, *args, **kwargs)

    event.listen(db.engine, "before_cursor_execute", seen)
    psycopg.Cursor.copy = counted_copy  # type: ignore[method-assign,assignment]
    try:
        with db.write() as s:
            out = jobs.submit_jobs(session=s, requests=requests)
    finally:
        psycopg.Cursor.copy = real_copy  # type: ignore[method-assign]
        event.remove(db.engine, "before_cursor_execute", seen)
    admitted = sum(isinstance(o, Submitted) for o in out)
    assert admitted == 27, out
    writes = [(sql, many, params) for sql, many, params in statements if not sql.upper().startswith("SELECT")]
    if db.engine.dialect.name == "postgresql":
        assert copies == [] and len(writes) == 1, writes
        sql, many, params = writes[0]
        assert (
            sql.startswith("WITH jobs_in AS (INSERT INTO jobs")
            and "events_in AS (INSERT INTO job_events" in sql
        )
        assert " UPDATE tenants SET " in sql and not many
        assert (len(json.loads(params["jobs"])), len(json.loads(params["events"]))) == (27, 27)
    else:
        inserts = sorted(
            (sql.split()[2], many, len(params)) for sql, many, params in writes if sql.startswith("INSERT")
        )
        assert inserts == [("job_events", True, 27), ("jobs", True, 27)], writes
    with db.read() as s:
        ids = [o.job.id for o in out if isinstance(o, Submitted)]
        assert s.scalar(select(func.count()).select_from(Job).where(Job.id.in_(ids))) == 27
        events = select(func.count()).select_from(JobEvent).where(JobEvent.job_id.in_(ids))
        assert s.scalar(events) == 27


def _wakes(pubsub: Any, wait_s: float) -> list[str]:
    """The scheduler wake-ups heard within `wait_s`."""
    heard = []
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        m = pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if m is not None:
            heard.append(m["data"].decode())
    return heard


@pytest.fixture
def wake_channel(runtime: Runtime) -> Iterator[Any]:
    """A subscription to the scheduler's wake-up channel on the test's Redis."""
    from scheduler import bus

    client = runtime.redis
    pubsub = client.pubsub()
    pubsub.subscribe(bus.scoped(bus.WAKE_CHANNEL, client))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    yield pubsub
    pubsub.close()


def test_a_batch_wakes_the_scheduler_once_and_a_batch_of_replays_not_at_all(
    app: Any, client: Any, seeded: Seeded, held: GroupSubmitter, wake_channel: Any
) -> None:
    from scheduler.services.batch.jobs import SubmitRequest

    tid, headers = tenant(client, seeded, "woken")
    keyed = {**headers, "Idempotency-Key": "nightly-3"}
    _wakes(wake_channel, 0.2)  # whatever making the tenant published
    bodies = [({**JOB, "name": f"w{i}"}, headers) for i in range(11)] + [({**JOB, "name": "k"}, keyed)]
    responses = run_as_one_batch(app, held, bodies)
    assert [r.status_code for r in responses] == [202] * 12
    assert _wakes(wake_channel, 1.0) == ["submit"]
    # The writer is running now: a request that only replays an admitted job queues nothing new.
    replay = SubmitRequest(tid, JobSpec.model_validate({**JOB, "name": "k"}), "nightly-3")
    result, _ = held.submit(replay).result(30)
    assert result.replayed
    assert _wakes(wake_channel, 0.5) == []


def test_a_wake_asked_for_while_the_last_is_sent_is_sent_after_it(
    runtime: Runtime, wake_channel: Any
) -> None:
    """The waker coalesces: the wake-ups asked for while it publishes one and waits out its interval
    are covered by one more publication after the interval, never by none (each is asked for after a
    commit the previous publication may have preceded)."""
    from scheduler import bus

    waker = bus.CoalescingWaker("coalesced", runtime.redis_client(), interval_s=1.0)
    waker.wake()
    assert _wakes(wake_channel, 0.8) == ["coalesced"]  # after a quiet spell: at once, not after the interval
    for _ in range(5):
        waker.wake()
    assert _wakes(wake_channel, 2.5) == ["coalesced"]


def test_the_waker_outlives_a_failed_publication_and_sends_what_is_asked_before_closing(
    runtime: Runtime, wake_channel: Any
) -> None:
    """A publication that raises (here what a closed connection raises, not a RedisError) costs that
    wake-up only: the thread goes on and publishes the next. Closing publishes what is still asked for."""
    from scheduler import bus

    calls = []

    def client() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("I/O operation on closed file.")
        return runtime.redis

    waker = bus.CoalescingWaker("flaky", client, interval_s=0.05)
    waker.wake()
    deadline = time.monotonic() + 10
    while not calls:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    waker.wake()
    assert _wakes(wake_channel, 2.0) == ["flaky"]
    waker = bus.CoalescingWaker("closing", runtime.redis_client(), interval_s=60)
    waker.wake()
    assert _wakes(wake_channel, 2.0) == ["closing"]
    waker.wake()  # within its interval: sent at close, not a minute later
    waker.close()
    assert not waker._thread.is_alive()
    assert _wakes(wake_channel, 0.5) == ["closing"]
