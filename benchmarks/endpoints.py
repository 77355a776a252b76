"""Inference endpoints, measured: serving overhead beside MLServer, latency against the plan under load,
and an autoscaling step. Three parts, side by side in one run (`--only` picks some):

- overhead: MLServer (Seldon's Open Inference Protocol server, from PyPI, in a virtualenv of its own
  under the cache directory) serving a model that returns its input (a custom runtime this script
  writes), and an ipucloud endpoint whose emulated device time is zero (the cloud's clock at
  IPUCLOUD_TIME_SCALE=1000000: the model's microseconds vanish), both driven by `wrk` (Debian's; a Lua
  script POSTs the same v2 JSON body to each) at several concurrencies: requests/s, p50 and p99.
  What is left is the serving path's own cost: HTTP, parsing the tensors, the hop to the replica.
- curves: ResNet-50, BERT-Base (seq 128) and the LSTM (seq 128) on one IPU-M2000 IPU, batch 1 to 64,
  from `vipu.emulator.serve_plan` (latency and throughput at saturation); then, for each, an endpoint
  under an open-loop load at fractions of its saturation, and the p99 it reports (queue, batch, host
  and IPU time, from `Server-Timing`) and the client's, against the plan's prediction under that load
  (`ServePlan.under_load`: the replica's batching replayed on the plan's times, for the fixed rate and
  for the times actually sent) and its latency alone at the batch that carries the load
  (`--curve-loads`, `--curve-models` pick points). The cloud's clock is slowed for these (time scale
  < 1) so that the load a Python generator on this machine can offer saturates a replica; every
  figure is in emulated (chip) milliseconds.
- autoscale: a step of the offered load from 10 to 500 requests/s (open loop, fixed rate), the p99 of
  each second and when `GET /api/v1/endpoints/{id}` shows the replica count change. It needs the
  control plane (`POST /api/v1/endpoints`); without it the part says so and is skipped.

The cloud runs in production shape (PostgreSQL, Redis, `ipucloud api` with one uvicorn process per
core), as benchmarks/control_plane.py starts it, and an endpoint is created by `POST
/api/v1/endpoints` and served by a host agent (`ipucloud scheduler`, one `ipucloud worker`). The
curves, and the overhead with `--hand-route`, use the data plane alone: the endpoint's route
published to Redis by hand and a serving host (workers/serving.py) in a process of its own, as
tests/endpoints/test_request_path.py does; `start_endpoint` is the one place that chooses.

    .venv/bin/python benchmarks/endpoints.py [--only overhead,curves,autoscale] [--seconds 10]
        [--concurrency 1,4,16,64] [--hand-route] [--cache-dir ~/.cache/ipucloud-bench]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.harness import PG_DEFAULT, REDIS_DEFAULT, fresh_database, prepare, start_cloud  # noqa: E402
from tests.support.cloud import RunningCloud, free_port  # noqa: E402
from vipu.emulator import WorkloadSpec, serve_plan  # noqa: E402
from vipu.emulator.serving import ServePlan  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/endpoints.py"
MLSERVER_VERSION = "1.7.1"
MLSERVER_PINS = ("uvloop<0.22",)
"""uvloop 0.22 no longer makes an event loop on `get_event_loop()`, which MLServer 1.7.1's inference
workers call at start: with it every worker dies at once and requests hang."""
CONTROL_PLANE = find_spec("scheduler.services.endpoints") is not None
"""The control plane's services are on this branch: endpoints are created by `POST /api/v1/endpoints`."""

# The overhead's model: the catalogue's smallest signature (HMC: one chain's 128 FP32 coordinates in,
# its next draw and an accepted flag out), so both servers parse and answer a small tensor.
OVERHEAD_MODEL = {"model": "mcmc", "precision": "fp32"}
OVERHEAD_SCALE = 1_000_000.0

CURVE_MODELS = {
    "ResNet-50": {"model": "resnet50", "precision": "fp16"},
    "BERT-Base seq 128": {"model": "bert-base", "seq_len": 128, "precision": "fp16"},
    "LSTM seq 128": {"model": "lstm", "seq_len": 128, "precision": "fp16"},
}
BATCHES = (1, 2, 4, 8, 16, 32, 64)
NUMPY = {"FP16": np.float16, "FP32": np.float32, "INT64": np.int64, "UINT8": np.uint8, "BOOL": np.bool_}
"""The datatypes of the catalogue's serving signatures."""
CURVE_MAX_BATCH = 8
"""The endpoints under load form batches of at most 8: the plan's curve from 1 to 8 is what a load
from a tenth of saturation to saturation walks along."""
CURVE_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
CURVE_WALL_RPS = 100.0
"""The wall requests/s at which a curve's endpoint saturates (its clock is slowed to make it so): what
one Python open-loop generator offers on time on two shared cores beside the API and the replica (at
200 it fell behind by 100-300 ms at times, and its bursts were the p99)."""
CURVE_WALL_BYTES = 30e6
"""...and at most this many bytes of request bodies a wall second (ResNet-50's image is 301 KB)."""


def spec_of(model: dict[str, Any]) -> WorkloadSpec:
    return WorkloadSpec(task="infer", **model)


def plan_of(model: dict[str, Any], max_batch: int) -> ServePlan:
    return serve_plan(spec_of(model), machine="m2000", ipus=1, max_batch_size=max_batch)


