"""The inference request path in the API: Open Inference Protocol (KServe v2) tensors in and out, and
the hop to the endpoint's replicas over Redis (``scheduler/inference.py``). Nothing here reads the
database: the endpoint's route comes from Redis (cached for a second), the caller's key from the key
cache (a key not seen for a while is checked once in a worker thread).

Per API process, one ``Gateway`` per event loop:
- requests for the same endpoint that arrive in the same turn of the loop are enqueued together
  (one ``ENQUEUE`` script call for all of them: a group commit), so a burst costs one round trip;
- one reader pulls the answers the replicas push to this process's reply list and wakes the waiting
  requests;
- counters it alone knows (503s) are written in batches, as the replicas write theirs.

A request's content never travels to a replica: the replica needs only its row count, and the
answer's tensors are computed here from the request (``vipu.emulator.serving.outputs_for``: the
emulator times a model, it does not compute one), so the same inputs give the same outputs on any
API process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from redis.asyncio import Redis as AsyncRedis
from starlette.responses import Response

from api.fast_path import KeySecret, read_body
from api.metrics import LATENCY, REQUESTS, post_metric
from api.problems import problem
from scheduler import inference
from scheduler.inference import Answer, Envelope, Route
from scheduler.runtime import Runtime
from scheduler.services.tenancy import keys
from vipu.emulator.serving import V2_BYTES, Signature, TensorSpec, numpy_types, outputs_for

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("ipucloud.api.inference")

MAX_GROUP = 512
"""Envelopes enqueued by one script call at most."""
REPLY_GRACE_S = 30.0
"""How long past the emulated time a request waits for its replica before it is answered 503."""
MAX_INFER_TIMEOUT_S = 600.0
REPLY_DRAIN = 4096
"""Answers the reader takes with each one it waits for (more wait for its next turn)."""
COUNT_WAIT_S = 1.0
"""How long a 503 waits for its count to be written before it is answered anyway."""
INFERENCE_HEADER = "inference-header-content-length"


class InferError(Exception):
    """A request the protocol refuses: its status, message and, for 429/503, when to try again."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


# Tensors ---------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Parsed:
    request_id: str | None
    rows: int
    digest: bytes
    outputs: list[tuple[TensorSpec, bool]]
    """The outputs to answer, each with whether it goes back as binary data."""


