"""Group commit for job submissions: one writer thread per API process admits what arrives together.

The API process owns one `GroupSubmitter` (started in its lifespan, kept in `Runtime.extras`); the
submit route hands it a `SubmitRequest` and awaits the future. The writer admits a batch in one
transaction (`jobs.submit_jobs`: one INSERT of the batch's jobs and one of their first events, each a
pipelined executemany; one guarded reservation per tenant; one coalesced scheduler wake-up) and
answers each request only after that commit, each with its own outcome: a bad spec or a spent grant
is that request's error, the others of the batch commit.

A batch closes when it is full (`max_batch`), or when the queue is empty and either nothing else
was waiting (a lone client is admitted at once, it never waits for company) or the short deadline
(`max_wait_s`) has passed. The deadline is only waited for while the batch is smaller than the
number of clients the last commit saw submitting (the batch it answered and the requests that queued
while it was written): under a steady load of N clients the answers of one batch come back as the
next batch's requests a moment later, and waiting that moment keeps the batches at N instead of two
halves, one collecting while the other is written, each paying a whole batch's fixed work.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from scheduler import bus
from scheduler.models import Job
from scheduler.runtime import Runtime
from scheduler.services.batch import jobs as job_service

log = logging.getLogger("ipucloud.submit")

MAX_BATCH = 256
MAX_WAIT_S = 0.002

Answer = tuple[job_service.Submitted, dict[str, Any]]


@dataclass
class _Item:
    request: job_service.SubmitRequest
    future: Future[Answer]


_STOP = object()


class GroupSubmitter:
    """Admits submissions in batches, one transaction each; `submit` returns the request's future."""

    def __init__(
        self,
        runtime: Runtime,
        render: Callable[[Job], dict[str, Any]],
        *,
        max_batch: int = MAX_BATCH,
        max_wait_s: float = MAX_WAIT_S,
        start: bool = True,
    ) -> None:
        """`start=False` leaves the writer stopped until `start()` (a test queues a batch first)."""
        self.db = runtime.db
        self.render = render
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.queue: queue.SimpleQueue[_Item | object] = queue.SimpleQueue()
        self.waker = bus.CoalescingWaker("submit", runtime.redis_client())
        self.batches = 0  # committed batches, for tests and benchmarks
        self.compiled = job_service.CompiledKeys()
        self._expected = 1  # how many submitters a batch may wait for (`_learn`)
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name="submit-writer", daemon=True)
        if start:
            self.thread.start()

    def start(self) -> None:
        self.thread.start()

    def submit(self, request: job_service.SubmitRequest) -> Future[Answer]:
        """Queue one submission; the future holds (Submitted, response body) or the DomainError."""
        item = _Item(request, Future())
        if self._stopping:
            item.future.set_exception(RuntimeError("the API process is shutting down"))
            return item.future
        self.queue.put(item)
        return item.future

    def close(self, timeout: float = 10.0) -> None:
        """Admit what is queued, then stop the writer (the API's shutdown)."""
        self._stopping = True
        self.queue.put(_STOP)
        if self.thread.is_alive():
            self.thread.join(timeout)
        # After the writer: its last batch's wake-up goes out before the runtime closes Redis.
        self.waker.close()

    def _collect(self, first: _Item) -> tuple[list[_Item], bool]:
        batch = [first]
        stop = False
        deadline: float | None = None
        while len(batch) < self.max_batch:
            try:
                got = self.queue.get_nowait()
            except queue.Empty:
                if len(batch) >= self._expected or self.max_wait_s <= 0:
                    break
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.max_wait_s
                if now >= deadline:
                    break
                try:
                    got = self.queue.get(timeout=deadline - now)
                except queue.Empty:
                    break
            if got is _STOP:
                stop = True
                break
            assert isinstance(got, _Item)
            batch.append(got)
        return batch, stop

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is _STOP:
                return
            assert isinstance(first, _Item)
            batch, stop = self._collect(first)
            try:
                self._admit(batch)
            except Exception as exc:  # the database failed: every request of the batch is told so
                log.warning("a batch of %d submissions failed: %s", len(batch), exc)
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
            self._learn(batch)
            if stop:
                return

    def _learn(self, batch: list[_Item]) -> None:
        """After a commit: the clients just answered and those that queued meanwhile are how many are
        submitting now, as far as this process sees (the answered ones' next requests are on their
        way). The next batch waits for that many, up to `max_wait_s`: all of them in one transaction
        rather than half of them while the other half is written, which halves each batch and
        doubles the fixed work per job (its reads, the reservation, the commit). A lone client: 1,
        it never waits."""
        self._expected = min(self.max_batch, len(batch) + self.queue.qsize())

    def _admit(self, batch: list[_Item]) -> None:
        requests = [item.request for item in batch]
        for attempt in range(3):
            try:
                with self.db.write() as s:
                    outcomes = job_service.submit_jobs(
                        session=s, requests=requests, render=self.render, compiled=self.compiled
                    )
                break
            except job_service.IdempotencyRace:
                # Another process committed one of these keys first: the retry replays it.
                if attempt == 2:
                    raise
        self.batches += 1
        # Rendered after the commit, not while the transaction holds its tenants' rows (which the
        # other API processes' writers wait for); a keyed job's answer is the one stored with it.
        bodies = [
            None if isinstance(o, Exception) else (o.job.submit_response or self.render(o.job))
            for o in outcomes
        ]
        for item, outcome, body in zip(batch, outcomes, bodies, strict=True):
            if isinstance(outcome, Exception):
                item.future.set_exception(outcome)
            else:
                assert body is not None
                item.future.set_result((outcome, body))
        # After the answers: the wake-up is a hint (the scheduler also ticks), one per batch at most.
        if any(not isinstance(o, Exception) and not o.replayed for o in outcomes):
            self.waker.wake()


# Guards making a runtime's submitter; the submitter itself is the runtime's (`Runtime.extras`).
_lock = threading.Lock()


def start(runtime: Runtime, render: Callable[[Job], dict[str, Any]]) -> GroupSubmitter:
    """The runtime's submitter (one writer thread per API process), started if it is not yet.

    The API's lifespan starts it; an app served without its lifespan (a test's TestClient outside
    `with`) gets it on its first submission."""
    with _lock:
        s = runtime.extras.get(GroupSubmitter)
        if not isinstance(s, GroupSubmitter):
            s = runtime.extras[GroupSubmitter] = GroupSubmitter(runtime, render)
        return s


def stop(runtime: Runtime) -> None:
    """Drain and stop the runtime's submitter, if it has one (the API's shutdown)."""
    with _lock:
        s = runtime.extras.pop(GroupSubmitter, None)
    if isinstance(s, GroupSubmitter):
        s.close()
