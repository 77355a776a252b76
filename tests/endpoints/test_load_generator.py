"""The autoscaling benchmark's open-loop load generator (benchmarks/endpoints.py) against a real API
process, a real Redis and a serving host in a process of its own (a route published by hand, as the
benchmark's data-plane parts do): every request it sends gets an HTTP answer.

Why this is a test: in the 10 -> 500 req/s step, 350-490 requests sent 8 to 11 s after the step were
recorded with no HTTP answer. They were never seen by the API. The generator holds thousands of
keep-alive connections and hands the next request to whichever one has waited longest; at the step it
works through the fresh ones first, so the connections used before the step and in its first seconds
came back to the front only after idling past the server's keep-alive timeout (uvicorn's, 5 s), by
which time the server had closed them. The generator wrote the request on a socket the server had
already closed and read EOF. A stock HTTP client checks a pooled connection before it reuses it; the
generator now does too. The same idle gap is reproduced here with one connection.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from benchmarks import endpoints as bench
from scheduler import inference
from tests.support import services
from tests.support.cloud import FAST, Proc, RunningCloud, free_port

pytestmark = [pytest.mark.e2e]

LSTM = {"model": "lstm", "seq_len": 32, "precision": "fp16"}
KEEP_ALIVE_S = float(inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default)
"""How long the API's server keeps an idle connection open (`ipucloud api` leaves uvicorn's default)."""


def test_a_request_on_a_connection_the_server_closed_while_idle_still_gets_an_answer(
    env: dict[str, str], db: Any, tmp_path: Path
) -> None:
    seeded = services.seed(db, pods=1)
    cloud = RunningCloud(env={**env, **FAST}, workdir=tmp_path, admin_key=seeded.admin_key, port=free_port())
    try:
        cloud.start_api()
        cloud.wait_ready()
        tenant_id, key = cloud.create_tenant("loaders")
        plan = bench.plan_of(LSTM, 1)
        endpoint_id = "ep_loadgen1"
        route = inference.Route(
            endpoint_id=endpoint_id,
            tenant_id=tenant_id,
            name="forecaster",
            state="ready",
            signature=plan.signature.to_dict(),
            max_batch_size=1,
            max_wait_ms=0.0,
            max_queue=1000,
            cold_start_timeout_s=30.0,
        )
        inference.publish_route(db_redis(env), route)
        argv = [
            sys.executable,
            str(Path(bench.__file__).resolve()),
            "serve-host",
            "--redis-url",
            env["IPUCLOUD_REDIS_URL"],
            "--endpoint",
            endpoint_id,
            "--model",
            json.dumps(LSTM),
            "--max-batch",
            "1",
            "--time-scale",
            FAST["IPUCLOUD_TIME_SCALE"],
        ]
        serving = Proc("serving", argv, {**os.environ, **cloud.env}, tmp_path / "serving.log")
        cloud.procs["serving"] = serving.start()
        base = f"{cloud.url}/api/v1/endpoints/{endpoint_id}"
        deadline = time.monotonic() + 30
        with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=10) as c:
            while c.get(f"{base}/v2/health/ready").status_code != 200:
                assert time.monotonic() < deadline, "the replica never became ready:\n" + cloud.logs()
                time.sleep(0.1)

        # Four requests a second for a second, then one more once the connection has idled past the
        # server's keep-alive timeout: on one connection, the last is written to a socket the server
        # closed while it was idle.
        gap = KEEP_ALIVE_S + 1.5
        samples = bench.open_loop(
            f"{base}/v2/models/forecaster/infer",
            bench.v2_binary(plan),
            key,
            lambda t: 4.0 if t < 1.0 else 1.0 / gap,
            1.0 + gap + 0.5,
            connections=1,
        )
        assert [s.due for s in samples] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0 + gap])
        statuses = [s.status for s in samples]
        assert statuses == [200] * len(samples), f"requests without an answer (0) or refused: {statuses}"
        assert all(s.batch == 1 for s in samples)
    finally:
        cloud.stop_all()


def db_redis(env: dict[str, str]) -> Any:
    import redis

    return redis.Redis.from_url(env["IPUCLOUD_REDIS_URL"])