def parse_request(body: bytes, header_length: str | None, signature: Signature, max_rows: int) -> Parsed:
    """A v2 infer request checked against the model's signature: JSON, or JSON followed by binary
    tensors (the binary tensor extension, ``Inference-Header-Content-Length``)."""
    binary = b""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InferError(400, "Inference-Header-Content-Length must be a number of bytes")
        if not 0 <= n <= len(body):
            raise InferError(
                400, f"Inference-Header-Content-Length {n} is outside the body's {len(body)} bytes"
            )
        body, binary = body[:n], body[n:]
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InferError(400, f"the request is not JSON: {exc}")
    if not isinstance(doc, dict):
        raise InferError(400, "the request must be a JSON object with an `inputs` list")
    rid = doc.get("id")
    if rid is not None and (not isinstance(rid, str) or len(rid) > 256):
        raise InferError(400, "`id` must be a string of at most 256 characters")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InferError(400, "`parameters` must be an object")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InferError(400, "`inputs` must be a non-empty list of tensors")
    expected = {t.name: t for t in signature.inputs}
    seen: set[str] = set()
    rows: int | None = None
    h = hashlib.blake2b(digest_size=16)
    offset = 0
    for tensor in inputs:
        if not isinstance(tensor, dict):
            raise InferError(400, "each input must be an object with name, shape, datatype and data")
        name = tensor.get("name")
        if not isinstance(name, str) or name not in expected:
            raise InferError(400, f"unexpected input {name!r}; the model takes {', '.join(expected)}")
        if name in seen:
            raise InferError(400, f"input {name!r} is given twice")
        seen.add(name)
        spec = expected[name]
        datatype = tensor.get("datatype")
        if datatype != spec.datatype:
            raise InferError(
                400, f"input {name!r} has datatype {datatype!r}; the model takes {spec.datatype}"
            )
        shape = tensor.get("shape")
        if (
            not isinstance(shape, list)
            or len(shape) != len(spec.shape)
            or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        ):
            raise InferError(
                400, f"input {name!r} must have shape {list(spec.shape)} (-1: the batch), got {shape!r}"
            )
        for got, want in zip(shape, spec.shape, strict=True):
            if want != -1 and got != want:
                raise InferError(
                    400, f"input {name!r} must have shape {list(spec.shape)} (-1: the batch), got {shape}"
                )
        batch = shape[spec.shape.index(-1)] if -1 in spec.shape else 1
        if batch < 1:
            raise InferError(400, f"input {name!r} has {batch} rows; a request carries at least one")
        if rows is not None and batch != rows:
            raise InferError(400, f"input {name!r} has {batch} rows, another input {rows}: they must agree")
        if batch > max_rows:
            raise InferError(
                400,
                f"a request carries at most {max_rows} rows (the endpoint's max_batch_size); "
                f"input {name!r} has {batch}",
            )
        rows = batch
        count = math.prod(shape)
        tparams = tensor.get("parameters") or {}
        if not isinstance(tparams, dict):
            raise InferError(400, f"input {name!r}: `parameters` must be an object")
        size = tparams.get("binary_data_size")
        dtype = numpy_types()[spec.datatype]
        if size is not None:
            want_bytes = count * V2_BYTES[spec.datatype]
            if not isinstance(size, int) or isinstance(size, bool) or size != want_bytes:
                raise InferError(
                    400, f"input {name!r}: binary_data_size must be {want_bytes} for shape {shape}"
                )
            if "data" in tensor:
                raise InferError(400, f"input {name!r} has both data and binary_data_size")
            chunk = binary[offset : offset + size]
            if len(chunk) != size:
                raise InferError(
                    400, f"input {name!r}: the body ends {size - len(chunk)} bytes short of its binary data"
                )
            offset += size
            h.update(name.encode() + b"\x00" + chunk)
            continue
        arr = _json_tensor(name, tensor.get("data"), spec.datatype, count)
        h.update(name.encode() + b"\x00" + arr.astype(dtype, copy=False).tobytes())
    missing = [n for n in expected if n not in seen]
    if missing:
        raise InferError(400, f"missing input(s) {', '.join(missing)}")
    if offset != len(binary):
        raise InferError(400, f"{len(binary) - offset} bytes of binary data follow the inputs unclaimed")
    assert rows is not None
    return Parsed(rid, rows, h.digest(), _requested_outputs(doc.get("outputs"), params, signature))


def _json_tensor(name: str, data: Any, datatype: str, count: int) -> np.ndarray:
    import numpy as np

    if data is None:
        raise InferError(400, f"input {name!r} has no data")
    if not isinstance(data, list):
        data = [data]
    try:
        arr = np.array(data)
    except (ValueError, TypeError):
        raise InferError(400, f"input {name!r}: its data is ragged or not numbers")
    kind = arr.dtype.kind
    if datatype == "BOOL":
        ok = kind == "b"
    elif datatype.startswith(("INT", "UINT")):
        ok = kind in "iu"
    else:
        ok = kind in "iuf"
    if not ok:
        what = (
            "booleans"
            if datatype == "BOOL"
            else "integers"
            if datatype.startswith(("INT", "UINT"))
            else "numbers"
        )
        raise InferError(400, f"input {name!r} ({datatype}) must hold {what} only")
    if arr.size != count:
        raise InferError(400, f"input {name!r} holds {arr.size} elements; its shape needs {count}")
    if kind in "iu" and arr.size and datatype.startswith(("INT", "UINT")):
        info = np.iinfo(numpy_types()[datatype])
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise InferError(400, f"input {name!r}: a value is out of {datatype}'s range")
    if kind == "f" and not np.isfinite(arr).all():
        raise InferError(400, f"input {name!r} holds a value that is not a finite number")
    return arr


def _requested_outputs(
    outputs: Any, params: Mapping[str, Any], signature: Signature
) -> list[tuple[TensorSpec, bool]]:
    default_binary = bool(params.get("binary_data_output", False))
    if outputs is None:
        return [(t, default_binary) for t in signature.outputs]
    if not isinstance(outputs, list):
        raise InferError(400, "`outputs` must be a list")
    by_name = {t.name: t for t in signature.outputs}
    chosen: list[tuple[TensorSpec, bool]] = []
    for o in outputs:
        name = o.get("name") if isinstance(o, dict) else None
        if name not in by_name:
            raise InferError(400, f"unknown output {name!r}; the model answers {', '.join(by_name)}")
        p = o.get("parameters") or {}
        chosen.append(
            (
                by_name[name],
                bool(p.get("binary_data", default_binary)) if isinstance(p, dict) else default_binary,
            )
        )
    return chosen


