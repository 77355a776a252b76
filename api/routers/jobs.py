"""Jobs: submit, list, show, cancel, logs (JSON or server-sent events)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

import orjson
from anyio import to_thread
from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from api.deps import DbDep, Reader, RuntimeDep, Submitter
from api.schemas import (
    ArrayOut,
    CheckpointOut,
    CursorParam,
    FoldedOut,
    IntCursorParam,
    JobOut,
    LogEntry,
    LogsOut,
    Page,
    SubmitOut,
    WaitReason,
    decode_cursor,
    decode_int_cursor,
    encode_cursor,
)
from api.views import array_out, job_out, render_submitted
from scheduler import bus
from scheduler.errors import DomainError, Forbidden
from scheduler.jobspec import JobSpec
from scheduler.models import FINAL_JOB_STATES, Job, utcnow
from scheduler.runtime import Runtime
from scheduler.services import arrays as array_service
from scheduler.services import attempts, keys, submitter
from scheduler.services import checkpoints as checkpoint_service
from scheduler.services import jobs as job_service
from scheduler.services import usage as usage_service
from scheduler.services.scope import Scope

router = APIRouter(prefix="/api/v1", tags=["jobs"])

JobId = Annotated[str, Path(min_length=1, max_length=64)]
# An event id this API sent (ASCII digits: `str.isdigit` would also take `²`, which `int` refuses).
LastEventId = Annotated[
    str | None, Header(alias="Last-Event-ID", min_length=1, max_length=18, pattern=r"^[0-9]{1,18}$")
]
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$"),
]


def _json(body: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


@router.post(
    "/jobs",
    status_code=202,
    response_model=SubmitOut,
    summary="Submit a job, or a job array or sweep (`array`, `sweep`: answered with the array)",
)
async def submit_job(
    spec: JobSpec, principal: Submitter, runtime: RuntimeDep, idempotency_key: IdempotencyKey = None
) -> Response:
    if principal.tenant_id is None:
        raise Forbidden("Admin keys have no tenant; submit with a tenant's key.")
    if spec.array is not None or spec.sweep is not None:
        tenant_id = principal.tenant_id
        out, replayed = await to_thread.run_sync(
            lambda: submit_array(
                runtime, tenant_id, spec, idempotency_key, principal.scope, principal.member_id
            )
        )
        headers = {"Location": f"/api/v1/arrays/{out.id}"}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        else:
            bus.wake_scheduler("submit")
        return Response(
            out.model_dump_json().encode(), status_code=202, headers=headers, media_type="application/json"
        )
    request = job_service.SubmitRequest(principal.tenant_id, spec, idempotency_key, principal.member_id)
    result, body = await asyncio.wrap_future(submitter.start(runtime, render_submitted).submit(request))
    headers = {"Location": f"/api/v1/jobs/{result.job.id}"}
    if result.replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(orjson.dumps(body), status_code=202, headers=headers, media_type="application/json")


@router.get("/jobs", response_model=Page[JobOut], summary="List the caller's jobs, newest first")
def list_jobs(
    principal: Reader,
    db: DbDep,
    cursor: CursorParam = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"] | None = None,
    expand: Annotated[
        bool,
        Query(description="List every queued element of an array; by default they are one row each array."),
    ] = False,
) -> Page[JobOut]:
    after = decode_cursor(cursor)
    scope = principal.scope
    fold = not expand and state in (None, "queued")
    with db.read() as s:
        rows = job_service.list_jobs(
            session=s, scope=scope, after=after, limit=limit + 1, state=state, fold=fold
        )
        folded = job_service.folded_elements(session=s, scope=scope) if fold and after is None else []
        items = job_views(s, [f.first for f in folded] + rows[:limit], scope)
    for f, item in zip(folded, items, strict=False):
        item.folded = FoldedOut(label=f"{f.first.array_id}_[{f.indices}]", count=f.count, indices=f.indices)
    return Page[JobOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


def submit_array(
    runtime: Runtime,
    tenant_id: str,
    spec: JobSpec,
    idempotency_key: str | None,
    scope: Scope,
    member_id: str | None = None,
) -> tuple[ArrayOut, bool]:
    for attempt in range(3):
        try:
            with runtime.db.write() as s:
                result = array_service.submit_array(
                    session=s,
                    tenant_id=tenant_id,
                    spec=spec,
                    idempotency_key=idempotency_key,
                    member_id=member_id,
                )
                s.flush()
                (summary,) = array_service.summaries(session=s, arrays=[result.array])
                return array_out(summary), result.replayed
        except job_service.IdempotencyRace:
            # Another request with this key was admitted first: the retry replays its array.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def job_views(s: Any, jobs: list[Job], scope: Scope) -> list[JobOut]:
    """A page of jobs as `GET /jobs/{id}` shows each (history, IPU-hours, why it waits), in a few
    queries for the whole page."""
    current = job_service.current_attempts(session=s, jobs=jobs)
    ids = [j.id for j in jobs]
    histories = job_service.state_histories(session=s, job_ids=ids)
    used = usage_service.jobs_used_ipu_ms(session=s, job_ids=ids)
    items = []
    for j in jobs:
        attempt, partition = current.get(j.id, (None, None))
        out = job_out(
            j, attempt=attempt, partition=partition, history=histories[j.id], used_ipu_ms=used[j.id]
        )
        wait = job_service.wait_given(session=s, job=j, attempt=attempt, scope=scope)
        if wait is not None:
            out.wait = WaitReason(**wait)
        items.append(out)
    return items


def job_view(s: Any, job: Job, scope: Scope) -> JobOut:
    """One job with its history, its partition, the IPU-hours billed so far and why it waits."""
    return job_views(s, [job], scope)[0]


@router.get("/jobs/{job_id}", response_model=JobOut, summary="A job, its history, progress and why it waits")
def get_job(job_id: JobId, principal: Reader, db: DbDep) -> JobOut:
    scope = principal.scope
    with db.read() as s:
        job = job_service.get_job(session=s, job_id=job_id, scope=scope)
        out = job_view(s, job, scope)
        with_checkpoints(s, job, out)
        return out


def with_checkpoints(s: Any, job: Job, out: JobOut) -> None:
    """Add the job's newest checkpoints, and until when it may be resumed, to its view."""
    rows, total = checkpoint_service.list_for_job(session=s, job_id=job.id)
    out.checkpoints = [CheckpointOut(**checkpoint_service.checkpoint_json(c)) for c in rows]
    out.checkpoint_count = total
    if rows:
        out.resumable_until = checkpoint_service.resumable_until_of(session=s, job=job)


