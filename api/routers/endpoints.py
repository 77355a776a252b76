"""Inference endpoints, the control plane: create, list, read, change, delete, and their metrics
(scheduler/services/endpoints/). The v2 inference routes under `{url}/v2/...` are api/inference.py's."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from sqlalchemy.orm import Session

from api.deps import DbDep, Reader, RuntimeDep, SettingsDep, Submitter
from api.schemas import CursorParam, Page, decode_cursor, encode_cursor
from api.schemas.endpoints import EndpointMetricsOut, EndpointOut, EndpointStateName
from scheduler import bus
from scheduler.db import retry_conflicts
from scheduler.endpointspec import EndpointChange, EndpointSpec
from scheduler.errors import Forbidden
from scheduler.models import Endpoint
from scheduler.services import endpoints as service
from scheduler.services.clock import db_now
from scheduler.settings import Settings

router = APIRouter(prefix="/api/v1", tags=["endpoints"])

EndpointId = Annotated[str, Path(min_length=1, max_length=64)]


def _base(request: Request, settings: Settings) -> str:
    return settings.public_url or str(request.base_url)


def _outs(s: Session, rows: list[Endpoint], base: str) -> list[EndpointOut]:
    now = db_now(s)
    ids = [r.id for r in rows]
    replicas = service.replicas_of(session=s, endpoint_ids=ids, now=now)
    billed = service.billed_ipu_ms(session=s, endpoint_ids=ids)
    return [
        EndpointOut.model_validate(
            service.endpoint_json(
                ep=r, replicas=replicas[r.id], billed_ipu_ms=billed.get(r.id, 0), base_url=base
            )
        )
        for r in rows
    ]


@router.post(
    "/endpoints",
    status_code=202,
    response_model=EndpointOut,
    summary="Serve a model behind a URL",
    description="Validated against the emulator (the model must fit a replica: 422) and the plan's "
    "endpoint limits (409); the minimum replicas are queued at once, each reserving an hour of its cost "
    "from the grant (403 when none can be). Nothing is held when it is refused.",
)
def create_endpoint(
    spec: EndpointSpec,
    principal: Submitter,
    db: DbDep,
    settings: SettingsDep,
    request: Request,
    response: Response,
) -> EndpointOut:
    if principal.tenant_id is None:
        raise Forbidden("Admin keys have no tenant; create an endpoint with a tenant's key.")
    with db.write() as s:
        row = service.create_endpoint(session=s, tenant_id=principal.tenant_id, spec=spec)
        (out,) = _outs(s, [row], _base(request, settings))
    bus.wake_scheduler("endpoint")
    response.headers["Location"] = f"/api/v1/endpoints/{out.id}"
    return out


@router.get(
    "/endpoints", response_model=Page[EndpointOut], summary="List the caller's endpoints, newest first"
)
def list_endpoints(
    principal: Reader,
    db: DbDep,
    settings: SettingsDep,
    request: Request,
    cursor: CursorParam = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    state: EndpointStateName | None = None,
) -> Page[EndpointOut]:
    after = decode_cursor(cursor)
    with db.read() as s:
        rows = service.list_endpoints(
            session=s, scope=principal.scope, after=after, limit=limit + 1, state=state
        )
        items = _outs(s, rows[:limit], _base(request, settings))
    return Page[EndpointOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


@router.get("/endpoints/{endpoint_id}", response_model=EndpointOut, summary="An endpoint and its replicas")
def get_endpoint(
    endpoint_id: EndpointId, principal: Reader, db: DbDep, settings: SettingsDep, request: Request
) -> EndpointOut:
    with db.read() as s:
        row = service.get_endpoint(session=s, endpoint_id=endpoint_id, scope=principal.scope)
        return _outs(s, [row], _base(request, settings))[0]


@router.patch(
    "/endpoints/{endpoint_id}",
    response_model=EndpointOut,
    summary="Change an endpoint's replicas, autoscaling, batching or queue",
    description="Applied while it serves: replicas are added or drained by the scheduler; a new batch "
    "size is planned at once (422 when no replica of its size holds it) and served by new replicas, the "
    "old ones drained once the new ones are ready. A stopped endpoint is 409.",
)
def change_endpoint(
    endpoint_id: EndpointId,
    change: EndpointChange,
    principal: Submitter,
    db: DbDep,
    settings: SettingsDep,
    request: Request,
) -> EndpointOut:
    with db.write() as s:
        row = service.change_endpoint(
            session=s, endpoint_id=endpoint_id, scope=principal.scope, change=change
        )
        out = _outs(s, [row], _base(request, settings))[0]
    bus.wake_scheduler("endpoint")
    return out


@router.delete(
    "/endpoints/{endpoint_id}",
    response_model=EndpointOut,
    summary="Stop an endpoint",
    description="Its route is removed (new requests are refused), its replicas drained and billed up to now.",
)
@retry_conflicts
def delete_endpoint(
    endpoint_id: EndpointId, principal: Submitter, db: DbDep, settings: SettingsDep, request: Request
) -> EndpointOut:
    with db.write() as s:
        row = service.delete_endpoint(session=s, endpoint_id=endpoint_id, scope=principal.scope)
        out = _outs(s, [row], _base(request, settings))[0]
    bus.wake_scheduler("endpoint")
    return out


@router.get(
    "/endpoints/{endpoint_id}/metrics",
    response_model=EndpointMetricsOut,
    summary="An endpoint's last minute and its per-minute history",
)
def endpoint_metrics(
    endpoint_id: EndpointId,
    principal: Reader,
    db: DbDep,
    runtime: RuntimeDep,
    minutes: Annotated[int, Query(ge=1, le=1440, description="History to return, in minutes.")] = 60,
) -> EndpointMetricsOut:
    with db.read() as s:
        row = service.get_endpoint(session=s, endpoint_id=endpoint_id, scope=principal.scope)
        now = db_now(s)
        replicas = service.replicas_of(session=s, endpoint_ids=[row.id], now=now)[row.id]
        history = service.history(session=s, endpoint_id=row.id, since=now - timedelta(minutes=minutes))
        state, reps = (
            row.state,
            service.endpoint_json(ep=row, replicas=replicas, billed_ipu_ms=0, base_url=""),
        )
    window = service.read_windows(runtime.redis, [endpoint_id]).get(endpoint_id)
    return EndpointMetricsOut.model_validate(
        {
            "id": endpoint_id,
            "state": state,
            "replicas": reps["replicas"],
            "window": service.window_json(window),
            "history": history,
        }
    )
