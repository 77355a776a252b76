"""Group commit for job submissions: one writer thread per API process admits whatever arrived.

While the writer commits one batch, new submissions queue up; it then admits all of them in a
single transaction (`scheduler.services.jobs.submit_jobs`) and answers each request after that
commit. A lone request is admitted at once, so batching adds no waiting of its own: under load it
turns many fsyncs and tenant-row lock hand-offs into one. Every answer still follows a durable
commit, and every check is the same as for a single job.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from scheduler import bus
from scheduler.models import Job
from scheduler.runtime import Runtime
from scheduler.services import jobs as job_service

log = logging.getLogger("ipucloud.api")

MAX_BATCH = 256


@dataclass
class _Item:
    request: job_service.SubmitRequest
    future: Future[tuple[job_service.Submitted, dict[str, Any]]]


class SubmitBatcher:
    def __init__(self, runtime: Runtime, render: Callable[[Job], dict[str, Any]]) -> None:
        self.db = runtime.db
        self.render = render
        self.queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self.waker = bus.CoalescingWaker("submit", runtime.redis_client())
        self.thread = threading.Thread(target=self._run, name="submit-batcher", daemon=True)
        self.thread.start()

    def submit(
        self, request: job_service.SubmitRequest
    ) -> Future[tuple[job_service.Submitted, dict[str, Any]]]:
        """Queue one submission; the future holds (Submitted, response body) or the DomainError."""
        item = _Item(request, Future())
        self.queue.put(item)
        return item.future

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._admit(batch)
            except Exception as exc:  # the database failed: every request of the batch is told so
                log.warning("a batch of %d submissions failed: %s", len(batch), exc)
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)

    def _admit(self, batch: list[_Item]) -> None:
        requests = [item.request for item in batch]
        for attempt in range(3):
            try:
                with self.db.write() as s:
                    outcomes = job_service.submit_jobs(session=s, requests=requests, render=self.render)
                    bodies = [
                        None if isinstance(o, Exception) else (o.job.submit_response or self.render(o.job))
                        for o in outcomes
                    ]
                break
            except job_service.IdempotencyRace:
                # Another process committed one of these keys first: the retry replays it.
                if attempt == 2:
                    raise
        for item, outcome, body in zip(batch, outcomes, bodies, strict=True):
            if isinstance(outcome, Exception):
                item.future.set_exception(outcome)
            else:
                assert body is not None
                item.future.set_result((outcome, body))
        # After the answers: the wake-up is a hint (the scheduler also ticks), not part of them.
        if any(not isinstance(o, Exception) and not o.replayed for o in outcomes):
            self.waker.wake()


# Guards making a runtime's batcher; the batcher itself is the runtime's (`Runtime.extras`).
_lock = threading.Lock()


def batcher(runtime: Runtime, render: Callable[[Job], dict[str, Any]]) -> SubmitBatcher:
    """The runtime's batcher (one writer thread per API process), started on first use."""
    with _lock:
        b = runtime.extras.get(SubmitBatcher)
        if not isinstance(b, SubmitBatcher):
            b = runtime.extras[SubmitBatcher] = SubmitBatcher(runtime, render)
        return b
