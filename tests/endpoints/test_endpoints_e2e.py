"""Inference endpoints in a running cloud: real API, scheduler and host agent processes, the stock
`tritonclient` HTTP client as a user would run it.

The first cloud runs at the suite's fast time scale: create -> a cold start serves the first request
-> tritonclient infers -> 429 past max_queue and 503 past the cold start timeout -> it scales to
zero when idle -> deleted, it drains and bills exactly. The second runs at twice real time, on the
longest sequence (a replica's device is then slow enough for a load from this machine to queue
behind it) with the executable already in the tenant's cache, as after a first compile: a load step
scales it up, each new replica only loading.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from scheduler.emulation import serve_plan_on_partition
from scheduler.services.batch import executables
from tests.support import services
from tests.support.cloud import RunningCloud

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LSTM = {"model": "lstm", "seq_len": 32, "precision": "fp16", "machine": "m2000", "ipus_per_replica": 1}
ROW = 32 * 64  # one window of 32 readings of 64 series
STEP_SEQ = 512
STEP_SCALE = 2
"""The load step's model and time scale: a replica serves 30 requests a cluster second on the chip, 60
a wall second at twice real time (at seq 32, 470: more than sixteen Python clients beside the API offer
on a loaded machine, and the device runs on the requests' timeline, so a replica that is only slow in
wall time is not charged queueing). Twice real time halves each replica's 10 s load, most of the
test's wall time; the sequence doubles with it, so the device is as slow in wall time as at real time."""


def _wait(what: str, probe: Any, timeout: float = 60.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} did not happen within {timeout} s (last: {last!r})")


def _endpoint(c: httpx.Client, eid: str) -> dict[str, Any]:
    r = c.get(f"/api/v1/endpoints/{eid}")
    r.raise_for_status()
    return r.json()


def _endpoint_events(c: httpx.Client, eid: str) -> list[tuple[str, Any, Any]]:
    """The endpoint's events, oldest first: (type, from, to) for a scale, (type, previous state, None)."""
    r = c.get("/api/v1/events", params={"type": ["endpoint.ready", "endpoint.scaled", "endpoint.failed"]})
    r.raise_for_status()
    out = []
    for e in reversed(r.json()["items"]):
        d = e["data"]
        if d["id"] == eid:
            out.append((e["type"], d.get("from", d.get("previous_state")), d.get("to")))
    return out


def _triton(cloud: RunningCloud, url: str) -> triton.InferenceServerClient:
    base = url.split("://", 1)[1]
    return triton.InferenceServerClient(url=base, connection_timeout=60, network_timeout=120)


def _lstm_input(seed: int, rows: int = 1) -> triton.InferInput:
    x = np.random.default_rng(seed).standard_normal((rows, 32, 64)).astype(np.float32)
    i = triton.InferInput("window", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=True)
    return i


@pytest.fixture
def fast_cloud(env: dict[str, str], db: Any, tmp_path: Path) -> Iterator[RunningCloud]:
    seeded = services.seed(db, pods=1)
    # An endpoint is idle once the autoscaler's window of traffic holds no request: with the default
    # minute, scaling to zero waited out 50-60 s of wall time, most of this module's run. 20 s keeps a
    # request in view for 10-20 s (whole 10 s buckets): the cold-start test's endpoint must stay up
    # while it waits, without requests, for the serve pass to call it ready.
    extra = {"IPUCLOUD_AUTOSCALE_WINDOW_S": "20"}
    with RunningCloud.start(env, tmp_path, admin_key=seeded.admin_key, extra_env=extra) as running:
        yield running


