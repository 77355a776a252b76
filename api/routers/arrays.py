"""Job arrays and sweeps: one handle for many jobs (docs/sweeps.md). Submitted by `POST /api/v1/jobs`
with `array` or `sweep`; read, throttled, cancelled and retried here."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query

from api.deps import DbDep, Reader, Submitter
from api.schemas import (
    ArrayActionOut,
    ArrayIndices,
    ArrayOut,
    ArrayPatch,
    CursorParam,
    IntCursorParam,
    JobOut,
    Page,
    decode_cursor,
    decode_int_cursor,
    encode_cursor,
)
from api.views import array_out, job_view
from scheduler import bus
from scheduler.db import retry_conflicts
from scheduler.errors import InvalidRequest
from scheduler.services.batch import arrays as array_service
from scheduler.services.batch import job_views as job_view_service

router = APIRouter(prefix="/api/v1", tags=["arrays"])

ArrayId = Annotated[str, Path(min_length=1, max_length=64)]


def _view(s: object, array: object) -> ArrayOut:
    (summary,) = array_service.summaries(session=s, arrays=[array])  # type: ignore[arg-type, list-item]
    return array_out(summary)


@router.get("/arrays", response_model=Page[ArrayOut], summary="List the caller's job arrays and sweeps")
def list_arrays(
    principal: Reader, db: DbDep, cursor: CursorParam = None, limit: Annotated[int, Query(ge=1, le=200)] = 50
) -> Page[ArrayOut]:
    after = decode_cursor(cursor)
    with db.read() as s:
        rows = array_service.list_arrays(session=s, scope=principal.scope, after=after, limit=limit + 1)
        items = [array_out(x) for x in array_service.summaries(session=s, arrays=rows[:limit])]
    return Page[ArrayOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


@router.get(
    "/arrays/{array_id}", response_model=ArrayOut, summary="An array: its elements by state, progress"
)
def get_array(array_id: ArrayId, principal: Reader, db: DbDep) -> ArrayOut:
    with db.read() as s:
        array = array_service.get_array(session=s, array_id=array_id, scope=principal.scope)
        return _view(s, array)


@router.get("/arrays/{array_id}/jobs", response_model=Page[JobOut], summary="An array's elements, by index")
def array_jobs(
    array_id: ArrayId,
    principal: Reader,
    db: DbDep,
    cursor: IntCursorParam = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"] | None = None,
) -> Page[JobOut]:
    after = decode_int_cursor(cursor)
    scope = principal.scope
    with db.read() as s:
        array_service.get_array(session=s, array_id=array_id, scope=scope)
        rows = array_service.elements(session=s, array_id=array_id, after=after, limit=limit + 1, state=state)
        items = [job_view(r) for r in job_view_service.job_reads(session=s, jobs=rows[:limit], scope=scope)]
    last = rows[limit - 1].array_index if len(rows) > limit else None
    return Page[JobOut](items=items, next_cursor=encode_cursor(last))


@router.patch("/arrays/{array_id}", response_model=ArrayOut, summary="Change an array's max_running")
def patch_array(array_id: ArrayId, body: ArrayPatch, principal: Submitter, db: DbDep) -> ArrayOut:
    with db.write() as s:
        array = array_service.update_array(
            session=s,
            array_id=array_id,
            scope=principal.scope,
            max_running=body.max_running,
            change="max_running" in body.model_fields_set,
        )
        out = _view(s, array)
    bus.wake_scheduler("array")
    return out


@router.post(
    "/arrays/{array_id}/cancel",
    status_code=202,
    response_model=ArrayActionOut,
    summary="Cancel an array's queued and running elements (all, or those of `indices`)",
)
@retry_conflicts
def cancel_array(
    array_id: ArrayId, principal: Submitter, db: DbDep, body: ArrayIndices | None = None
) -> ArrayActionOut:
    indices = body.indices if body is not None else None
    if indices == "failed":
        raise InvalidRequest(
            "indices: `failed` is for retry; give indices (`1,5-9`) or none.", field="indices"
        )
    with db.write() as s:
        ids = array_service.cancel_elements(
            session=s, array_id=array_id, scope=principal.scope, indices=indices
        )
        out = _view(s, array_service.get_array(session=s, array_id=array_id, scope=principal.scope))
    for job_id in ids:
        bus.publish(bus.job_channel(job_id), "cancel")
    bus.wake_scheduler("cancel")
    return ArrayActionOut(array=out, job_ids=ids)


@router.post(
    "/arrays/{array_id}/retry",
    status_code=202,
    response_model=ArrayActionOut,
    summary="Queue an array's failed or cancelled elements again (`failed`: all of them)",
)
def retry_array(array_id: ArrayId, body: ArrayIndices, principal: Submitter, db: DbDep) -> ArrayActionOut:
    with db.write() as s:
        array_service.get_array(session=s, array_id=array_id, scope=principal.scope)  # 404 first
        if body.indices is None:
            raise InvalidRequest("indices: give `failed` or the indices to retry (`1,5-9`).", field="indices")
        ids = array_service.retry_elements(
            session=s, array_id=array_id, scope=principal.scope, indices=body.indices
        )
        out = _view(s, array_service.get_array(session=s, array_id=array_id, scope=principal.scope))
    bus.wake_scheduler("retry")
    return ArrayActionOut(array=out, job_ids=ids)
