"""Jobs: submit, list, show, cancel, logs (JSON or server-sent events)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import orjson
from anyio import to_thread
from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from api.deps import DbDep, Reader, RuntimeDep, Submitter
from api.schemas import (
    ArrayOut,
    CursorParam,
    IntCursorParam,
    JobOut,
    LogEntry,
    LogsOut,
    Page,
    SubmitOut,
    decode_cursor,
    decode_int_cursor,
    encode_cursor,
)
from api.streams import LastEventId, job_event_stream, key_standing
from api.views import array_out, job_view, render_submitted
from scheduler import bus
from scheduler.db import retry_conflicts
from scheduler.errors import Forbidden
from scheduler.jobspec import JobSpec
from scheduler.runtime import Runtime
from scheduler.services.batch import arrays as array_service
from scheduler.services.batch import job_views as job_view_service
from scheduler.services.batch import jobs as job_service
from scheduler.services.batch import submitter
from scheduler.services.tenancy.scope import Scope

router = APIRouter(prefix="/api/v1", tags=["jobs"])

JobId = Annotated[str, Path(min_length=1, max_length=64)]
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
    fold = not expand and state in (None, "queued")
    with db.read() as s:
        reads, last = job_view_service.list_job_reads(
            session=s, scope=principal.scope, after=decode_cursor(cursor), limit=limit, state=state, fold=fold
        )
        items = [job_view(r) for r in reads]
    return Page[JobOut](items=items, next_cursor=None if last is None else encode_cursor(last))


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


@router.get("/jobs/{job_id}", response_model=JobOut, summary="A job, its history, progress and why it waits")
def get_job(job_id: JobId, principal: Reader, db: DbDep) -> JobOut:
    with db.read() as s:
        return job_view(job_view_service.get_job_read(session=s, job_id=job_id, scope=principal.scope))


@router.post(
    "/jobs/{job_id}/resume",
    status_code=202,
    response_model=JobOut,
    summary="Resume a job stopped by its time limit from its last checkpoint",
)
@retry_conflicts
def resume_job(job_id: JobId, principal: Submitter, db: DbDep) -> JobOut:
    scope = principal.scope
    with db.write() as s:
        job = job_service.resume_job(session=s, job_id=job_id, scope=scope)
        out = job_view(job_view_service.job_read(session=s, job=job, scope=scope))
    bus.wake_scheduler("resume")
    return out


@router.post("/jobs/{job_id}/cancel", status_code=202, response_model=JobOut, summary="Cancel a job")
@retry_conflicts
def cancel_job(job_id: JobId, principal: Submitter, db: DbDep) -> JobOut:
    scope = principal.scope
    with db.write() as s:
        job = job_service.request_cancel(session=s, job_id=job_id, scope=scope)
        out = job_view(job_view_service.job_read(session=s, job=job, scope=scope, checkpoints=False))
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
            job_event_stream(
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
