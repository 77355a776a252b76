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
from scheduler.models import Job, Tenant
from scheduler.runtime import Runtime
from scheduler.services import submitter
from scheduler.services.submitter import GroupSubmitter
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
    from scheduler.services.jobs import SubmitRequest
    from scheduler.services.tenants import create_tenant
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


def test_a_batch_reads_the_executable_cache_once_per_workload(
    runtime: Runtime, db: Any, seeded: Seeded
) -> None:
    """Twenty identical jobs in a batch: one look-up of their executable, not twenty."""
    from scheduler.services import jobs
    from scheduler.services.jobs import SubmitRequest, Submitted
    from scheduler.services.tenants import create_tenant
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