def render_response(route: Route, parsed: Parsed, answer: Answer) -> tuple[bytes, dict[str, str]]:
    """The v2 answer: JSON, or JSON then binary tensors when any output was asked as binary data."""
    signature = signature_of_route(route)
    wanted = {t.name for t, _ in parsed.outputs}
    arrays = dict(
        zip(
            (t.name for t in signature.outputs),
            outputs_for(signature, parsed.rows, parsed.digest),
            strict=True,
        )
    )
    out: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for spec, binary in parsed.outputs:
        arr = arrays[spec.name]
        entry: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": list(arr.shape)}
        if binary:
            raw = arr.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = arr.reshape(-1).tolist()
        out.append(entry)
    doc: dict[str, Any] = {
        "model_name": route.name,
        "model_version": "1",
        "outputs": out,
        "parameters": {"replica": answer.replica, "batch_size": answer.batch},
    }
    if parsed.request_id is not None:
        doc["id"] = parsed.request_id
    del wanted
    headers = {
        "server-timing": (
            f"queue;dur={answer.queue_ms:.3f}, batch;dur={answer.batch_ms:.3f}, "
            f"host;dur={answer.host_ms:.3f}, ipu;dur={answer.ipu_ms:.3f}"
        ),
        "x-ipucloud-replica": str(answer.replica),
        "x-ipucloud-batch-size": str(answer.batch),
    }
    head = orjson.dumps(doc)
    if blobs:
        headers[INFERENCE_HEADER] = str(len(head))
        headers["content-type"] = "application/octet-stream"
        return head + b"".join(blobs), headers
    headers["content-type"] = "application/json"
    return head, headers


_SIGNATURES: dict[str, Signature] = {}
_LAST_ROUTE: list[tuple[Route, Signature]] = []
"""The last route asked about and its signature: a gateway hands out the same cached route to every
request for a second, so most calls skip serializing the signature to find it."""


def signature_of_route(route: Route) -> Signature:
    if _LAST_ROUTE and _LAST_ROUTE[0][0] is route:
        return _LAST_ROUTE[0][1]
    sig = _signature_of(route)
    _LAST_ROUTE[:] = [(route, sig)]
    return sig


def _signature_of(route: Route) -> Signature:
    key = orjson.dumps(route.signature).decode()
    sig = _SIGNATURES.get(key)
    if sig is None:
        if len(_SIGNATURES) > 1024:
            _SIGNATURES.clear()
        sig = _SIGNATURES[key] = Signature(
            tuple(TensorSpec(t["name"], t["datatype"], tuple(t["shape"])) for t in route.signature["inputs"]),
            tuple(
                TensorSpec(t["name"], t["datatype"], tuple(t["shape"])) for t in route.signature["outputs"]
            ),
        )
    return sig


def model_metadata(route: Route) -> dict[str, Any]:
    return {
        "name": route.name,
        "versions": ["1"],
        "platform": "ipucloud-emulated-ipu",
        "inputs": route.signature["inputs"],
        "outputs": route.signature["outputs"],
    }


# The hop to the replicas ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Late:
    """No answer within the time waited; ``then`` is where one that comes later goes."""

    then: asyncio.Future[Answer | _Late]


@dataclass(eq=False)
class _Pending:
    envelopes: list[bytes] = field(default_factory=list)
    futures: list[asyncio.Future[tuple[bool | None, int]]] = field(default_factory=list)
    route: Route | None = None


