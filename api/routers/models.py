"""The tenant's own models: ONNX graphs uploaded, described, listed and removed.

A model's ``id`` or name goes where a catalogue name does in a job or an estimate (``workload.model``).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

import orjson
from anyio import to_thread
from fastapi import APIRouter, Path, Query, Request, Response

from api.deps import DbDep, Reader, SettingsDep, Submitter
from api.schemas import CursorParam, ModelOut, Page, decode_cursor, encode_cursor
from api.uploads import receive_upload
from scheduler.errors import Forbidden, InvalidRequest
from scheduler.services import own_models
from scheduler.services.tenancy.keys import Principal

router = APIRouter(prefix="/api/v1", tags=["models"])

ModelRef = Annotated[str, Path(min_length=1, max_length=100, description="The model's id or name.")]
UPLOAD_FIELDS = frozenset({"file", "name", "dims", "elementwise"})


_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "The ONNX model. Weights may be absent (external data left out, "
                            "or stripped by the CLI/SDK); the server keeps only the graph.",
                        },
                        "name": {
                            "type": "string",
                            "maxLength": 64,
                            "pattern": own_models.NAME.pattern,
                            "description": "Default: the file's name without .onnx.",
                        },
                        "dims": {
                            "type": "string",
                            "maxLength": 4096,
                            "description": "JSON object: sizes of the dynamic dimensions besides the batch, "
                            'e.g. {"sequence": 128}. Required when the graph has any.',
                        },
                        "elementwise": {
                            "type": "string",
                            "maxLength": 4096,
                            "description": "Comma-separated operators the emulator does not know that act "
                            "element by element (Op or domain::Op).",
                        },
                    },
                }
            }
        },
    }
}


def _tenant(principal: Principal) -> str:
    if principal.tenant_id is None:
        raise Forbidden("Admin keys have no tenant; models belong to a tenant: use a tenant's key.")
    return principal.tenant_id


def _json(body: object, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status_code, media_type="application/json", headers=headers
    )


@router.post(
    "/models",
    status_code=201,
    response_model=ModelOut,
    summary="Upload an ONNX model (multipart field `file`); the answer describes the graph",
    openapi_extra=_UPLOAD_BODY,
)
async def upload_model(request: Request, principal: Submitter, db: DbDep, settings: SettingsDep) -> Response:
    tenant_id = _tenant(principal)
    await to_thread.run_sync(_may_upload, db, tenant_id)  # before the body is read
    upload = await receive_upload(
        request,
        fields=UPLOAD_FIELDS,
        max_bytes=settings.model_upload_max_bytes,
        spool_dir=settings.upload_dir,
    )
    try:
        name = upload.fields.get("name") or own_models.name_from_filename(upload.filename)
        if not name:
            raise InvalidRequest("name: the file's name does not make a model name; give one.", field="name")
        own_models.check_name(name)
        dims = own_models.parse_dims(upload.fields.get("dims"))
        elementwise = own_models.parse_elementwise(upload.fields.get("elementwise"))
        analysed = await to_thread.run_sync(
            partial(
                own_models.analyse,
                data=upload.path,
                dims=dims,
                elementwise=elementwise,
                max_graph_bytes=settings.model_graph_max_bytes,
            )
        )
    finally:
        upload.remove()
    out = await to_thread.run_sync(_store, db, tenant_id, name, analysed)
    return _json(out, 201, {"Location": f"/api/v1/models/{out['id']}"})


def _may_upload(db: DbDep, tenant_id: str) -> None:
    with db.read() as s:
        own_models.may_upload(session=s, tenant_id=tenant_id)


def _store(db: DbDep, tenant_id: str, name: str, analysed: own_models.Analysed) -> dict[str, Any]:
    with db.write() as s:
        model = own_models.create_model(session=s, tenant_id=tenant_id, name=name, analysed=analysed)
        return ModelOut.of(model).model_dump(mode="json")


@router.get("/models", response_model=Page[ModelOut], summary="Your models, newest first")
def list_models(
    principal: Reader,
    db: DbDep,
    cursor: CursorParam = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Page[ModelOut]:
    tenant_id = _tenant(principal)
    after = decode_cursor(cursor)
    with db.read() as s:
        rows = own_models.list_models(session=s, tenant_id=tenant_id, after=after, limit=limit + 1)
        items = [ModelOut.of(m) for m in rows[:limit]]
    return Page[ModelOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


@router.get("/models/{model}", response_model=ModelOut, summary="One of your models, by id or name")
def get_model(model: ModelRef, principal: Reader, db: DbDep) -> ModelOut:
    tenant_id = _tenant(principal)
    with db.read() as s:
        return ModelOut.of(own_models.get_model(session=s, tenant_id=tenant_id, ref=model))


@router.delete(
    "/models/{model}", response_model=ModelOut, summary="Remove a model that no queued or running job uses"
)
def delete_model(model: ModelRef, principal: Submitter, db: DbDep) -> ModelOut:
    tenant_id = _tenant(principal)
    with db.write() as s:
        return ModelOut.of(own_models.delete_model(session=s, tenant_id=tenant_id, ref=model))
