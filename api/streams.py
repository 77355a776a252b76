"""What a job's live event stream needs, shared by the JSON API (`GET /api/v1/jobs/{id}/logs` with
`Accept: text/event-stream`) and the dashboard's job page: the stream itself, the `Last-Event-ID` it
resumes from, and whether its reader may still read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import orjson
from anyio import to_thread
from fastapi import Header

from api.deps import DbDep
from api.schemas import LogEntry
from scheduler import bus
from scheduler.errors import DomainError
from scheduler.models import FINAL_JOB_STATES, Job, utcnow
from scheduler.runtime import Runtime
from scheduler.services.batch import attempts
from scheduler.services.batch import jobs as job_service
from scheduler.services.tenancy import keys
from scheduler.services.tenancy.scope import Scope

# An event id this API sent (ASCII digits: `str.isdigit` would also take `²`, which `int` refuses).
LastEventId = Annotated[
    str | None, Header(alias="Last-Event-ID", min_length=1, max_length=18, pattern=r"^[0-9]{1,18}$")
]


def _sse(event: str, data: object, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return (head + f"event: {event}\ndata: ").encode() + orjson.dumps(data, default=str) + b"\n\n"


# Reads what a page shows of a job beside its log (partition, attempts, IPU-hours so far).
JobFacts = Callable[[Any, Job, Any], dict[str, Any]]  # (a read session, the job, its current attempt)
# Whether whoever opened a stream may still read it: None if so, else the problem that ends it.
Standing = Callable[[], Awaitable[dict[str, Any] | None]]
# How often an open stream asks: a revoked key, a signed-out session or a suspended tenant stops
# receiving within this plus the key cache's 2 s (in the process that revoked, at once).
STANDING_EVERY_S = 1.0


def _denial(exc: DomainError) -> dict[str, Any]:
    return {"type": exc.type_uri, "title": exc.title, "status": exc.status, "detail": exc.detail}


def key_denial(db: DbDep, key_id: str) -> dict[str, Any] | None:
    """Whether a key still grants anything now (as authentication would judge it), read by its id."""
    try:
        principal = keys.cached_principal_by_id(key_id)
        if principal is None:
            with db.read() as s:
                principal = keys.principal_by_id(session=s, key_id=key_id)
        keys.check_standing(principal)
    except DomainError as exc:
        return _denial(exc)
    return None


def key_standing(db: DbDep, key_id: str) -> Standing:
    async def check() -> dict[str, Any] | None:
        return await to_thread.run_sync(key_denial, db, key_id)

    return check


async def job_event_stream(
    runtime: Runtime,
    job_id: str,
    after: int,
    *,
    scope: Scope,
    standing: Standing,
    facts: JobFacts | None = None,
) -> AsyncIterator[bytes]:
    """Send new events as they are written; wake on the job's bus channel, poll as a fallback.

    Every `STANDING_EVERY_S` the stream asks `standing` whether its reader may still read; when
    not (key revoked or expired, signed out, tenant suspended) it sends a `denied` event with the
    problem and ends. With `facts`, a `job` event carries what it reads whenever that changes (the
    dashboard's job page); the API's own stream sends only the events its clients know.
    """
    pubsub = None
    checked = time.monotonic()
    try:
        try:
            pubsub = runtime.async_redis.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(bus.scoped(bus.job_channel(job_id), runtime.async_redis))
        except Exception:
            pubsub = None
        last_progress: object = None
        last_facts: object = None
        idle = 0
        while True:
            if time.monotonic() - checked >= STANDING_EVERY_S:
                checked = time.monotonic()
                denied = await standing()
                if denied is not None:
                    yield _sse("denied", denied)
                    return
            snapshot = await to_thread.run_sync(_read_since, runtime.db, job_id, after, scope, facts)
            events, state, progress, job_facts = snapshot
            for e in events:
                after = e.id
                yield _sse(
                    e.kind,
                    LogEntry(
                        id=e.id, at=e.at, kind=e.kind, message=e.message, attempt=e.attempt, data=e.data
                    ).model_dump(mode="json"),
                    e.id,
                )
            if progress is not None and progress != last_progress:
                last_progress = progress
                yield _sse("progress", progress)
            if job_facts is not None and job_facts != last_facts:
                last_facts = job_facts
                yield _sse("job", job_facts)
            if state in FINAL_JOB_STATES:
                yield _sse("end", {"state": state})
                return
            idle = 0 if events else idle + 1
            if idle and idle % 30 == 0:
                yield b": keep-alive\n\n"
            if pubsub is not None:
                try:
                    await pubsub.get_message(timeout=1.0)
                except Exception:
                    pubsub = None
            else:
                await asyncio.sleep(0.5)
    finally:
        if pubsub is not None:
            try:
                await pubsub.aclose()
            except Exception:
                pass


def _read_since(
    db: DbDep, job_id: str, after: int, scope: Scope, facts: JobFacts | None
) -> tuple[list, str, attempts.ProgressView | None, dict[str, Any] | None]:
    with db.read() as s:
        job = job_service.get_job(session=s, job_id=job_id, scope=scope)
        events = job_service.job_events(session=s, job_id=job_id, after=after, limit=500)
        attempt = job_service.current_attempt(session=s, job=job)
        progress = attempts.progress_of(attempt, utcnow()) if attempt is not None else None
        return events, job.state, progress, None if facts is None else facts(s, job, attempt)