class Gateway:
    """One API process's side of the request path, bound to its event loop."""

    def __init__(self, runtime: Runtime, loop: asyncio.AbstractEventLoop) -> None:
        self.runtime = runtime
        self.loop = loop
        self.waiter = f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(4)}"
        self.redis: AsyncRedis = AsyncRedis.from_url(runtime.settings.broker_url, socket_connect_timeout=5)
        self._reader_redis: AsyncRedis = AsyncRedis.from_url(
            runtime.settings.broker_url, socket_connect_timeout=5
        )
        self.scripts = inference.Scripts(self.redis)
        self.waiting: dict[str, asyncio.Future[Answer | _Late]] = {}
        self.routes: dict[str, tuple[float, Route | None]] = {}
        self.pending: dict[str, _Pending] = {}
        self.counts = inference.Counts()
        self._reader: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flush_lock = asyncio.Lock()

    async def route(self, endpoint_id: str) -> Route | None:
        now = time.monotonic()
        cached = self.routes.get(endpoint_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        raw = await self.redis.get(inference.route_key(endpoint_id))
        route = Route.from_json(raw) if raw else None
        if route is not None:
            warm_tensors()
        if len(self.routes) > 10_000:
            self.routes.clear()
        self.routes[endpoint_id] = (now + inference.ROUTE_CACHE_S, route)
        return route

    def forget_route(self, endpoint_id: str) -> None:
        self.routes.pop(endpoint_id, None)

    async def ready_replicas(self, endpoint_id: str) -> int:
        return int(await self.redis.zcount(inference.ready_key(endpoint_id), time.time(), "+inf"))

    def _ensure_tasks(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = self.loop.create_task(self._read_replies())
        if self._flusher is None or self._flusher.done():
            self._flusher = self.loop.create_task(self._flush_counts())

    async def submit(
        self, route: Route, rows: int, deadline: float
    ) -> tuple[str, asyncio.Future[Answer | _Late], int]:
        """Queue one request; returns its id, the future of its answer, and how many replicas were
        serving when it was queued. Raises InferError(429) past the endpoint's ``max_queue``."""
        self._ensure_tasks()
        self._seq += 1
        rid = f"{self._seq:x}{secrets.token_hex(3)}"
        env = Envelope(rid, self.waiter, rows, int(deadline * 1000), int(time.time() * 1e6)).encode()
        answer: asyncio.Future[Answer | _Late] = self.loop.create_future()
        self.waiting[rid] = answer
        accepted: asyncio.Future[tuple[bool | None, int]] = self.loop.create_future()
        p = self.pending.get(route.endpoint_id)
        if p is None:
            p = self.pending[route.endpoint_id] = _Pending(route=route)
            # Whatever else arrives in this turn of the loop joins the same script call.
            self.loop.call_soon(self._start_enqueue, route.endpoint_id)
        p.envelopes.append(env)
        p.futures.append(accepted)
        try:
            ok, ready = await accepted
        except BaseException:
            self.waiting.pop(rid, None)
            raise
        if ok is None:
            self.waiting.pop(rid, None)
            self.forget_route(route.endpoint_id)
            raise InferError(404, f"endpoint {route.name} has stopped: it takes no requests")
        if not ok:
            self.waiting.pop(rid, None)
            raise InferError(
                429,
                f"The endpoint's queue is full ({route.max_queue} requests waiting); try again shortly.",
                1.0,
            )
        return rid, answer, ready

    def _start_enqueue(self, endpoint_id: str) -> None:
        task = self.loop.create_task(self._enqueue(endpoint_id))
        self._tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    async def _enqueue(self, endpoint_id: str) -> None:
        p = self.pending.pop(endpoint_id, None)
        if p is None or p.route is None:
            return
        route = p.route
        for i in range(0, len(p.envelopes), MAX_GROUP):
            envs, futs = p.envelopes[i : i + MAX_GROUP], p.futures[i : i + MAX_GROUP]
            keys, args = inference.enqueue_args(endpoint_id, envs, route.max_queue, time.time())
            try:
                took, ready = await self.scripts.enqueue(keys=keys, args=args)
            except Exception as exc:
                for f in futs:
                    if not f.done():
                        f.set_exception(InferError(503, f"the request queue is unavailable: {exc}", 1.0))
                continue
            for j, f in enumerate(futs):
                if not f.done():
                    f.set_result((None if int(took) < 0 else j < int(took), int(ready)))

    async def _read_replies(self) -> None:
        key = inference.reply_key(self.waiter)
        r = self._reader_redis
        while True:
            try:
                # One round trip: Redis runs the RPOP the moment the blocking pop is served (a blocked
                # client's next commands wait in its buffer), so the answers that arrived with the
                # first come back with it. A BLPOP, then an LRANGE and DEL, put a second round trip
                # between every answer and its request at one connection.
                pipe = r.pipeline(transaction=False)
                pipe.brpop([key], timeout=1)
                pipe.rpop(key, REPLY_DRAIN)
                got, rest = await pipe.execute()
                if got is None:
                    continue
                batch = [got[1], *(rest or ())]  # pushed on the left: popped from the right, oldest first
                for raw in batch:
                    a = Answer.decode(raw)
                    f = self.waiting.pop(a.rid, None)
                    if f is not None and not f.done():
                        f.set_result(a)
                # The requests just woken run first (each is one loop turn from its answer: see
                # `answer_within`) and write their HTTP answers before this reader writes its next pop:
                # at one connection that write, and Redis waking for it, were on every request's path.
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("inference: reading answers failed (%s); retrying", exc)
                await asyncio.sleep(0.2)

    async def answer_within(
        self, rid: str, fut: asyncio.Future[Answer | _Late], timeout: float
    ) -> Answer | _Late:
        """The request's answer, or, after ``timeout`` seconds without one, a ``_Late`` holding the future
        a later answer will reach. The request's task waits on ``fut`` itself, so an answer wakes it in
        one turn of the loop (``wait_for`` around a ``shield`` took three, and the reader's next write
        to Redis went out before the request's answer did)."""
        if fut.done():
            return fut.result()
        timer = self.loop.call_later(timeout, self._late, rid, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    def _late(self, rid: str, fut: asyncio.Future[Answer | _Late]) -> None:
        if fut.done():
            return
        # In the same callback: an answer read after this lands in the fresh future, never nowhere.
        fresh: asyncio.Future[Answer | _Late] = self.loop.create_future()
        if self.waiting.get(rid) is fut:
            self.waiting[rid] = fresh
        fut.set_result(_Late(fresh))

    async def _flush_counts(self) -> None:
        while True:
            await asyncio.sleep(inference.BUCKET_S / 40)
            await self._flush_once()

    async def _flush_once(self) -> bool:
        """Write what is counted; on failure keep it for the next flush. One flush at a time: when it
        returns, whatever was counted before it was called has been written, or kept after a failure."""
        async with self._flush_lock:
            if not self.counts:
                return True
            pipe = self.redis.pipeline(transaction=False)
            fields = self.counts.write(pipe)
            try:
                await pipe.execute()
            except Exception as exc:
                self.counts.restore(fields)
                log.warning("inference: counters not written (%s); kept for the next flush", exc)
                return False
            except BaseException:
                self.counts.restore(fields)
                raise
            return True

    async def unavailable(self, endpoint_id: str) -> None:
        """Count a 503 and see it written before the caller answers it. Left to the next periodic
        flush, a 503 was in no counter for up to a quarter of a second after its client had it: a
        reader right after (the endpoint fault test, reading its counters just after the DELETE that
        follows the load) found the counter one short of the 503s answered. A 503 is the rare path;
        one round trip more is its cost. If Redis does not take it within ``COUNT_WAIT_S`` the answer
        goes anyway and the count stays for the next flush."""
        self.counts.incr(endpoint_id, "unavailable_503")
        flush = self.loop.create_task(self._flush_once())
        self._tasks.add(flush)  # kept to its end even if this request stops waiting for it
        flush.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait_for(asyncio.shield(flush), COUNT_WAIT_S)
        except TimeoutError:
            log.warning("inference: a 503 went out before its count was written (the write goes on)")


_GATEWAYS: dict[tuple[int, int], Gateway] = {}


_TENSORS_WARM = threading.Event()


def warm_tensors() -> None:
    """Import NumPy (`numpy_types`) in a thread of its own, once per process, when this process first
    finds a live endpoint. It is imported lazily so that an API serving no endpoint does not hold it
    (tests/cli/test_idle_memory.py), but importing it inside a request cost that request 180-650 ms:
    with `wrk`'s correction for coordinated omission one such request set the one-connection p99
    (docs/performance.md). A client's first contact (`is_server_ready`, the model's metadata) starts
    it, so its first infer call finds NumPy loaded or loading."""
    if _TENSORS_WARM.is_set():
        return
    _TENSORS_WARM.set()
    threading.Thread(target=_load_tensors, name="ipucloud-tensors-warm", daemon=True).start()


def _load_tensors() -> None:
    numpy_types()  # parse_request's
    import numpy.random  # noqa: F401  outputs_for's (NumPy may load it on first use)


def gateway(runtime: Runtime) -> Gateway:
    """The gateway of this runtime on the running event loop (tests run several loops in turn)."""
    loop = asyncio.get_running_loop()
    key = (id(runtime), id(loop))
    g = _GATEWAYS.get(key)
    if g is None or g.loop is not loop or g.runtime is not runtime:
        for k, old in list(_GATEWAYS.items()):
            if old.loop.is_closed():
                _GATEWAYS.pop(k, None)
        g = _GATEWAYS[key] = Gateway(runtime, loop)
    return g


# The whole of one request ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]


async def infer(runtime: Runtime, route: Route, model: str, body: bytes, header_length: str | None) -> Reply:
    """One v2 infer request for an endpoint the caller may invoke: parse, queue, wait, answer."""
    if model != route.name:
        raise InferError(404, f"no model {model!r} here; this endpoint serves {route.name!r}")
    if not route.accepting:
        raise InferError(503, f"endpoint {route.name} is {route.state}: it takes no requests", 30.0)
    parsed = parse_request(body, header_length, signature_of_route(route), route.max_batch_size)
    g = gateway(runtime)
    # The cold start timeout is wall seconds: how long a caller is kept waiting, whatever the time scale.
    cold = max(route.cold_start_timeout_s, 0.0)
    # Nobody waits past this: a replica that takes the request later drops it unanswered.
    deadline = time.time() + cold + REPLY_GRACE_S
    rid, fut, ready = await g.submit(route, parsed.rows, deadline)
    timeout = min(cold if ready == 0 else REPLY_GRACE_S + cold, MAX_INFER_TIMEOUT_S)
    try:
        answer = await _wait(g, route, rid, fut, timeout, cold_start=ready == 0)
    except BaseException:
        g.waiting.pop(rid, None)
        raise
    if answer.status == inference.GONE:
        raise InferError(404, f"endpoint {route.name} stopped before a replica started this request")
    if answer.status != 200:
        await g.unavailable(route.endpoint_id)
        raise InferError(503, "the replica serving this request was lost; try again", 1.0)
    content, headers = render_response(route, parsed, answer)
    return Reply(200, content, headers)


async def _wait(
    g: Gateway,
    route: Route,
    rid: str,
    fut: asyncio.Future[Answer | _Late],
    timeout: float,
    *,
    cold_start: bool,
) -> Answer:
    got = await g.answer_within(rid, fut, timeout)
    if isinstance(got, Answer):
        return got
    # A replica may have become ready just as the cold start ran out: give it its share of the grace.
    if cold_start and (got.then.done() or await g.ready_replicas(route.endpoint_id) > 0):
        got = await g.answer_within(rid, got.then, REPLY_GRACE_S)
        if isinstance(got, Answer):
            return got
    await g.unavailable(route.endpoint_id)
    if cold_start:
        raise InferError(
            503,
            f"no replica of {route.name} became ready within its cold start timeout "
            f"({route.cold_start_timeout_s:g} s); it is starting: try again shortly",
            5.0,
        )
    raise InferError(503, f"no replica of {route.name} answered in time; try again", 5.0)


# The fast path ------------------------------------------------------------------------------------------

_INFER_PATH = re.compile(
    r"^/api/v1/endpoints/(ep_[A-Za-z0-9]{1,61})/v2/models/([^/]{1,63})(/versions/1)?/infer$"
)
_INFER_TEMPLATE = "/api/v1/endpoints/{endpoint_id}/v2/models/{model}/infer"
_VERSION_TEMPLATE = "/api/v1/endpoints/{endpoint_id}/v2/models/{model}/versions/{version}/infer"


class FastInfer:
    """The outermost layer of the API (``api.app.App`` calls it before FastAPI's own ``__call__``): a
    v2 infer call from a key verified moments ago, for an endpoint of its tenant, is answered here,
    without uvicorn's app ever reaching FastAPI's stack (its telemetry and error layers, the
    middleware, routing and dependency injection), which cost more CPU than the whole of the
    request's own work (measured: benchmarks/endpoints.py, docs/performance.md). Anything else, and
    any infer call this layer is not sure of (a key not in the cache, a key without `invoke`, another
    tenant's endpoint, no Content-Length, a body over the limit), goes to ``app`` (the whole FastAPI
    app), whose route gives the same answers the slow way and fills the key cache. What the outer
    layers give every answer this one gives itself: ``nosniff``, latency and counts in /metrics under
    the route's name, and a 500 problem for an unexpected error."""

    def __init__(self, app: Any, owner: Any) -> None:
        """``app``: where every other request goes; ``owner``: the app whose ``state.runtime`` serves."""
        self.app = app
        self.owner = owner
        self._secret = KeySecret()
        self._refreshing: set[str] = set()

    def _refresh(self, runtime: Runtime, key: str) -> None:
        """Check a key in use against the database before its cache entry expires (off the loop, one
        check a key at a time), so that its requests stay on this path."""
        if key in self._refreshing:
            return
        self._refreshing.add(key)
        job = asyncio.get_running_loop().run_in_executor(None, _reverify, runtime, self._secret(runtime), key)
        job.add_done_callback(lambda _: self._refreshing.discard(key))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        m = _INFER_PATH.match(scope["path"])
        if m is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        runtime: Runtime | None = getattr(self.owner.state, "runtime", None)
        headers = dict(scope["headers"])
        principal = None
        length = headers.get(b"content-length")
        if runtime is not None and length is not None and length.isdigit():
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, key = auth.partition(" ")
            if scheme.lower() == "bearer" and key.strip():
                try:
                    principal = keys.cached_principal(secret=self._secret(runtime), key=key.strip())
                except Exception:
                    principal = None
                if principal is not None and keys.refresh_due(key.strip()):
                    self._refresh(runtime, key.strip())
        if (
            runtime is None
            or principal is None
            or principal.suspended
            or ("invoke" not in principal.scopes and not principal.is_admin)
            or int(length or 0) > runtime.settings.infer_max_body_bytes
        ):
            await self.app(scope, receive, send)
            return
        endpoint_id, model = m.group(1), m.group(2)
        g = gateway(runtime)
        route = await g.route(endpoint_id)
        if route is None or (principal.tenant_id is not None and route.tenant_id != principal.tenant_id):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client went away
        header_length = headers.get(INFERENCE_HEADER.encode())
        try:
            reply = await infer(
                runtime, route, model, body, header_length.decode() if header_length else None
            )
        except InferError as exc:
            reply = _refusal(error_response(exc))
        except Exception:
            # FastAPI's ServerErrorMiddleware is not around this layer: the same 500 problem as its.
            log.exception("unhandled error on POST %s", scope["path"])
            reply = _refusal(
                problem(
                    500,
                    "Something failed on our side; nothing was changed.",
                    slug="internal-error",
                    instance=scope["path"],
                )
            )
        raw = [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        raw += [
            (b"content-length", str(len(reply.body)).encode()),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": reply.status, "headers": raw})
        await send({"type": "http.response.body", "body": reply.body})
        template = _VERSION_TEMPLATE if m.group(3) else _INFER_TEMPLATE
        post_metric(LATENCY, template).observe(time.perf_counter() - started)
        post_metric(REQUESTS, template, str(reply.status)).inc()


def _reverify(runtime: Runtime, secret: bytes, key: str) -> None:
    try:
        with runtime.db.read() as s:
            keys.reverify(session=s, secret=secret, key=key)
        principal = keys.cached_principal(secret=secret, key=key)
        # The whole stack touches a key's last use once a minute; a key only ever on this path is
        # touched here instead.
        if principal is not None and principal.key_id in keys.stale_last_use:
            with runtime.db.write() as s:
                keys.touch_last_used(session=s, key_id=principal.key_id)
    except Exception as exc:  # the entry then expires and the next request takes the whole stack
        log.warning("inference: a cached key could not be checked again: %s", type(exc).__name__)


def _refusal(resp: Response) -> Reply:
    headers = {k: v for k, v in resp.headers.items() if k != "content-length"}
    return Reply(resp.status_code, bytes(resp.body), headers)


def error_response(exc: InferError) -> Response:
    """A refusal as a problem (RFC 9457) that also carries the protocol's `error` member, which is what
    v2 clients read; 429 and 503 say when to try again."""
    headers = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.retry_after is not None else None
    return problem(exc.status, exc.message, headers=headers, error=exc.message)
