"""`ipucloud.AsyncClient`: the same API as `Client`, for asyncio programs."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

import httpx

from ipucloud.sdk import _api
from ipucloud.sdk._api import Operations
from ipucloud.sdk._core import (
    NOT_SENT,
    RETRY_STATUSES,
    AsyncSender,
    Call,
    RetryPolicy,
    SSEDecoder,
    auth_headers,
)
from ipucloud.sdk.client import USER_AGENT, _event, stream_timeout
from ipucloud.sdk.config import resolve
from ipucloud.sdk.errors import ApiError, ServiceUnreachable
from ipucloud.sdk.models import Job, OnnxModel, StreamEvent

T = TypeVar("T")


class AsyncClient(Operations, AsyncSender):
    """Asynchronous twin of `ipucloud.Client` (same methods, awaited; iterators are async).

    async with AsyncClient() as c:
        job = await c.submit_job(name="r50", model="resnet50", steps=100, ipus=4)
        async for event in c.stream_logs(job.id):
            ...
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        creds = resolve(url, key)
        self.url = creds.url
        self.key = creds.key
        self.retry = retry or RetryPolicy()
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=self.timeout,
            transport=transport,
            headers={"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})},
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(self, call: Call[T]) -> T:
        headers = auth_headers(call, self.key)
        attempt = 0
        while True:
            try:
                response = await self._http.request(
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
                    await self._sleep(self.retry.delay(attempt))
                    attempt += 1
                    continue
                raise ServiceUnreachable(self.url, exc)
            if response.status_code in RETRY_STATUSES and attempt < self.retry.max_retries:
                await self._sleep(self.retry.delay(attempt, response))
                attempt += 1
                continue
            if response.is_error:
                raise ApiError.from_response(response)
            return call.parse(response)

    # What is not one `Call` (the rest is `Operations`, in `_api.py`) --------------------------------

    async def push_model(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        dims: Mapping[str, int] | None = None,
        elementwise: list[str] | None = None,
    ) -> OnnxModel:
        """Upload an ONNX file as one of your models (weights stripped here first; see ``Client``)."""
        filename, graph = await asyncio.to_thread(_api.stripped_graph, path)
        return await self.call(_api.push_model(filename, graph, name, dims, elementwise))

    async def stream_logs(
        self, job_id: str, *, after: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Follow a job live until it ends, resuming after a dropped connection (`Last-Event-ID`).

        With `timeout`, raise TimeoutError if the job has not ended by then.
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
                async with self._http.stream(
                    "GET",
                    _api.logs_stream_path(job_id),
                    headers=headers,
                    timeout=stream_timeout(self.timeout),
                ) as response:
                    if response.status_code in RETRY_STATUSES and failures < self.retry.max_retries:
                        await response.aread()
                        await self._sleep(self.retry.delay(failures, response))
                        failures += 1
                        continue
                    if response.is_error:
                        await response.aread()
                        raise ApiError.from_response(response)
                    decoder = SSEDecoder()
                    async for line in response.aiter_lines():
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
                await self._sleep(self.retry.delay(failures))
                failures += 1

    async def wait_job(self, job_id: str, *, timeout: float | None = None, poll_s: float = 1.0) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.get_job(job_id)
            if job.done:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.state} after {timeout} s")
            await asyncio.sleep(poll_s)
