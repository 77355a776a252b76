"""`ipucloud.Client`: the synchronous Python client of the HTTP API (httpx)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from typing import TypeVar

import httpx
import orjson

from ipucloud.sdk import _api
from ipucloud.sdk._api import Operations
from ipucloud.sdk._core import (
    NOT_SENT,
    RETRY_STATUSES,
    Call,
    RetryPolicy,
    Sender,
    SSEDecoder,
    auth_headers,
)
from ipucloud.sdk.config import resolve
from ipucloud.sdk.errors import ApiError, ServiceUnreachable
from ipucloud.sdk.models import Job, OnnxModel, StreamEvent

T = TypeVar("T")

USER_AGENT = "ipucloud-python/0.1.0"


def stream_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    # The server sends a keep-alive comment every ~30 s of silence; twice that means it is gone.
    return httpx.Timeout(timeout.connect or 10.0, read=90.0, write=timeout.write, pool=timeout.pool)


class Client(Operations, Sender):
    """A client for one ipucloud, authenticated by one API key.

    URL and key come from the arguments, else `IPUCLOUD_URL` / `IPUCLOUD_API_KEY`, else the file
    `ipucloud login` writes. Requests answered 429 or 503 are retried with backoff, honouring
    `Retry-After`; job submissions carry an `Idempotency-Key`, so a retried submission never
    creates a second job. Errors raise `ApiError` subclasses carrying the problem body.

        with Client() as c:
            job = c.submit_job(name="r50", model="resnet50", batch_size=64, steps=100, ipus=4)
            for event in c.stream_logs(job.id):
                ...
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        creds = resolve(url, key)
        self.url = creds.url
        self.key = creds.key
        self.retry = retry or RetryPolicy()
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._http = httpx.Client(
            base_url=self.url,
            timeout=self.timeout,
            transport=transport,
            headers={"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})},
        )

    # Plumbing ----------------------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(self, call: Call[T]) -> T:
        """Send one call, retrying on 429/503 and on connection failures that are safe to retry."""
        headers = auth_headers(call, self.key)
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    params=call.clean_params(),
                    json=call.json,
                    headers=headers,
                    files=call.files,
                    data=call.data,
                    content=call.content,
                )
            except httpx.TransportError as exc:
                safe = isinstance(exc, NOT_SENT) or call.retry_safe_on_transport_error
                if safe and attempt < self.retry.max_retries:
                    self.retry.sleep(self.retry.delay(attempt))
                    attempt += 1
                    continue
                raise ServiceUnreachable(self.url, exc)
            if response.status_code in RETRY_STATUSES and attempt < self.retry.max_retries:
                self.retry.sleep(self.retry.delay(attempt, response))
                attempt += 1
                continue
            if response.is_error:
                raise ApiError.from_response(response)
            return call.parse(response)

    # What is not one `Call` (the rest is `Operations`, in `_api.py`) --------------------------------

    def push_model(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        dims: Mapping[str, int] | None = None,
        elementwise: list[str] | None = None,
    ) -> OnnxModel:
        """Upload an ONNX file as one of your models. Its weights are stripped here first, so only the
        graph travels; ``dims`` sizes its dynamic dimensions (besides the batch), ``elementwise`` names
        operators the emulator does not know that act element by element."""
        filename, graph = _api.stripped_graph(path)
        return self.call(_api.push_model(filename, graph, name, dims, elementwise))

    def stream_logs(
        self, job_id: str, *, after: int | None = None, timeout: float | None = None
    ) -> Iterator[StreamEvent]:
        """Follow a job live (server-sent events) until it ends; the last event is `end`.

        A dropped connection is resumed where it stopped (`Last-Event-ID`), so no line is lost
        or repeated. With `timeout`, raise TimeoutError if the job has not ended by then (checked
        whenever the server sends something, at least every 30 s).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_id = after
        failures = 0
        while True:
            headers = auth_headers(_api.stream_call(job_id), self.key)
            headers["Accept"] = "text/event-stream"
            if last_id is not None:
                headers["Last-Event-ID"] = str(last_id)
            try:
                with self._http.stream(
                    "GET",
                    _api.logs_stream_path(job_id),
                    headers=headers,
                    timeout=stream_timeout(self.timeout),
                ) as response:
                    if response.status_code in RETRY_STATUSES and failures < self.retry.max_retries:
                        response.read()
                        self.retry.sleep(self.retry.delay(failures, response))
                        failures += 1
                        continue
                    if response.is_error:
                        response.read()
                        raise ApiError.from_response(response)
                    decoder = SSEDecoder()
                    for line in response.iter_lines():
                        if deadline is not None and time.monotonic() > deadline:
                            raise TimeoutError(f"job {job_id} did not end within {timeout} s")
                        frame = decoder.feed(line)
                        if frame is None:
                            continue
                        event = _event(*frame)
                        failures = 0
                        if event.id is not None:
                            last_id = event.id
                        yield event
                        if event.event == "end":
                            return
            except httpx.TransportError as exc:
                if failures >= self.retry.max_retries:
                    raise ServiceUnreachable(self.url, exc)
                self.retry.sleep(self.retry.delay(failures))
                failures += 1

    def wait_job(self, job_id: str, *, timeout: float | None = None, poll_s: float = 1.0) -> Job:
        """Poll until the job ends; raise TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.done:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.state} after {timeout} s")
            time.sleep(poll_s)


def _event(event: str, event_id: str | None, data: str) -> StreamEvent:
    try:
        parsed = orjson.loads(data) if data else {}
    except orjson.JSONDecodeError:
        parsed = {"message": data}
    if not isinstance(parsed, dict):
        parsed = {"value": parsed}
    numeric = event_id is not None and event_id.isascii() and event_id.isdigit()
    return StreamEvent(
        event=event, id=int(event_id) if event_id is not None and numeric else None, data=parsed
    )