def v2_body(plan: ServePlan, rows: int = 1, seed: int = 0) -> dict[str, Any]:
    """A v2 infer request in JSON with `rows` rows of every input of the plan's signature (small
    integers, valid for every datatype the catalogue serves)."""
    inputs = []
    for t in plan.signature.inputs:
        shape = list(t.shape_for(rows))
        data: list[Any] = [((i + seed) % 7) for i in range(math.prod(shape))]
        if t.datatype.startswith("FP"):
            data = [float(x) / 8 for x in data]
        inputs.append({"name": t.name, "datatype": t.datatype, "shape": shape, "data": data})
    return {"inputs": inputs}


def v2_binary(plan: ServePlan, rows: int = 1) -> tuple[bytes, dict[str, str]]:
    """The same request with the binary tensor extension (as `tritonclient` sends it): a JSON header,
    then the tensors' bytes. An image as JSON numbers is 600 KB of text the API must parse; here the
    curves measure the replica, not a JSON parser."""
    header: dict[str, Any] = {"inputs": []}
    chunks = []
    for t in plan.signature.inputs:
        shape = list(t.shape_for(rows))
        raw = (np.arange(math.prod(shape)) % 7).astype(NUMPY[t.datatype]).tobytes()
        header["inputs"].append(
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": shape,
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        chunks.append(raw)
    head = json.dumps(header).encode()
    return head + b"".join(chunks), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))] if v else float("nan")


