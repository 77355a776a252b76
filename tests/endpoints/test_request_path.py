"""The request path alone: the API's v2 routes, the Redis protocol and a host's model servers, with a
route published by hand (no control plane, no database per request). Real Redis, the real app.

What it proves: answers carry the plan's latency and the graph's output shapes, deterministic for
the same inputs; batches form under concurrency and never exceed max_batch_size; 429 past
max_queue; 503 after the cold start timeout with no replica; a replica's requests in flight are
answered 503 once and never twice when it is gone; a draining replica's unstarted requests are answered
404 at once when the endpoint stops under it; malformed tensors get 400 in the protocol's shape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from scheduler import inference
from scheduler.clock import Clock
from scheduler.inference import Route
from vipu import emulator
from workers.serving import ServingHost

ENDPOINT = "ep_path1"
TIME_SCALE = 100.0


def _plan(model: str = "resnet50", batch: int = 8) -> emulator.ServePlan:
    spec = emulator.WorkloadSpec(model=model, task="infer", precision="fp16")
    return emulator.serve_plan(spec, machine="m2000", ipus=1, max_batch_size=batch)


def _route(plan: emulator.ServePlan, tenant_id: str, **over: Any) -> Route:
    values: dict[str, Any] = {
        "endpoint_id": ENDPOINT,
        "tenant_id": tenant_id,
        "name": "classifier",
        "state": "ready",
        "signature": plan.signature.to_dict(),
        "max_batch_size": plan.max_batch_size,
        "max_wait_ms": 2.0,
        "max_queue": 1000,
        "cold_start_timeout_s": 60.0,
    }
    values.update(over)
    return Route(**values)


@pytest.fixture
def tenant(client: Any, seeded: Any) -> tuple[str, str]:
    r = client.post(
        "/api/v1/admin/tenants",
        json={"name": "servers", "plan": "standard", "quota_ipu_hours": 100},
        headers={"Authorization": f"Bearer {seeded.admin_key}"},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["api_key"]


@pytest.fixture
def scaled(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tests.support.services import reload_settings

    monkeypatch.setenv("IPUCLOUD_TIME_SCALE", str(TIME_SCALE))
    reload_settings(runtime)
    return runtime


@pytest.fixture
def host(scaled: Any) -> Iterator[ServingHost]:
    h = ServingHost(scaled.settings.broker_url)
    h.start()
    yield h
    h.close()


def _image(batch: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((batch, 3, 224, 224)).astype(np.float16)
    return {
        "name": "images",
        "datatype": "FP16",
        "shape": list(data.shape),
        "data": data.reshape(-1).tolist(),
    }


def _infer(client: Any, key: str, inputs: list[dict[str, Any]], **extra: Any) -> Any:
    return client.post(
        f"/api/v1/endpoints/{ENDPOINT}/v2/models/classifier/infer",
        json={"inputs": inputs, **extra},
        headers={"Authorization": f"Bearer {key}"},
    )


def _timing(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def test_answers_carry_the_plans_latency_and_the_graphs_outputs(
    client: Any, tenant: tuple[str, str], host: ServingHost, scaled: Any
) -> None:
    tenant_id, key = tenant
    plan = _plan()
    inference.publish_route(scaled.redis, _route(plan, tenant_id, max_wait_ms=0.0))
    host.add(attempt_id=7, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(TIME_SCALE),
             ready_at=time.time())  # fmt: skip
    auth = {"Authorization": f"Bearer {key}"}
    meta = client.get(f"/api/v1/endpoints/{ENDPOINT}/v2/models/classifier", headers=auth)
    assert meta.status_code == 200
    assert meta.json()["inputs"] == [{"name": "images", "datatype": "FP16", "shape": [-1, 3, 224, 224]}]
    deadline = time.time() + 10
    while client.get(f"/api/v1/endpoints/{ENDPOINT}/v2/health/ready", headers=auth).status_code != 200:
        assert time.time() < deadline, "the replica never became ready"
        time.sleep(0.05)

    first = _infer(client, key, [_image(2)])
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["model_name"] == "classifier"
    (out,) = body["outputs"]
    assert out["name"] == "logits" and out["shape"] == [2, 1000] and len(out["data"]) == 2000
    timing = _timing(first.headers["server-timing"])
    times = plan.times(2)
    assert timing["ipu"] == pytest.approx(times.device_s * 1000, rel=1e-3)
    assert timing["host"] == pytest.approx((times.host_call_s + times.host_s) * 1000, rel=1e-3)
    assert first.headers["x-ipucloud-batch-size"] == "2"
    assert first.headers["x-ipucloud-replica"] == "7"
    # The same inputs give the same outputs; other inputs others.
    again = _infer(client, key, [_image(2)])
    assert again.json()["outputs"][0]["data"] == out["data"]
    other = _infer(client, key, [_image(2, seed=1)])
    assert other.json()["outputs"][0]["data"] != out["data"]


def test_a_key_in_steady_use_is_checked_again_before_its_cached_entry_expires(
    client: Any, tenant: tuple[str, str], host: ServingHost, scaled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path serves only keys verified moments ago (a 2 s cache); an entry that expired sent its
    next request through FastAPI's whole stack and a database read, every two seconds in every API
    process: a stall in the endpoint's p99 at one connection. A key in the second half of its entry's
    life is checked again off the loop, so its requests never find it expired; a key revoked meanwhile
    (by another process: this one has not dropped it) is dropped by that check."""
    from sqlalchemy import update

    from scheduler.model_base import utcnow
    from scheduler.models import ApiKey
    from scheduler.services.tenancy import keys

    tenant_id, key = tenant
    plan = _plan()
    inference.publish_route(scaled.redis, _route(plan, tenant_id, max_wait_ms=0.0))
    host.add(
        attempt_id=9, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(TIME_SCALE), ready_at=time.time()
    )
    auth = {"Authorization": f"Bearer {key}"}
    deadline = time.time() + 10
    while client.get(f"/api/v1/endpoints/{ENDPOINT}/v2/health/ready", headers=auth).status_code != 200:
        assert time.time() < deadline, "the replica never became ready"
        time.sleep(0.05)
    skew = [0.0]
    monkeypatch.setattr(keys.key_cache, "clock", lambda: time.monotonic() + skew[0])
    lookup = keys.parse_key(key)
    assert _infer(client, key, [_image(1)]).status_code == 200  # cached now, on the skewed clock
    first = keys.key_cache._entries[lookup][0]
    app = client.app
    stack = app.middleware_stack or app.build_middleware_stack()
    entered: list[str] = []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        entered.append(scope.get("path", ""))
        await stack(scope, receive, send)

    app.middleware_stack = counting

    def renewed_after(before: float) -> float:
        until = time.time() + 10
        while keys.key_cache._entries.get(lookup, (before,))[0] <= before:
            assert time.time() < until, "the key was not checked again"
            time.sleep(0.01)
        # The check renews the entry, then may still write the key's last use; until it is done the next
        # due request starts none of its own (one check a key at a time). On a loaded machine that write
        # outlasted the next request, whose check was then never made.
        while app.fast_infer._refreshing:
            assert time.time() < until, "the key's check never finished"
            time.sleep(0.01)
        return keys.key_cache._entries[lookup][0]

    def into_second_half(deadline: float) -> None:
        # Relative to the entry, not to the last skew: time the machine spent between two requests
        # (a loaded one) must not carry the clock past the entry's deadline.
        skew[0] = deadline - 0.3 * keys.key_cache.ttl - time.monotonic()

    into_second_half(first)
    assert _infer(client, key, [_image(1)]).status_code == 200
    second = renewed_after(first)
    into_second_half(second)  # past the first entry's deadline: second >= first + 0.6 ttl
    assert keys.key_cache.clock() > first
    assert _infer(client, key, [_image(1)]).status_code == 200
    assert entered == [], "a key in steady use found its entry expired"
    # That request found the renewed entry in its second half too: its check runs off the loop, and the
    # revocation below must come after it (a check reading the revoked row would drop the key first).
    third = renewed_after(second)

    with scaled.db.write() as s:
        s.execute(update(ApiKey).where(ApiKey.lookup == lookup).values(revoked_at=utcnow()))
    into_second_half(third)
    assert _infer(client, key, [_image(1)]).status_code == 200  # the entry is live: served, then checked
    until = time.time() + 10
    while lookup in keys.key_cache._entries:
        assert time.time() < until, "the revoked key stayed cached"
        time.sleep(0.01)
    assert _infer(client, key, [_image(1)]).status_code == 401