def test_an_endpoint_serves_tritonclient_from_a_cold_start_and_scales_to_zero(
    fast_cloud: RunningCloud,
) -> None:
    cloud = fast_cloud
    _, key = cloud.create_tenant("inferers")
    auth = {"Authorization": f"Bearer {key}"}  # tritonclient adds to the dict it is given: pass copies
    with cloud.http(key) as c:
        r = c.post(
            "/api/v1/endpoints",
            json={
                "name": "forecaster",
                **LSTM,
                "replicas": {"min": 0, "max": 1},
                "autoscaling": {"scale_to_zero_after_s": 600},
                "batching": {"max_batch_size": 8, "max_wait_ms": 1},
                "cold_start_timeout_s": 60,
            },
        )
        assert r.status_code == 202, r.text
        ep = r.json()
        eid, url = ep["id"], ep["url"]
        assert url == f"{cloud.url}/api/v1/endpoints/{eid}"
        client = _triton(cloud, url)
        meta = client.get_model_metadata("forecaster", headers=dict(auth))
        assert meta["inputs"] == [{"name": "window", "datatype": "FP32", "shape": [-1, 32, 64]}]
        assert not client.is_server_ready(headers=dict(auth))  # no replica yet: min 0

        # The first request waits for a cold start (compile, load), then is served.
        result = client.infer("forecaster", [_lstm_input(0)], headers=dict(auth))
        forecast = result.as_numpy("forecast")
        assert forecast.shape == (1, 64) and forecast.dtype == np.float32
        again = client.infer("forecaster", [_lstm_input(0)], headers=dict(auth))
        np.testing.assert_array_equal(again.as_numpy("forecast"), forecast)
        assert client.is_server_ready(headers=dict(auth)) and client.is_model_ready(
            "forecaster", headers=dict(auth)
        )
        # The scheduler's serve pass (once a second) says so too.
        view = _wait(
            "the endpoint to be ready", lambda: (v := _endpoint(c, eid))["state"] == "ready" and v, 30
        )
        assert view["replicas"]["ready"] == 1
        (replica,) = [x for x in view["replica_list"] if x["state"] == "ready"]
        assert replica["ipus"] == 1
        # ... and its events say so: the cold start's 0 -> 1, then ready (docs/notifications.md).
        assert _endpoint_events(c, eid) == [
            ("endpoint.scaled", 0, 1),
            ("endpoint.ready", "provisioning", None),
        ]

        # Every answer says what the chip would have taken.
        raw = c.post(
            f"/api/v1/endpoints/{eid}/v2/models/forecaster/infer",
            json={
                "inputs": [
                    {"name": "window", "datatype": "FP32", "shape": [2, 32, 64], "data": [0.5] * 2 * ROW}
                ]
            },
        )
        assert raw.status_code == 200, raw.text
        timing = dict(p.strip().split(";dur=") for p in raw.headers["server-timing"].split(","))
        assert set(timing) == {"queue", "batch", "host", "ipu"}
        plan, _ = serve_plan_on_partition(
            {"workload": {"model": "lstm", "task": "infer", "seq_len": 32, "precision": "fp16"},
             "max_batch_size": 8}, 1, "m2000"
        )  # fmt: skip
        assert float(timing["ipu"]) == pytest.approx(plan.device_s(2) * 1000, rel=1e-3)
        assert raw.headers["x-ipucloud-batch-size"] == "2"

        # Malformed tensors: 400 in the protocol's shape, through the stock client too.
        with pytest.raises(InferenceServerException, match="shape"):
            bad = triton.InferInput("window", [1, 16, 64], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 16, 64), np.float32))
            client.infer("forecaster", [bad], headers=dict(auth))

        # Metrics: the requests are counted, their latency known, the replica serving.
        m = _wait("the metrics to count the requests", lambda: (
            (x := c.get(f"/api/v1/endpoints/{eid}/metrics").json())["window"]
            and x["window"]["answered"] >= 3 and x))  # fmt: skip
        assert m["window"]["p99_ms"] > 0 and m["window"]["ready_replicas"] == 1

        # Idle for scale_to_zero_after_s cluster seconds: no replica held.
        # Eventually, not a bound: the scheduler's serve pass decides it, slower on a loaded machine (CI).
        zero = _wait(
            "scale to zero", lambda: (v := _endpoint(c, eid))["state"] == "scaled-to-zero" and v, 150
        )
        assert zero["replicas"]["ready"] == 0
        assert _endpoint_events(c, eid)[2:] == [("endpoint.scaled", 1, 0)]
        # ... and a request then waits for a cold start again (the executable is cached now: load only).
        result = client.infer("forecaster", [_lstm_input(1)], headers=dict(auth))
        assert result.as_numpy("forecast").shape == (1, 64)

        # Deleted: it drains, then is stopped; billed for every held IPU-second.
        r = c.delete(f"/api/v1/endpoints/{eid}")
        assert r.status_code == 200, r.text
        stopped = _wait(
            "the endpoint to stop", lambda: (v := _endpoint(c, eid))["state"] == "stopped" and v, 60
        )
        assert stopped["billed_ipu_hours"] > 0
        gone = c.post(
            f"/api/v1/endpoints/{eid}/v2/models/forecaster/infer",
            json={
                "inputs": [{"name": "window", "datatype": "FP32", "shape": [1, 32, 64], "data": [0.5] * ROW}]
            },
        )
        assert gone.status_code == 404, gone.text