@router.post(
    "/jobs/{job_id}/resume",
    status_code=202,
    response_model=JobOut,
    summary="Resume a job stopped by its time limit from its last checkpoint",
)
def resume_job(job_id: JobId, principal: Submitter, db: DbDep) -> JobOut:
    scope = principal.scope
    with db.write() as s:
        job = job_service.resume_job(session=s, job_id=job_id, scope=scope)
        out = job_view(s, job, scope)
        with_checkpoints(s, job, out)
    bus.wake_scheduler("resume")
    return out


@router.post("/jobs/{job_id}/cancel", status_code=202, response_model=JobOut, summary="Cancel a job")
def cancel_job(job_id: JobId, principal: Submitter, db: DbDep) -> JobOut:
    scope = principal.scope
    with db.write() as s:
        job = job_service.request_cancel(session=s, job_id=job_id, scope=scope)
        out = job_view(s, job, scope)
    bus.publish(bus.job_channel(job_id), "cancel")
    bus.wake_scheduler("cancel")
    return out


@router.get(
    "/jobs/{job_id}/logs",
    response_model=LogsOut,
    summary="Job events and log lines; server-sent events with `Accept: text/event-stream`",
    responses={
        200: {
            "description": "JSON, or with `Accept: text/event-stream` a stream of server-sent events.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    },
)
def job_logs(
    job_id: JobId,
    request: Request,
    principal: Reader,
    runtime: RuntimeDep,
    cursor: IntCursorParam = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    last_event_id: LastEventId = None,
) -> Response:
    after = decode_int_cursor(cursor) or 0
    db = runtime.db
    with db.read() as s:
        job = job_service.get_job(session=s, job_id=job_id, scope=principal.scope)
        state = job.state
    if "text/event-stream" in request.headers.get("accept", ""):
        if last_event_id is not None:
            after = int(last_event_id)
        return StreamingResponse(
            _stream(
                runtime, job_id, after, scope=principal.scope, standing=key_standing(db, principal.key_id)
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    with db.read() as s:
        events = job_service.job_events(session=s, job_id=job_id, after=after, limit=limit + 1)
        items = [
            LogEntry(id=e.id, at=e.at, kind=e.kind, message=e.message, attempt=e.attempt, data=e.data)
            for e in events[:limit]
        ]
    nxt = encode_cursor(items[-1].id) if len(events) > limit else None
    return _json(LogsOut(job_id=job_id, state=state, items=items, next_cursor=nxt).model_dump(mode="json"))


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


async def _stream(
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
            await pubsub.subscribe(bus.job_channel(job_id))
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