def test_the_fast_path_answers_before_fastapis_stack_runs(
    client: Any, tenant: tuple[str, str], host: ServingHost, scaled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A v2 infer call from a cached key never enters FastAPI's middleware stack (its error, telemetry
    and body-limit layers and ours): counted by wrapping the stack. Every other request still does."""
    tenant_id, key = tenant
    plan = _plan()
    inference.publish_route(scaled.redis, _route(plan, tenant_id, max_wait_ms=0.0))
    host.add(
        attempt_id=8, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(TIME_SCALE), ready_at=time.time()
    )
    auth = {"Authorization": f"Bearer {key}"}
    deadline = time.time() + 10
    while client.get(f"/api/v1/endpoints/{ENDPOINT}/v2/health/ready", headers=auth).status_code != 200:
        assert time.time() < deadline, "the replica never became ready"
        time.sleep(0.05)
    assert _infer(client, key, [_image(1)]).status_code == 200  # the key is now in the cache
    app = client.app
    stack = app.middleware_stack or app.build_middleware_stack()
    entered: list[str] = []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        entered.append(scope.get("path", ""))
        await stack(scope, receive, send)

    app.middleware_stack = counting
    for _ in range(3):
        r = _infer(client, key, [_image(1)])
        assert r.status_code == 200, r.text
        assert r.headers["x-content-type-options"] == "nosniff" and "server-timing" in r.headers
    refused = _infer(client, key, [{"name": "images", "datatype": "FP32", "shape": [1], "data": [1.0]}])
    assert refused.status_code == 400 and "error" in refused.json()
    assert entered == []
    assert client.get(f"/api/v1/endpoints/{ENDPOINT}/v2/health/ready", headers=auth).status_code == 200
    assert entered == [f"/api/v1/endpoints/{ENDPOINT}/v2/health/ready"]
    # What FastAPI's ServerErrorMiddleware did for it, the fast path does itself: a 500 problem.
    from api import inference as api_inference

    def broken(*args: Any) -> Any:
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(api_inference, "render_response", broken)
    failed = _infer(client, key, [_image(1)])
    assert failed.status_code == 500
    assert failed.json()["type"] == "/problems/internal-error"
    assert failed.headers["x-content-type-options"] == "nosniff"
    assert entered == [f"/api/v1/endpoints/{ENDPOINT}/v2/health/ready"]


def test_concurrent_requests_form_batches_within_max_batch_size(
    client: Any, tenant: tuple[str, str], host: ServingHost, scaled: Any
) -> None:
    tenant_id, key = tenant
    plan = _plan(batch=4)
    inference.publish_route(scaled.redis, _route(plan, tenant_id, max_wait_ms=5.0))
    # The replica's device runs on the requests' timeline: at TIME_SCALE the in-process API's requests,
    # parsed tens of wall milliseconds apart, are seconds apart on the chip and rightly never share a
    # batch. At this clock they arrive together (a wall millisecond is 10 emulated microseconds).
    host.add(attempt_id=8, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(0.01), ready_at=time.time())
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda i: _infer(client, key, [_image(1, i)]), range(32)))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
    sizes = [int(r.headers["x-ipucloud-batch-size"]) for r in replies]
    assert max(sizes) <= 4
    assert max(sizes) > 1, "concurrent requests were never batched"
    for r in replies:
        t = _timing(r.headers["server-timing"])
        assert t["batch"] <= 5.0 + 1e-6
        b = int(r.headers["x-ipucloud-batch-size"])
        assert t["ipu"] == pytest.approx(plan.times(b).device_s * 1000, rel=1e-3)
    time.sleep(0.6)  # the replica's counters are written a few times a second
    w = inference.windows(scaled.redis, [ENDPOINT])[ENDPOINT]
    assert w.answered == 32 and w.requests == 32
    assert 1 < w.mean_batch <= 4
    assert w.p50_ms is not None and w.p99_ms is not None and w.p50_ms <= w.p99_ms
    assert w.ready_replicas == 1
    # Prometheus reads the same counters: any API process reports the whole endpoint.
    text = client.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("ipucloud_endpoint_ready_replicas{"))
    assert f'endpoint="{ENDPOINT}"' in line and line.endswith(" 1.0")
    assert any(
        x.startswith("ipucloud_endpoint_latency_ms{") and 'quantile="0.99"' in x for x in text.splitlines()
    )


def test_a_full_queue_answers_429_with_retry_after(client: Any, tenant: tuple[str, str], scaled: Any) -> None:
    tenant_id, key = tenant
    plan = _plan()
    inference.publish_route(scaled.redis, _route(plan, tenant_id, max_queue=2, cold_start_timeout_s=1.0))
    # No replica: the first two wait in the queue, the third finds it full.
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(_infer(client, key, [_image(1)]))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    deadline = time.time() + 5
    while scaled.redis.llen(inference.queue_key(ENDPOINT)) < 2:
        assert time.time() < deadline
        time.sleep(0.01)
    full = _infer(client, key, [_image(1)])
    assert full.status_code == 429
    assert int(full.headers["retry-after"]) >= 1
    assert "queue is full" in full.json()["error"]
    for t in threads:
        t.join()
    # Nobody served them within the cold start timeout: 503, with Retry-After.
    assert [r.status_code for r in results] == [503, 503]
    assert "cold start" in results[0].json()["error"]
    assert int(results[0].headers["retry-after"]) >= 1
    w = inference.windows(scaled.redis, [ENDPOINT])[ENDPOINT]
    assert w.rejected_429 == 1 and w.cold_starts == 2


def test_a_lost_replicas_requests_are_answered_503_once(
    client: Any, tenant: tuple[str, str], host: ServingHost, scaled: Any
) -> None:
    tenant_id, key = tenant
    # A slow model at a slow clock: the batch is in flight for long enough to lose its replica.
    spec = emulator.WorkloadSpec(model="bert-large", task="infer", seq_len=384, precision="fp16")
    plan = emulator.serve_plan(spec, machine="m2000", ipus=4, max_batch_size=4)
    inference.publish_route(scaled.redis, _route(plan, tenant_id, name="classifier", max_wait_ms=0.0))
    host.add(attempt_id=9, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(plan.latency_s(1) / 3.0),
             ready_at=time.time())  # fmt: skip
    ids = np.zeros((1, 384), dtype=np.int64).reshape(-1).tolist()
    inputs = [{"name": n, "datatype": "INT64", "shape": [1, 384], "data": ids}
              for n in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(_infer(client, key, inputs)))
    t.start()
    inflight = inference.inflight_key(ENDPOINT, 9)
    deadline = time.time() + 5
    while scaled.redis.llen(inflight) == 0:
        assert time.time() < deadline, "the request never reached the replica"
        time.sleep(0.01)
    host.drop(9)  # its host's lease is gone: it answers nothing more
    # Found not running: failed over once it has stayed so for the grace (a drain would answer first).
    assert inference.reap_inflight(scaled.redis, ENDPOINT, live_attempt_ids=[], grace_s=0.2) == 0
    assert inference.reap_inflight(scaled.redis, ENDPOINT, live_attempt_ids=[], grace_s=0.2) == 0
    time.sleep(0.25)
    assert inference.reap_inflight(scaled.redis, ENDPOINT, live_attempt_ids=[], grace_s=0.2) == 1
    t.join(10)
    assert result and result[0].status_code == 503
    assert "lost" in result[0].json()["error"]
    # Counted before it was answered: whoever reads the counters once a client has its 503 (the
    # fault test reads them right after a DELETE) finds it there, not a flush later.
    assert inference.windows(scaled.redis, [ENDPOINT])[ENDPOINT].unavailable_503 == 1
    assert inference.reap_inflight(scaled.redis, ENDPOINT, live_attempt_ids=[]) == 0
    # The answer the dropped replica would have sent never comes: the reply list stays empty.
    time.sleep(3.5)
    assert scaled.redis.keys(inference.REPLY_PREFIX + "*") == []


def test_a_replica_lost_after_its_endpoint_stopped_is_reaped_by_the_serve_pass(
    client: Any, tenant: tuple[str, str], host: ServingHost, scaled: Any, db: Any
) -> None:
    """The serve pass reaped only live endpoints' replicas: one lost after its endpoint stopped left
    the requests it held to wait out the API's timeout (30 s and the cold start, then 503) and its
    keys in Redis for good."""
    from scheduler.loop import SchedulerLoop
    from tests.scheduler.test_lifecycle import FakeCelery

    tenant_id, key = tenant
    spec = emulator.WorkloadSpec(model="bert-large", task="infer", seq_len=384, precision="fp16")
    plan = emulator.serve_plan(spec, machine="m2000", ipus=4, max_batch_size=4)
    inference.publish_route(scaled.redis, _route(plan, tenant_id, name="classifier", max_wait_ms=0.0))
    # A minute a batch: the request is held for as long as the test runs, unless it is reaped.
    host.add(attempt_id=11, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(plan.latency_s(1) / 60.0),
             ready_at=time.time())  # fmt: skip
    ids = np.zeros((1, 384), dtype=np.int64).reshape(-1).tolist()
    inputs = [{"name": n, "datatype": "INT64", "shape": [1, 384], "data": ids}
              for n in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(_infer(client, key, inputs)))
    t.start()
    inflight = inference.inflight_key(ENDPOINT, 11)
    deadline = time.time() + 5
    while scaled.redis.llen(inflight) == 0:
        assert time.time() < deadline, "the request never reached the replica"
        time.sleep(0.01)
    host.drop(11)  # its agent is lost: it answers nothing more, and never drains
    inference.remove_route(scaled.redis, ENDPOINT)  # then its endpoint stops (the DELETE's commit)
    loop = SchedulerLoop(settings=scaled.settings, db=db, celery=FakeCelery(),  # type: ignore[arg-type]
                         redis_client=lambda: scaled.redis)  # fmt: skip
    started = time.time()
    while t.is_alive() and time.time() - started < 10:
        loop.serve_endpoints()  # no endpoint is live: the pass still reaps the stopped one's replicas
        time.sleep(0.2)
    t.join(1)
    assert result, "the request held by the lost replica was not answered within 10 s"
    assert result[0].status_code == 503 and "lost" in result[0].json()["error"]
    assert time.time() - started < inference.READY_TTL_S + 3  # the grace, a pass, not the API's timeout
    loop.serve_endpoints()
    left = [
        k for k in scaled.redis.keys(f"{inference.PREFIX}{ENDPOINT}:*") if b":c:" not in k and b":a:" not in k
    ]
    assert left == [], f"a stopped endpoint's keys outlived its last replica: {left}"
    assert not scaled.redis.sismember(inference.STOPPED_KEY, ENDPOINT)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([{"name": "images", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": [0.0]}], "datatype"),
        ([{"name": "images", "datatype": "FP16", "shape": [1, 3, 224], "data": [0.0]}], "shape"),
        ([{"name": "images", "datatype": "FP16", "shape": [1, 3, 224, 224], "data": [0.0, 1.0]}], "elements"),
        (
            [{"name": "images", "datatype": "FP16", "shape": [1, 3, 224, 224], "data": ["x"] * 150528}],
            "numbers",
        ),
        (
            [{"name": "pixels", "datatype": "FP16", "shape": [1, 3, 224, 224], "data": [0.0]}],
            "unexpected input",
        ),
        ([{"name": "images", "datatype": "FP16", "shape": [9, 3, 224, 224], "data": [0.0]}], "at most"),
        (
            [{"name": "images", "datatype": "FP16", "shape": [1, 3, 224, 224], "data": [[1.0], [1.0, 2.0]]}],
            "ragged",
        ),
    ],
)
def test_malformed_tensors_get_400_in_the_protocols_shape(
    client: Any, tenant: tuple[str, str], scaled: Any, inputs: list[dict[str, Any]], message: str
) -> None:
    tenant_id, key = tenant
    inference.publish_route(scaled.redis, _route(_plan(), tenant_id))
    r = _infer(client, key, inputs)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    # The key is now in the cache: the same request takes the fast path and gets the same answer.
    again = _infer(client, key, inputs)
    assert (again.status_code, again.json(), again.headers["content-type"]) == (
        400,
        r.json(),
        r.headers["content-type"],
    )
    assert scaled.redis.llen(inference.queue_key(ENDPOINT)) == 0


def test_other_tenants_and_keys_without_invoke_see_nothing(
    client: Any, tenant: tuple[str, str], seeded: Any, scaled: Any
) -> None:
    tenant_id, key = tenant
    inference.publish_route(scaled.redis, _route(_plan(), tenant_id))
    admin = {"Authorization": f"Bearer {seeded.admin_key}"}
    other = client.post("/api/v1/admin/tenants", json={"name": "others", "plan": "standard"}, headers=admin)
    other_key = other.json()["api_key"]
    for path in ("v2/models/classifier", "v2/health/ready"):
        r = client.get(
            f"/api/v1/endpoints/{ENDPOINT}/{path}", headers={"Authorization": f"Bearer {other_key}"}
        )
        assert r.status_code == 404, r.text
    assert _infer(client, other_key, [_image(1)]).status_code == 404
    reader = client.post(
        "/api/v1/keys",
        json={"name": "reader", "scopes": ["read"]},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert reader.status_code == 201, reader.text
    r = _infer(client, reader.json()["api_key"], [_image(1)])
    assert r.status_code == 403


def test_a_draining_replicas_unstarted_requests_are_answered_at_once_when_the_endpoint_stops(
    client: Any, tenant: tuple[str, str], host: ServingHost, scaled: Any
) -> None:
    """A replica already draining (scaled down, replaced) when its endpoint stops still holds a request
    it took but did not start. The stop clears the queue (404 at once); the replica's hand-back comes
    after, and must be answered 404 at once too, not put back into a queue no replica will ever read
    (its client waited out the cold start and the grace, then got a 503)."""
    tenant_id, key = tenant
    # 3 rows a request, 4 a batch: one request a batch, and the next one taken with it stays unstarted.
    plan = _plan(batch=4)
    # The cold start is short so that a stranded request fails in 35 s here, not 90 s.
    inference.publish_route(
        scaled.redis, _route(plan, tenant_id, max_wait_ms=0.0, max_queue=1000, cold_start_timeout_s=5.0)
    )
    # A batch occupies the device for about a second of wall time: room to drain and stop within it.
    scale = plan.times(3).step_s / 1.0
    host.add(attempt_id=11, endpoint_id=ENDPOINT, plan=plan, cluster_clock=Clock(scale), ready_at=time.time())
    deadline = time.time() + 10
    while scaled.redis.zcard(inference.ready_key(ENDPOINT)) == 0:
        assert time.time() < deadline, "the replica never became ready"
        time.sleep(0.02)
    done: list[tuple[int, float, str]] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        r = _infer(client, key, [_image(3, i)])
        with lock:
            done.append(
                (r.status_code, time.time(), r.json().get("error", "") if r.status_code != 200 else "")
            )

    threads = [threading.Thread(target=call, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    queue = inference.queue_key(ENDPOINT)
    inflight = inference.inflight_key(ENDPOINT, 11)
    # One request started (in flight, answered when its batch is done) and one taken but not started.
    deadline = time.time() + 10
    while not (scaled.redis.llen(inflight) == 2 and scaled.redis.llen(queue) == 3):
        assert time.time() < deadline, (scaled.redis.llen(inflight), scaled.redis.llen(queue))
        time.sleep(0.005)
    drained = host.drain(11)  # scaled down: it finishes its batch, then hands back what it holds
    assert drained is not None
    # Its next batch starts with the request it held and takes one more it cannot start: that one is
    # handed back once the batch is answered.
    deadline = time.time() + 10
    while scaled.redis.llen(queue) != 2:
        assert time.time() < deadline, "the draining replica took nothing more"
        time.sleep(0.002)
    assert scaled.redis.llen(inflight) == 3
    inference.remove_route(scaled.redis, ENDPOINT)  # the endpoint is stopped (DELETE)
    stopped = time.time()
    drained.result(15)
    for t in threads:
        t.join(10)
    assert all(not t.is_alive() for t in threads), "a request was left waiting after its endpoint stopped"
    statuses = sorted(s for s, _, _ in done)
    assert statuses == [200, 200, 404, 404, 404], done
    assert all("stopped before a replica started this request" in e for s, _, e in done if s == 404), done
    # Every one answered as soon as the replica was done with it: none waited out a timeout.
    assert max(t for _, t, _ in done) - stopped < 5.0
    # Nothing left anywhere for the endpoint, and no second answer for anyone.
    assert scaled.redis.llen(queue) == 0 and scaled.redis.llen(inflight) == 0
    time.sleep(0.5)
    assert scaled.redis.keys(inference.REPLY_PREFIX + "*") == []


def test_a_process_loads_numpy_off_the_request_once_it_first_finds_a_live_endpoint(
    client: Any, tenant: tuple[str, str], scaled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first infer request of an API process imported NumPy itself (180-650 ms, the one-connection
    p99): the first lookup that finds a live endpoint (here a client's readiness check) starts the
    import in a thread of its own, once; a lookup that finds none starts nothing."""
    from api import inference as api_inference

    warmed: list[str] = []
    started = threading.Event()

    def fake_numpy_types() -> dict[str, Any]:
        warmed.append(threading.current_thread().name)
        started.set()
        return {}

    monkeypatch.setattr(api_inference, "numpy_types", fake_numpy_types)
    monkeypatch.setattr(api_inference, "_TENSORS_WARM", threading.Event())
    tenant_id, key = tenant
    auth = {"Authorization": f"Bearer {key}"}
    ready = f"/api/v1/endpoints/{ENDPOINT}/v2/health/ready"
    assert client.get("/api/v1/endpoints/ep_none1/v2/health/ready", headers=auth).status_code == 404
    assert not started.wait(0.3) and warmed == []
    inference.publish_route(scaled.redis, _route(_plan(), tenant_id))
    client.get(ready, headers=auth)  # no replica: not ready, but the endpoint is live
    assert started.wait(5), "NumPy was not loaded once an endpoint was found"
    client.get(ready, headers=auth)
    client.get(f"/api/v1/endpoints/{ENDPOINT}/v2", headers=auth)
    time.sleep(0.2)
    assert warmed == ["ipucloud-tensors-warm"], warmed
