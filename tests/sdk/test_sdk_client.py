"""The Python SDK against a cloud in real processes (sync and async), plus its retry and resume rules."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

import ipucloud
from ipucloud.sdk import (
    AuthError,
    InvalidRequestError,
    NotFoundError,
    QuotaError,
    RateLimitError,
    RetryPolicy,
    ServiceUnreachable,
)
from tests.support.cloud import RunningCloud
from tests.support.services import seed

R50: dict[str, Any] = {"model": "resnet50", "batch_size": 64, "steps": 200}


class TestOneCloud:
    """Both clients against one running cloud (`shared_cloud`), each as a tenant of its own."""

    @pytest.mark.e2e
    def test_sync_client_submits_follows_pages_and_meters(self, shared_cloud: RunningCloud) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("sdk-sync")
        with ipucloud.Client(cloud.url, key) as c:
            names = {w.name for w in c.workloads().items}
            assert {"bert-base", "bert-large", "resnet50", "mcmc"} <= names
            est = c.estimate(**R50, ipus=4)
            assert est.fits and est.ipu_hours and est.ipu_hours > 0 and est.expected_wait_s == 0
            served = c.estimate(
                model="resnet50", task="infer", ipus=1, machine="m2000", serve_batch_sizes=[1, 8]
            )
            assert served.serve and [r.batch_size for r in served.serve] == [1, 8]
            one, eight = served.serve
            assert one.latency_ms and eight.latency_ms and one.latency_ms < eight.latency_ms
            assert served.serve_plan and served.serve_plan["max_batch_size"] == 8

            job = c.submit_job(name="sdk-r50", ipus=4, **R50)
            assert isinstance(job, ipucloud.Job) and job.state == "queued" and job.ipus == 4

            events = list(c.stream_logs(job.id, timeout=120))
            assert events[-1].event == "end" and events[-1].state == "succeeded"
            entries = [e.entry for e in events if e.event == "state" and e.entry is not None]
            states = [x.data["state"] for x in entries if x.data and x.data.get("state")]
            assert states[0] == "queued" and "running" in states and states[-1] == "succeeded"
            percents = [
                e.progress.percent
                for e in events
                if e.progress is not None and e.progress.percent is not None
            ]
            assert percents and percents == sorted(percents), "progress only moves forward"
            ids = [e.id for e in events if e.event in ("state", "log")]
            assert ids == sorted(set(ids)), "each event once, in order"

            done = c.get_job(job.id)
            assert (
                done.state == "succeeded"
                and done.partition
                and done.used_ipu_hours
                and done.used_ipu_hours > 0
            )
            assert done.history and done.history[-1].state == "succeeded"
            assert [e.id for e in c.iter_logs(job.id, page_size=3)] == [
                e.id for e in c.job_logs(job.id).items
            ]

            usage = c.usage()
            assert usage.used_ipu_hours == pytest.approx(done.used_ipu_hours, rel=1e-3)
            assert usage.remaining_ipu_hours < usage.quota_ipu_hours
            assert "job_id" in c.usage_csv().splitlines()[0]

            # The spec's own shape as keywords: `workload={...}` (it used to be dropped, a 422).
            shaped = c.submit_job(name="shaped", workload={"model": "bert-large", "steps": 100000}, ipus=16)
            assert shaped.workload["model"] == "bert-large" and shaped.workload["steps"] == 100000
            assert c.cancel_job(shaped.id).cancel_requested
            more = [
                c.submit_job(name=f"q{i}", model="bert-large", steps=100000, ipus=16).id for i in range(4)
            ]
            page = c.list_jobs(limit=2)
            assert len(page.items) == 2 and page.next_cursor
            every = [j.id for j in c.iter_jobs(page_size=2)]
            assert every == [*reversed(more), shaped.id, job.id], "newest first, every job once, across pages"
            assert [j.id for j in c.iter_jobs(state="succeeded")] == [job.id]
            for jid in more:
                assert c.cancel_job(jid).cancel_requested

        errors_carry_the_problem_body(cloud)

    @pytest.mark.e2e
    def test_async_client_follows_a_job_and_pages(self, shared_cloud: RunningCloud) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("sdk-async")

        async def scenario() -> None:
            async with ipucloud.AsyncClient(cloud.url, key) as c:
                job = await c.submit_job(name="async-r50", ipus=2, **R50)
                events = [e async for e in c.stream_logs(job.id, timeout=120)]
                assert events[-1].state == "succeeded"
                assert any(e.event == "progress" for e in events)
                done = await c.wait_job(job.id, timeout=60, poll_s=0.2)
                assert done.state == "succeeded"
                queued = [
                    await c.submit_job(name=f"a{i}", model="bert-large", steps=100000, ipus=16)
                    for i in range(3)
                ]
                seen = [j.id async for j in c.iter_jobs(page_size=2)]
                assert seen == [*(j.id for j in reversed(queued)), job.id]
                with pytest.raises(NotFoundError):
                    await c.cancel_job("job_nope")
                assert (await c.usage()).used_ipu_hours > 0

        asyncio.run(scenario())


@pytest.mark.e2e
def test_rate_limited_requests_are_retried_after_the_servers_delay(
    env: dict[str, str], db: Any, tmp_path: Path
) -> None:
    seeded = seed(db, pods=1)
    with RunningCloud.start(
        env, tmp_path, admin_key=seeded.admin_key, extra_env={"IPUCLOUD_RATE_LIMIT": "3/second"}
    ) as cloud:
        slept: list[float] = []
        patient = RetryPolicy(max_retries=5, sleep=lambda s: (slept.append(s), __import__("time").sleep(s)))
        with ipucloud.Client(cloud.url, cloud.admin_key, retry=patient) as c:
            for _ in range(8):
                assert c.fleet(pods=1).pods[0].id == "pod0000"
        assert slept and all(1.0 <= s <= 2.0 for s in slept), "waited what Retry-After said"

        with (
            ipucloud.Client(cloud.url, cloud.admin_key, retry=RetryPolicy(max_retries=0)) as impatient,
            pytest.raises(RateLimitError) as limited,
        ):
            for _ in range(10):
                impatient.fleet(pods=1)
        assert limited.value.status == 429 and limited.value.retry_after and limited.value.retry_after >= 1


# The client's own rules, against a scripted server (no cloud needed) ------------------------------------


def test_a_retried_submission_reuses_its_idempotency_key() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["idempotency-key"])
        if len(seen) == 1:
            return httpx.Response(503, headers={"Retry-After": "0"}, json={"title": "Service unavailable"})
        return httpx.Response(202, json={"id": "job_1", "name": "x", "state": "queued", "ipus": 1})

    slept: list[float] = []
    with ipucloud.Client(
        "http://cloud.test",
        "k",
        transport=httpx.MockTransport(handler),
        retry=RetryPolicy(sleep=slept.append),
    ) as c:
        assert c.submit_job(name="x", model="mcmc", ipus=1).id == "job_1"
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0].startswith("sdk-")
    assert slept == [0.0]


def test_a_dropped_log_stream_resumes_after_the_last_event() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if len(requests) == 1:
            body = (
                b'id: 1\nevent: state\ndata: {"id": 1, "at": "2026-01-01T00:00:00Z", "kind": "state", '
                b'"message": "queued", "data": {"state": "queued"}}\n\n'
                b'event: progress\ndata: {"percent": 10.0}\n\n'
                b'id: 2\nevent: log\ndata: {"id": 2, "at": "2026-01-01T00:00:01Z", "kind": "log", '
                b'"message": "step 1"}\n\n'
            )
        else:
            body = b': keep-alive\n\nevent: end\ndata: {"state": "failed"}\n\n'
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with ipucloud.Client(
        "http://cloud.test",
        "k",
        transport=httpx.MockTransport(handler),
        retry=RetryPolicy(sleep=lambda s: None),
    ) as c:
        events = list(c.stream_logs("job_1"))
    assert [e.event for e in events] == ["state", "progress", "log", "end"]
    assert events[1].progress is not None and events[1].progress.percent == 10.0
    assert events[2].entry is not None and events[2].entry.message == "step 1"
    assert events[-1].state == "failed"
    assert "last-event-id" not in requests[0].headers
    assert requests[1].headers["last-event-id"] == "2"
    assert requests[0].headers["accept"] == "text/event-stream"


def test_retry_after_as_an_http_date_and_the_config_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time
    from email.utils import formatdate

    from ipucloud.sdk._core import retry_after
    from ipucloud.sdk.config import resolve, save_config

    r = httpx.Response(429, headers={"Retry-After": formatdate(time.time() + 30, usegmt=True)})
    assert 25 <= (retry_after(r) or 0) <= 31
    assert retry_after(httpx.Response(429, headers={"Retry-After": "soon"})) is None

    monkeypatch.setenv("IPUCLOUD_CONFIG", str(tmp_path / "c.json"))
    monkeypatch.delenv("IPUCLOUD_URL", raising=False)
    monkeypatch.delenv("IPUCLOUD_API_KEY", raising=False)
    save_config("http://file.test/", "from-file")
    assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o600
    assert resolve() == resolve(None, None)
    assert (resolve().url, resolve().key) == ("http://file.test", "from-file")
    monkeypatch.setenv("IPUCLOUD_URL", "http://env.test")
    monkeypatch.setenv("IPUCLOUD_API_KEY", "from-env")
    assert (resolve().url, resolve().key) == ("http://env.test", "from-env")
    assert (resolve("http://arg.test", "from-arg").url, resolve("http://arg.test", "from-arg").key) == (
        "http://arg.test",
        "from-arg",
    )


def errors_carry_the_problem_body(cloud: RunningCloud) -> None:
    _, key = cloud.create_tenant("sdk-poor", quota_ipu_hours=0.001)
    with ipucloud.Client(cloud.url, key) as c:
        with pytest.raises(NotFoundError) as missing:
            c.get_job("job_doesnotexist")
        assert missing.value.status == 404 and missing.value.type == "/problems/not-found"
        assert missing.value.slug == "not-found" and "job_doesnotexist" in missing.value.detail
        assert missing.value.title

        with pytest.raises(InvalidRequestError) as invalid:
            c.submit_job(name="x", model="resnet50", steps=3, ipus=3)
        assert invalid.value.status == 422 and invalid.value.extra["errors"][0]["field"]

        with pytest.raises(QuotaError) as quota:
            c.submit_job(name="big", model="bert-large", steps=100000, ipus=16)
        assert quota.value.status == 403 and quota.value.slug == "quota-exceeded"
        assert quota.value.extra["remaining_ipu_hours"] <= 0.001

        with pytest.raises(AuthError):
            c.fleet()
        assert isinstance(quota.value, ipucloud.ApiError)

    with ipucloud.Client(cloud.url, "ipuc_" + "A" * 61) as bad, pytest.raises(AuthError) as auth:
        bad.list_jobs()
    assert auth.value.status == 401 and "checksum" in auth.value.detail

    fast = RetryPolicy(max_retries=1, backoff_s=0.01)
    with ipucloud.Client("http://127.0.0.1:9", key, retry=fast) as down, pytest.raises(ServiceUnreachable):
        down.list_jobs()


def test_both_clients_send_the_same_requests_from_one_description() -> None:
    """Each operation is written once (`ipucloud.sdk._api.Operations`): the async client sends what the
    sync one sends, and pages the same way."""
    import inspect

    from ipucloud.sdk._api import Operations

    jobs = [{"id": f"job_{i}", "name": "x", "state": "queued", "ipus": 1} for i in range(3)]
    sent: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((request.method, str(request.url)))
        if request.url.path == "/api/v1/jobs":
            start = int(request.url.params.get("cursor") or 0)
            nxt = str(start + 2) if start + 2 < len(jobs) else None
            return httpx.Response(200, json={"items": jobs[start : start + 2], "next_cursor": nxt})
        return httpx.Response(200, json=jobs[0])

    with ipucloud.Client("http://cloud.test", "k", transport=httpx.MockTransport(handler)) as c:
        sync_ids = [j.id for j in c.iter_jobs(page_size=2)] + [c.cancel_job("a/b").id]
    sync_sent, sent[:] = list(sent), []

    async def run() -> list[str]:
        async with ipucloud.AsyncClient(
            "http://cloud.test", "k", transport=httpx.MockTransport(handler)
        ) as a:
            return [j.id async for j in a.iter_jobs(page_size=2)] + [(await a.cancel_job("a/b")).id]

    assert asyncio.run(run()) == sync_ids == ["job_0", "job_1", "job_2", "job_0"]
    assert sent == sync_sent and sync_sent[-1] == ("POST", "http://cloud.test/api/v1/jobs/a%2Fb/cancel")

    c, a = ipucloud.Client("http://cloud.test", "k"), ipucloud.AsyncClient("http://cloud.test", "k")
    # `Operations` is assembled from one class per area (`_ops_*.py`): read every one of them.
    shared = [
        n
        for ops in Operations.__mro__
        for n, v in vars(ops).items()
        if not n.startswith("_") and hasattr(v, "build")
    ]
    assert len(shared) > 50
    for name in shared:
        sync, aio = getattr(c, name), getattr(a, name)
        assert inspect.signature(sync).parameters == inspect.signature(aio).parameters, name
        assert sync.__doc__ == aio.__doc__, name
        assert inspect.iscoroutinefunction(aio) or inspect.isasyncgenfunction(aio), name


@pytest.mark.e2e
def test_a_method_added_once_reaches_both_clients() -> None:
    """`get_plan` was added as one `Operations` method (docs/architecture.md, "Adding a route")."""
    plan = {"name": "trial", "quota_ipu_hours": 100, "priority": 0, "max_partition_size": 16}
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        return httpx.Response(200, json=plan)

    with ipucloud.Client("http://cloud.test", "k", transport=httpx.MockTransport(handler)) as c:
        got = c.get_plan("trial")
    assert got.name == "trial" and got.quota_ipu_hours == 100

    async def run() -> str:
        async with ipucloud.AsyncClient(
            "http://cloud.test", "k", transport=httpx.MockTransport(handler)
        ) as a:
            return (await a.get_plan("trial")).name

    assert asyncio.run(run()) == "trial"
    assert sent == ["GET /api/v1/admin/plans/trial"] * 2