# Load: wrk (closed loop, the overhead) ----------------------------------------------------------------

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = io.open("%(body)s"):read("*a")
wrk.headers["Content-Type"] = "application/json"
%(auth)s
done = function(summary, latency, requests)
  io.write(string.format("RESULT %%d %%d %%d %%d %%f %%f\\n", summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass
class Load:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def wrk(url: str, body: dict[str, Any], key: str | None, *, clients: int, seconds: int) -> Load:
    """Answered (2xx) requests/s, p50 and p99 from `clients` keep-alive connections for `seconds`."""
    if shutil.which("wrk") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    with tempfile.TemporaryDirectory(prefix="ipucloud-wrk-") as tmp:
        (Path(tmp) / "body.json").write_text(json.dumps(body))
        auth = f'wrk.headers["Authorization"] = "Bearer {key}"' if key else ""
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT % {"body": Path(tmp) / "body.json", "auth": auth})
        out = subprocess.run(
            [
                "wrk",
                "-t",
                str(min(clients, 2)),
                "-c",
                str(clients),
                "-d",
                f"{seconds}s",
                "-s",
                str(script),
                "--timeout",
                "10s",
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    m = re.search(r"RESULT (\d+) (\d+) (\d+) (\d+) ([\d.]+) ([\d.]+)", out)
    assert m, out
    requests, bad_status, sock_errors, duration_us = (int(m.group(i)) for i in range(1, 5))
    return Load(
        rps=(requests - bad_status) / (duration_us / 1e6),
        p50_ms=float(m.group(5)) / 1000,
        p99_ms=float(m.group(6)) / 1000,
        errors=bad_status + sock_errors,
    )


# Load: open loop at a fixed rate (the curves, the autoscaling step) -----------------------------------


@dataclass
class Sample:
    due: float
    """Seconds after the load began at which it was to be sent."""
    lag_ms: float
    """How late the generator sent it (a loaded machine's generator falls behind, then sends in bursts)."""
    wall_ms: float
    """From when it was due to its answer: what a client at that rate would see."""
    status: int
    emulated_ms: float | None
    """queue + batch + host + ipu from Server-Timing: the latency the chip would give."""
    batch: int | None


def _server_timing(header: str | None) -> float | None:
    if not header:
        return None
    total = 0.0
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name in ("queue", "batch", "host", "ipu") and dur:
            total += float(dur)
    return total


async def _open_loop(
    url: str,
    body: bytes,
    headers: dict[str, str],
    rate: Callable[[float], float],
    seconds: float,
    connections: int,
) -> list[Sample]:
    """Requests go out on `connections` keep-alive HTTP/1.1 connections, each taking the next due
    request when it is free; a request waiting for a free connection waits from its due time, as a
    client population would. A plain asyncio client: httpx's pool, with thousands of requests
    waiting at 500 req/s, spent the generator's CPU matching requests to connections and fell minutes
    behind."""
    target = httpx.URL(url)
    head = (
        f"POST {target.raw_path.decode()} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    request = head + body
    samples: list[Sample] = []
    retried = [0]
    outstanding: set[float] = set()
    """Due times sent or waiting for a connection that have no sample yet."""
    due_q: asyncio.Queue[float | None] = asyncio.Queue()
    start = time.perf_counter()

    async def connection() -> None:
        reader = writer = None
        while True:
            due = await due_q.get()
            if due is None:
                break
            sent = time.perf_counter()
            status, fields = 0, {}
            for _ in range(2):
                # A kept-alive connection the server closed while it idled (uvicorn's keep-alive
                # timeout, 5 s) is not one to send on: at the 10 -> 500 step the connections used
                # first come back to the front only after idling that long, and hundreds of requests
                # written to closed sockets were recorded as never answered. Stock clients look too.
                if writer is not None and (writer.is_closing() or (reader is not None and reader.at_eof())):
                    writer.close()
                    reader = writer = None
                reused = writer is not None
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection(target.host, target.port)
                    assert reader is not None
                    writer.write(request)
                    status, fields = await _read_response(reader)
                    break
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    if writer is not None:
                        writer.close()
                    reader = writer = None
                    # Closed by the server as the request went out, before any byte of an answer: the
                    # server drops only idle connections, so it never read this one; send it again
                    # once, on a new connection, as an HTTP client retries on a stale pooled one.
                    partial = getattr(exc, "partial", b"")
                    if not (reused and isinstance(exc, (ConnectionError, asyncio.IncompleteReadError))
                            and not partial):  # fmt: skip
                        break
                    retried[0] += 1
            end = time.perf_counter()
            batch = fields.get("x-ipucloud-batch-size")
            outstanding.discard(due)
            samples.append(
                Sample(due, (sent - start - due) * 1000, (end - start - due) * 1000, status,
                       _server_timing(fields.get("server-timing")), int(batch) if batch else None)
            )  # fmt: skip
            if fields.get("connection", "").lower() == "close" and writer is not None:
                writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    workers = [asyncio.create_task(connection()) for _ in range(connections)]
    due = 0.0
    while due < seconds:
        now = time.perf_counter() - start
        if due > now:
            await asyncio.sleep(due - now)
        outstanding.add(due)
        due_q.put_nowait(due)
        due += 1.0 / max(rate(due), 1e-3)
    for _ in workers:
        due_q.put_nowait(None)
    _, late = await asyncio.wait(workers, timeout=120)
    for w in late:
        w.cancel()
    # Still waiting two minutes after the load ended: recorded as never answered (status 0), not lost.
    gave_up = time.perf_counter() - start
    samples.extend(
        Sample(d, (gave_up - d) * 1000, (gave_up - d) * 1000, 0, None, None) for d in sorted(outstanding)
    )
    samples.sort(key=lambda x: x.due)
    if retried[0]:
        print(f"(load generator: {retried[0]} requests sent again on a new connection: the server had "
              "closed the kept-alive one as they went out)", flush=True)  # fmt: skip
    return samples


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """An HTTP/1.1 response with a Content-Length (as the API and MLServer answer): status, headers."""
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    fields = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            fields[k.strip().lower()] = v.strip()
    if "content-length" not in fields:
        raise ValueError("a response without Content-Length")
    await reader.readexactly(int(fields["content-length"]))
    return status, fields


def open_loop(
    url: str,
    request: tuple[bytes, dict[str, str]],
    key: str,
    rate: Callable[[float], float],
    seconds: float,
    connections: int = 256,
) -> list[Sample]:
    """Send at `rate(t)` requests/s (t: seconds since the start) for `seconds`, whatever the answers
    take: a request is sent when its time comes, not when an earlier one returns."""
    body, headers = request
    headers = {**headers, "Authorization": f"Bearer {key}"}
    return asyncio.run(_open_loop(url, body, headers, rate, seconds, connections))


# MLServer ---------------------------------------------------------------------------------------------

ECHO_RUNTIME = '''
"""The overhead benchmark's model: answers its inputs unchanged (benchmarks/endpoints.py writes this)."""
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class Echo(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                ResponseOutput(name=t.name, shape=t.shape, datatype=t.datatype, data=t.data)
                for t in payload.inputs
            ],
        )
'''


def mlserver_bin(cache: Path) -> Path:
    """`mlserver` from a virtualenv of its own (MLServer pins its own FastAPI, uvicorn and pydantic; it
    is not one of ipucloud's dependencies), created once under the cache directory."""
    venv = cache / f"mlserver-{MLSERVER_VERSION}"
    exe = venv / "bin" / "mlserver"
    if not exe.exists():
        print(f"installing mlserver {MLSERVER_VERSION} into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"mlserver=={MLSERVER_VERSION}", *MLSERVER_PINS],
            check=True,
        )
    return exe


@contextmanager
def mlserver(cache: Path, work: Path, *, parallel_workers: int) -> Iterator[str]:
    """MLServer serving the echo model; yields its infer URL."""
    exe = mlserver_bin(cache)
    root = work / f"mlserver-{parallel_workers}"
    (root / "echo").mkdir(parents=True, exist_ok=True)
    (root / "echo_runtime.py").write_text(ECHO_RUNTIME)
    port = free_port()
    settings = {
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "parallel_workers": parallel_workers,
        "debug": False,
    }
    (root / "settings.json").write_text(json.dumps(settings))
    (root / "echo" / "model-settings.json").write_text(
        json.dumps({"name": "echo", "implementation": "echo_runtime.Echo"})
    )
    log = open(root / "mlserver.log", "wb")  # noqa: SIM115 (lives as long as the child)
    proc = subprocess.Popen(
        [str(exe), "start", str(root)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlserver exited:\n{(root / 'mlserver.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/v2/models/echo/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mlserver did not become ready in 120 s")
            time.sleep(0.2)
        yield f"{base}/v2/models/echo/infer"
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


# An ipucloud endpoint ---------------------------------------------------------------------------------


@dataclass
class Endpoint:
    cloud: RunningCloud
    key: str
    id: str
    name: str
    base: str
    """The endpoint's v2 base: `{base}/v2/models/{name}/infer`."""
    plan: ServePlan
    time_scale: float
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def infer_url(self) -> str:
        return f"{self.base}/v2/models/{self.name}/infer"


@dataclass
class Setup:
    db_url: str
    redis_url: str
    work: Path
    api_workers: int
    db_name: str = "ipucloud_bench_endpoints"
    """The PostgreSQL database the run drops and creates (``--database-name``: one per concurrent run)."""


@contextmanager
def start_endpoint(
    setup: Setup,
    model: dict[str, Any],
    *,
    time_scale: float,
    max_batch: int,
    max_wait_ms: float,
    replicas: tuple[int, int] = (1, 1),
    autoscaling: dict[str, Any] | None = None,
    control_plane: bool = CONTROL_PLANE,
) -> Iterator[Endpoint]:
    """A fresh cloud serving `model` on one M2000 IPU per replica, ready to answer; the one place that
    chooses how an endpoint comes to be: `POST /api/v1/endpoints` where the control plane is on this
    branch, else its route published by hand beside a serving host."""
    starter = _via_control_plane if control_plane else _via_hand_route
    with starter(
        setup,
        model,
        time_scale=time_scale,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        replicas=replicas,
        autoscaling=autoscaling,
    ) as ep:
        deadline = time.monotonic() + 120
        with httpx.Client(headers={"Authorization": f"Bearer {ep.key}"}, timeout=10) as c:
            while c.get(f"{ep.base}/v2/health/ready").status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("the endpoint never became ready:\n" + ep.cloud.logs())
                time.sleep(0.1)
        yield ep


def _cloud(setup: Setup, time_scale: float, *, control_plane: bool) -> tuple[RunningCloud, str]:
    db_url = fresh_database(setup.db_url, setup.db_name)
    admin, key = prepare(db_url, pods=1)
    setup.work.mkdir(parents=True, exist_ok=True)
    cloud = start_cloud(
        db_url,
        setup.redis_url,
        Path(tempfile.mkdtemp(prefix="cloud-", dir=setup.work)),
        admin,
        api_workers=setup.api_workers,
        worker_procs=1 if control_plane else 0,
        concurrency=16,
        scheduler=control_plane,
        extra_env={
            "IPUCLOUD_TIME_SCALE": repr(time_scale),
            "IPUCLOUD_HEARTBEAT_S": "1",
            "IPUCLOUD_LEASE_S": "10",
            "IPUCLOUD_SCHEDULER_TICK_S": "0.5",
        },
    )
    return cloud, key


@contextmanager
def _via_control_plane(
    setup: Setup,
    model: dict[str, Any],
    *,
    time_scale: float,
    max_batch: int,
    max_wait_ms: float,
    replicas: tuple[int, int],
    autoscaling: dict[str, Any] | None,
) -> Iterator[Endpoint]:
    """`POST /api/v1/endpoints` on a cloud with its scheduler and one host agent; the replica is a
    holder job placed, compiled and loaded like any other."""
    cloud, key = _cloud(setup, time_scale, control_plane=True)
    try:
        body: dict[str, Any] = {
            "name": "bench",
            **model,
            "machine": "m2000",
            "ipus_per_replica": 1,
            "replicas": {"min": replicas[0], "max": replicas[1]},
            "batching": {"max_batch_size": max_batch, "max_wait_ms": max_wait_ms},
            "max_queue": 100_000,
        }
        if autoscaling:
            body["autoscaling"] = autoscaling
        with cloud.http(key) as c:
            r = c.post("/api/v1/endpoints", json=body)
            if r.status_code != 202:
                raise RuntimeError(f"POST /api/v1/endpoints answered {r.status_code}: {r.text}")
            ep = r.json()
            deadline = time.monotonic() + 600  # the first replica compiles
            while ep["state"] != "ready":
                if time.monotonic() > deadline or ep["state"] in ("failed", "stopped"):
                    raise RuntimeError(f"endpoint {ep['id']} is {ep['state']} ({ep.get('reason')})")
                time.sleep(0.2)
                ep = c.get(f"/api/v1/endpoints/{ep['id']}").json()
        yield Endpoint(cloud, key, ep["id"], ep["name"], ep["url"], plan_of(model, max_batch), time_scale)
    finally:
        cloud.stop_all()


@contextmanager
def _via_hand_route(
    setup: Setup,
    model: dict[str, Any],
    *,
    time_scale: float,
    max_batch: int,
    max_wait_ms: float,
    replicas: tuple[int, int],
    autoscaling: dict[str, Any] | None,
) -> Iterator[Endpoint]:
    """The data plane alone: the API's processes, the endpoint's route published to Redis by hand and
    a serving host in a process of its own (as a host agent runs it) holding `replicas[0]` replicas."""
    import redis as redis_lib
    from sqlalchemy import text

    from scheduler import inference
    from scheduler.db import Database

    if autoscaling:
        raise RuntimeError("autoscaling needs the control plane (POST /api/v1/endpoints)")
    cloud, key = _cloud(setup, time_scale, control_plane=False)
    host: subprocess.Popen[bytes] | None = None
    try:
        db = Database(cloud.env["IPUCLOUD_DATABASE_URL"])
        with db.read() as s:
            tenant_id = s.execute(text("SELECT id FROM tenants WHERE name = 'bench'")).scalar_one()
        db.dispose()
        plan = plan_of(model, max_batch)
        endpoint_id = "ep_bench" + os.urandom(4).hex()
        route = inference.Route(
            endpoint_id=endpoint_id,
            tenant_id=tenant_id,
            name="bench",
            state="ready",
            signature=plan.signature.to_dict(),
            max_batch_size=max_batch,
            max_wait_ms=max_wait_ms,
            max_queue=100_000,
            cold_start_timeout_s=60.0,
        )
        inference.publish_route(redis_lib.Redis.from_url(setup.redis_url), route)
        host = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "serve-host",
                "--redis-url",
                setup.redis_url,
                "--endpoint",
                endpoint_id,
                "--model",
                json.dumps(model),
                "--max-batch",
                str(max_batch),
                "--time-scale",
                repr(time_scale),
                "--replicas",
                str(replicas[0]),
            ],
            stdout=open(cloud.workdir / "serving.log", "wb"),  # noqa: SIM115 (lives as long as the child)
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        yield Endpoint(
            cloud,
            key,
            endpoint_id,
            "bench",
            f"{cloud.url}/api/v1/endpoints/{endpoint_id}",
            plan,
            time_scale,
            [host],
        )
    finally:
        if host is not None:
            _stop(host)
        cloud.stop_all()


def serve_host(args: argparse.Namespace) -> None:
    """The hand route's replicas: a `ServingHost` as a host agent runs one, until SIGTERM."""
    import threading

    from scheduler.clock import Clock
    from workers.serving import ServingHost

    host = ServingHost(args.redis_url)
    host.start()
    plan = plan_of(json.loads(args.model), args.max_batch)
    for i in range(args.replicas):
        host.add(
            attempt_id=1000 + i,
            endpoint_id=args.endpoint,
            plan=plan,
            cluster_clock=Clock(args.time_scale),
            ready_at=time.time(),
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    host.close()


# Part 1: overhead -------------------------------------------------------------------------------------


def part_overhead(
    setup: Setup, cache: Path, concurrencies: list[int], seconds: int, *, control_plane: bool
) -> None:
    plan = plan_of(OVERHEAD_MODEL, 64)
    body = v2_body(plan)
    print(
        f"\n## Serving overhead: a {len(json.dumps(body))}-byte v2 request (FP32 [1, 128]), wrk, "
        f"{seconds} s per concurrency\n",
        flush=True,
    )
    results: dict[str, dict[int, Load]] = {}
    for workers in (1, 0):
        label = f"MLServer {MLSERVER_VERSION}, parallel_workers={workers}"
        with mlserver(cache, setup.work, parallel_workers=workers) as url:
            warm_up(url, body, None, concurrencies)
            results[label] = {c: wrk(url, body, None, clients=c, seconds=seconds) for c in concurrencies}
        _progress(label, results[label])
    how = "replica in a host agent" if control_plane else "hand-published route, serving host process"
    label = f"ipucloud endpoint, {setup.api_workers} API processes, {how}"
    with start_endpoint(
        setup,
        OVERHEAD_MODEL,
        time_scale=OVERHEAD_SCALE,
        max_batch=64,
        max_wait_ms=0.0,
        control_plane=control_plane,
    ) as ep:
        warm_up(ep.infer_url, body, ep.key, concurrencies)
        results[label] = {
            c: wrk(ep.infer_url, body, ep.key, clients=c, seconds=seconds) for c in concurrencies
        }
    _progress(label, results[label])
    print()
    print(
        "| server | "
        + " | ".join(f"{c} conn: req/s, p50 / p99 ms" for c in concurrencies)
        + " | saturation req/s |"
    )
    print("|---|" + "---|" * (len(concurrencies) + 1))
    for label, by_c in results.items():
        cells = [
            f"{by_c[c].rps:,.0f}, {by_c[c].p50_ms:.1f} / {by_c[c].p99_ms:.1f}"
            + (f" ({by_c[c].errors} errors)" if by_c[c].errors else "")
            for c in concurrencies
        ]
        print(f"| {label} | " + " | ".join(cells) + f" | {max(x.rps for x in by_c.values()):,.0f} |")


WARM_UP_S = 2
"""Seconds of load, not counted, before a server's measured runs."""


def warm_up(url: str, body: dict[str, Any], key: str | None, concurrencies: list[int]) -> None:
    """Load a server as its measured runs will, from enough connections to reach each of its processes,
    and discard the figures: the steady state is what is measured, for every server alike. Unwarmed, the
    first inference request of each of the endpoint's API processes imported NumPy and read its key from
    the database (180-650 ms on a loaded machine), and `wrk`'s correction for coordinated omission turns
    one such stall at one connection into hundreds of samples: alone, more than the 1% a p99 allows."""
    wrk(url, body, key, clients=max(16, *concurrencies), seconds=WARM_UP_S)


def _progress(label: str, by_c: dict[int, Load]) -> None:
    for c, x in by_c.items():
        print(
            f"  {label}: {c} connections: {x.rps:,.0f} req/s, p50 {x.p50_ms:.2f} ms, p99 {x.p99_ms:.2f} ms"
            + (f", {x.errors} errors" if x.errors else ""),
            flush=True,
        )


# Part 2: curves ---------------------------------------------------------------------------------------


def plan_table() -> None:
    print("\n## Latency and throughput on one IPU-M2000 IPU, FP16, from the serve plan\n")
    print("| model | " + " | ".join(f"batch {b}: ms, req/s" for b in BATCHES) + " |")
    print("|---|" + "---|" * len(BATCHES))
    for label, model in CURVE_MODELS.items():
        sp = plan_of(model, max(BATCHES))
        cells = [
            f"{sp.latency_s(b) * 1e3:.2f}, {sp.throughput(b):,.0f}" if b <= sp.max_batch_size else "-"
            for b in BATCHES
        ]
        print(f"| {label} | " + " | ".join(cells) + " |")


def carrying_batch(plan: ServePlan, rate: float) -> int:
    """The smallest batch whose throughput at saturation carries `rate` requests/s (cluster time)."""
    for b in range(1, plan.max_batch_size + 1):
        if plan.throughput(b) >= rate:
            return b
    return plan.max_batch_size


def part_curves(setup: Setup, seconds: float, *, fractions: tuple[float, ...] = CURVE_FRACTIONS,
                models: tuple[str, ...] = tuple(CURVE_MODELS)) -> None:  # fmt: skip
    plan_table()
    print(
        f"\n## Measured under load: open loop at fixed rate, {seconds:.0f} s per point, batches of at most "
        f"{CURVE_MAX_BATCH}, max_wait_ms 0, binary tensors\n",
        flush=True,
    )
    rows = []
    for label in models:
        model = CURVE_MODELS[label]
        plan = plan_of(model, CURVE_MAX_BATCH)
        saturation = plan.throughput(CURVE_MAX_BATCH)
        request = v2_binary(plan)
        # Slow the clock until saturation is a wall rate this machine offers (and moves: 30 MB/s of bodies).
        scale = min(CURVE_WALL_RPS, CURVE_WALL_BYTES / len(request[0])) / saturation
        # The data plane alone, always: at these slowed clocks a replica's compile (100-250 cluster s)
        # would take up to an hour of wall time, and the latency under load is the data plane's.
        with start_endpoint(
            setup, model, time_scale=scale, max_batch=CURVE_MAX_BATCH, max_wait_ms=0.0, control_plane=False
        ) as ep:
            open_loop(ep.infer_url, request, ep.key, lambda _t: 20.0, 1.0)  # warm the connections and caches
            for fraction in fractions:
                offered = fraction * saturation
                samples = open_loop(ep.infer_url, request, ep.key, lambda _t, r=offered * scale: r, seconds)
                ok = [s for s in samples if s.status == 200 and s.emulated_ms is not None]
                b = carrying_batch(plan, offered)
                emulated = [s.emulated_ms for s in ok if s.emulated_ms is not None]
                # The plan's prediction under this load (vipu.emulator.serving.batch_under_load): the
                # replica's batching replayed on the plan's times, for the fixed rate asked of the
                # generator and for the times it actually sent at (its lag, on a loaded machine, sends
                # bursts that queue); cluster time is wall time x the time scale.
                fixed = plan.p99_under_load(offered, max_batch_size=CURVE_MAX_BATCH, seconds=seconds) * 1000
                sent = sorted((s.due + s.lag_ms / 1000) * scale for s in samples)
                as_sent = percentile(plan.under_load(sent, max_batch_size=CURVE_MAX_BATCH), 0.99) * 1000
                row = {
                    "model": label,
                    "fraction": fraction,
                    "offered": offered,
                    "answered": len(ok) / seconds / scale,
                    "batch": b,
                    "mean_batch": statistics.fmean(s.batch for s in ok if s.batch) if ok else float("nan"),
                    "plan_ms": plan.latency_s(b) * 1000,
                    "fixed_ms": fixed,
                    "sent_ms": as_sent,
                    "p50": percentile(emulated, 0.50),
                    "p99": percentile(emulated, 0.99),
                    "wall_p99": percentile([s.wall_ms for s in ok], 0.99) * scale,
                    "lag_p99": percentile([s.lag_ms for s in samples], 0.99),
                    "errors": len(samples) - len(ok),
                    "scale": scale,
                }
                rows.append(row)
                print(
                    f"  {label} at {fraction:.0%} of {saturation:,.0f} req/s: p99 {row['p99']:.2f} ms, "
                    f"predicted {fixed:.2f} at a fixed rate, {as_sent:.2f} as sent; client p99 "
                    f"{row['wall_p99']:.2f}; plan latency {row['plan_ms']:.2f} ms at batch {b}; mean batch "
                    f"{row['mean_batch']:.2f}, generator p99 lag {row['lag_p99']:.1f} ms wall, "
                    f"{row['errors']} not 200",
                    flush=True,
                )
    print(
        "\n| model | load | offered req/s | answered req/s | plan latency: batch, ms | mean batch | "
        "predicted p99 ms: fixed rate / as sent | measured p99 ms (Server-Timing) | p99 / predicted "
        "(fixed / as sent) | client p99 ms | client p99 / predicted (fixed) | p99 / plan latency | "
        "generator lag p99, wall ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['fraction']:.0%} | {r['offered']:,.0f} | {r['answered']:,.0f} | "
            f"{r['batch']}, {r['plan_ms']:.2f} | {r['mean_batch']:.2f} | {r['fixed_ms']:.2f} / "
            f"{r['sent_ms']:.2f} | {r['p99']:.2f} | {r['p99'] / r['fixed_ms']:.2f} / "
            f"{r['p99'] / r['sent_ms']:.2f} | {r['wall_p99']:.2f} | {r['wall_p99'] / r['fixed_ms']:.2f} | "
            f"{r['p99'] / r['plan_ms']:.2f} | {r['lag_p99']:.1f} |"
        )
    below = [r for r in rows if r["fraction"] < 1.0]
    for what, key, ref in (
        ("measured p99 (Server-Timing) vs predicted at a fixed rate", "p99", "fixed_ms"),
        ("measured p99 (Server-Timing) vs predicted for the times sent", "p99", "sent_ms"),
        ("client p99 vs predicted at a fixed rate", "wall_p99", "fixed_ms"),
        ("measured p99 vs the plan's latency alone (an idle replica)", "p99", "plan_ms"),
    ):
        inside = sum(1 for r in below if abs(r[key] / r[ref] - 1) <= 0.10)
        print(f"below saturation, {what}: within 10% at {inside} of {len(below)} points")
    print(
        "\npredicted p99: the plan's times with the replica's batching policy replayed on the arrivals "
        "(`ServePlan.under_load`): a request that arrives while the device runs a batch waits for it, so "
        "under load the p99 lies up to one step above the plan's latency of a batch. Client p99: the wall "
        "time from when the request was due to its answer, times the time scale (the generator's lag, the "
        "API's and Redis' own time included, slowed clock and all)."
    )


# Part 3: autoscaling ----------------------------------------------------------------------------------


def part_autoscale(setup: Setup, before_s: float, after_s: float, low: float, high: float) -> None:
    print(f"\n## Autoscaling: open-loop load from {low:.0f} to {high:.0f} req/s\n", flush=True)
    if not CONTROL_PLANE:
        print(
            "not run: the control plane (POST /api/v1/endpoints, the autoscaler in the scheduler's loop) is "
            "not on this branch"
        )
        return
    # The LSTM one request at a time, on the real clock: a replica serves 120 req/s (8.4 ms a request),
    # so 500 req/s needs five; the first replica compiles (104 s), the ones the step adds only load
    # (10 s) from the executable cache.
    model = CURVE_MODELS["LSTM seq 128"]
    plan = plan_of(model, 1)
    autoscaling = {
        "target_queue_delay_ms": 20.0,
        "scale_up_delay_s": 2,
        "scale_down_delay_s": 600,
        "scale_to_zero_after_s": None,
    }
    print(
        f"LSTM seq 128, max_batch_size 1: {plan.throughput(1):.0f} req/s a replica; compile "
        f"{plan.compile_s:.0f} s, load {plan.load_s:.0f} s; replicas 1 to 8, autoscaling {autoscaling}\n",
        flush=True,
    )
    with start_endpoint(
        setup, model, time_scale=1.0, max_batch=1, max_wait_ms=0.0, replicas=(1, 8), autoscaling=autoscaling
    ) as ep:
        replicas: list[tuple[float, int, int]] = []
        seen: list[tuple[float, float, int]] = []
        """(s after the load began, requests/s arriving at the endpoint, queued): the autoscaler's view."""
        stop = False

        def watch() -> None:
            import redis as redis_lib

            from scheduler import inference

            data_plane = redis_lib.Redis.from_url(setup.redis_url)
            with ep.cloud.http(ep.key) as c:
                while not stop:
                    r = c.get(f"/api/v1/endpoints/{ep.id}")
                    if r.status_code == 200:
                        rep = r.json()["replicas"]
                        if not replicas or replicas[-1][1:] != (rep["ready"], rep["desired"]):
                            replicas.append((time.perf_counter() - t0, rep["ready"], rep["desired"]))
                    w = inference.windows(data_plane, [ep.id])[ep.id]
                    seen.append((time.perf_counter() - t0, w.arrival_rps, w.queued))
                    time.sleep(0.25)

        import threading

        t0 = time.perf_counter()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        samples = open_loop(
            ep.infer_url,
            v2_binary(plan),
            ep.key,
            lambda t: low if t < before_s else high,
            before_s + after_s,
            # Enough that the backlog waits in the endpoint's queue, where the autoscaler sees it,
            # rather than in the generator for a free connection (1 replica short by 380 req/s).
            connections=4096,
        )
        stop = True
        watcher.join(5)
    print(
        "| second (sent) | offered req/s | answered 200 | 429 / 503 / other | no answer | "
        "p50 / p99 wall ms | p99 emulated ms | generator lag p99 ms | replicas ready / desired | "
        "arriving at the endpoint req/s (last 3 s) / queued |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for sec in range(int(before_s + after_s)):
        in_sec = [s for s in samples if sec <= s.due < sec + 1]
        ok = [s for s in in_sec if s.status == 200]
        state = [x for x in replicas if x[0] <= sec + 1]
        ready = f"{state[-1][1]} / {state[-1][2]}" if state else "-"
        view = [x for x in seen if x[0] <= sec + 1]
        arriving = f"{view[-1][1]:.0f} / {view[-1][2]}" if view else "-"
        wall = [s.wall_ms for s in ok]
        refused = (
            "/".join(str(sum(1 for s in in_sec if s.status == code)) for code in (429, 503))
            + f"/{sum(1 for s in in_sec if s.status not in (0, 200, 429, 503))}"
        )
        silent = sum(1 for s in in_sec if s.status == 0)
        print(
            f"| {sec} | {low if sec < before_s else high:.0f} | {len(ok)} | {refused} | {silent} | "
            f"{percentile(wall, 0.5):.0f} / {percentile(wall, 0.99):.0f} | "
            f"{percentile([s.emulated_ms for s in ok if s.emulated_ms is not None], 0.99):.1f} | "
            f"{percentile([s.lag_ms for s in in_sec], 0.99):.0f} | {ready} | {arriving} |"
        )
    print(
        "\nreplica changes (s after the load began: ready, desired): "
        + ", ".join(f"{t:.1f}: {r}, {d}" for t, r, d in replicas)
    )
    by_status: dict[int, int] = {}
    for s in samples:
        by_status[s.status] = by_status.get(s.status, 0) + 1
    print(
        f"requests sent: {len(samples)}; answers by status: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(by_status.items()) if k)
        + f"; without an HTTP answer: {by_status.get(0, 0)}"
    )
    needed = math.ceil(high / plan.throughput(1))
    for what, hit in (
        ("more replicas wanted", next((t for t, _, d in replicas if d > 1), None)),
        ("a second replica ready", next((t for t, r, _ in replicas if r > 1), None)),
        (
            f"{needed} replicas ready (enough for {high:.0f} req/s)",
            next((t for t, r, _ in replicas if r >= needed), None),
        ),
    ):
        print(f"from the step to {what}: " + (f"{hit - before_s:.1f} s" if hit is not None else "never"))
    late = [s for s in samples if s.due >= before_s and s.status == 200]
    if late:
        settled = next(
            (
                sec
                for sec in range(int(before_s), int(before_s + after_s))
                if percentile([s.wall_ms for s in late if s.due >= sec], 0.99) < 100
            ),
            None,
        )
        when = f"{settled - before_s:.0f} s after the step" if settled is not None else "never in the run"
        print(f"p99 (wall) of every request sent from then on under 100 ms from: {when}")


# Main -------------------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve-host":
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        for name in ("--redis-url", "--endpoint", "--model"):
            ap.add_argument(name, required=True)
        ap.add_argument("--max-batch", type=int, required=True)
        ap.add_argument("--time-scale", type=float, required=True)
        ap.add_argument("--replicas", type=int, default=1)
        serve_host(ap.parse_args())
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="overhead,curves,autoscale")
    ap.add_argument("--seconds", type=int, default=10, help="wrk's duration per concurrency (overhead)")
    ap.add_argument("--concurrency", default="1,4,16,64", help="wrk connections, comma-separated (overhead)")
    ap.add_argument(
        "--hand-route",
        action="store_true",
        help="overhead: the data plane alone (a route published by hand, a serving host process)",
    )
    ap.add_argument("--curve-seconds", type=float, default=10.0, help="load per point (curves)")
    ap.add_argument(
        "--curve-loads",
        default=",".join(str(f) for f in CURVE_FRACTIONS),
        help="fractions of saturation to load (curves)",
    )
    ap.add_argument("--curve-models", default="", help=f"comma-separated, of: {', '.join(CURVE_MODELS)}")
    ap.add_argument("--step", default="10,50", help="seconds at 10 req/s, then at 500 (autoscale)")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ipucloud-bench",
    )
    ap.add_argument("--database-url", default=os.environ.get("IPUCLOUD_BENCH_DATABASE_URL", PG_DEFAULT))
    ap.add_argument("--redis-url", default=os.environ.get("IPUCLOUD_BENCH_REDIS_URL", REDIS_DEFAULT))
    ap.add_argument(
        "--database-name",
        default="ipucloud_bench_endpoints",
        help="the PostgreSQL database to drop and create (a run beside another needs its own)",
    )
    args = ap.parse_args()
    only = set(args.only.split(","))
    os.environ.setdefault("IPUCLOUD_SECRET_KEY", "benchmark-secret-" + os.urandom(8).hex())
    cores = os.cpu_count() or 2
    print(
        f"# ipucloud inference endpoints, {cores} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}, endpoints "
        f"{'by POST /api/v1/endpoints' if CONTROL_PLANE else 'by a hand-published route (no control plane)'}"
    )
    print(f"# reproduce: {COMMAND} " + " ".join(sys.argv[1:]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="ipucloud-endpoints-bench-"))
    setup = Setup(args.database_url, args.redis_url, work, api_workers=cores, db_name=args.database_name)
    try:
        if "overhead" in only:
            part_overhead(
                setup,
                args.cache_dir,
                [int(c) for c in args.concurrency.split(",")],
                args.seconds,
                control_plane=CONTROL_PLANE and not args.hand_route,
            )
        if "curves" in only:
            part_curves(
                setup,
                args.curve_seconds,
                fractions=tuple(float(x) for x in args.curve_loads.split(",")),
                models=tuple(
                    m for m in CURVE_MODELS if not args.curve_models or m in args.curve_models.split(",")
                ),
            )
        if "autoscale" in only:
            before, after = (float(x) for x in args.step.split(","))
            part_autoscale(setup, before, after, 10.0, 500.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