def test_a_full_queue_is_429_and_no_replica_in_time_is_503(fast_cloud: RunningCloud) -> None:
    cloud = fast_cloud
    _, key = cloud.create_tenant("queuers")
    body = {"inputs": [{"name": "window", "datatype": "FP32", "shape": [1, 32, 64], "data": [0.5] * ROW}]}
    with cloud.http(key) as c:
        # The only rack is drained for maintenance: the replica cannot be placed.
        with cloud.admin() as a:
            drained = a.post("/api/v1/admin/fleet/racks/rack0000/drain")
            assert drained.status_code == 200, drained.text
        r = c.post(
            "/api/v1/endpoints",
            json={"name": "starved", **LSTM, "replicas": {"min": 1, "max": 1}, "max_queue": 2,
                  "cold_start_timeout_s": 2},
        )  # fmt: skip
        assert r.status_code == 202, r.text
        eid = r.json()["id"]
        path = f"/api/v1/endpoints/{eid}/v2/models/starved/infer"
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(c.post, path, json=body) for _ in range(2)]
            time.sleep(0.5)
            full = c.post(path, json=body)
            assert full.status_code == 429, full.text
            assert int(full.headers["retry-after"]) >= 1 and "queue" in full.json()["error"]
            late = [f.result() for f in waiting]
        assert [x.status_code for x in late] == [503, 503], [x.text for x in late]
        assert "cold start" in late[0].json()["error"] and int(late[0].headers["retry-after"]) >= 1
        w = _wait("the counters", lambda: (x := c.get(f"/api/v1/endpoints/{eid}/metrics").json()["window"])
                  and x["rejected_429"] >= 1 and x["unavailable_503"] >= 2 and x)  # fmt: skip
        assert w["cold_starts"] >= 2


@pytest.mark.serial
def test_a_load_step_scales_up_and_a_warm_replica_only_loads(
    env: dict[str, str], db: Any, tmp_path: Path
) -> None:
    seeded = services.seed(db, pods=1)
    with RunningCloud.start(
        env, tmp_path, admin_key=seeded.admin_key, extra_env={"IPUCLOUD_TIME_SCALE": str(STEP_SCALE)}
    ) as cloud:
        tenant_id, key = cloud.create_tenant("steppers")
        plan, _ = serve_plan_on_partition(
            {
                "workload": {"model": "lstm", "task": "infer", "seq_len": STEP_SEQ, "precision": "fp16"},
                "max_batch_size": 1,
            },
            1,
            "m2000",
        )
        # Compiled before, as after a first replica: every replica of this test only loads.
        with db.write() as s:
            executables.record(
                session=s,
                key=executables.tenant_key(tenant_id=tenant_id, key=plan.executable_key),
                machine_type="m2000",
                compile_s=plan.compile_s,
            )
        with cloud.http(key) as c:
            r = c.post(
                "/api/v1/endpoints",
                json={
                    "name": "stepped",
                    **LSTM,
                    "seq_len": STEP_SEQ,
                    "replicas": {"min": 1, "max": 3},
                    "autoscaling": {
                        "target_queue_delay_ms": 20,
                        "scale_up_delay_s": 2,
                        "scale_down_delay_s": 600,
                    },
                    "batching": {"max_batch_size": 1, "max_wait_ms": 0.1},
                    "max_queue": 10_000,
                },
            )
            assert r.status_code == 202, r.text
            eid = r.json()["id"]
            _wait("the first replica", lambda: _endpoint(c, eid)["replicas"]["ready"] == 1, 60)
            # One replica answers STEP_SCALE / step_s(1) requests a second (about 60): sixteen clients
            # offer more.
            stop = threading.Event()
            codes: list[int] = []

            def load() -> None:
                with httpx.Client(
                    base_url=cloud.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
                ) as h:
                    body = {"inputs": [{"name": "window", "datatype": "FP32", "shape": [1, STEP_SEQ, 64],
                                        "data": [0.5] * STEP_SEQ * 64}]}  # fmt: skip
                    while not stop.is_set():
                        codes.append(
                            h.post(f"/api/v1/endpoints/{eid}/v2/models/stepped/infer", json=body).status_code
                        )

            threads = [threading.Thread(target=load) for _ in range(16)]
            for t in threads:
                t.start()
            try:
                up = _wait(
                    "a scale-up", lambda: (v := _endpoint(c, eid))["replicas"]["ready"] >= 2 and v, 90, 0.5
                )
            finally:
                stop.set()
                for t in threads:
                    t.join()
            assert codes and set(codes) <= {200, 429}, sorted(set(codes))
            ready = [x for x in up["replica_list"] if x["state"] == "ready"]
            assert len(ready) >= 2
            # Only loaded: from start to ready in about load_s cluster seconds, no compile (its 100 s).
            for x in ready:
                wall = np.datetime64(x["ready_at"].replace("Z", "")) - np.datetime64(
                    x["started_at"].replace("Z", "")
                )
                took = STEP_SCALE * wall / np.timedelta64(1, "s")
                assert took <= plan.load_s * 1.5 + 2.0, x
