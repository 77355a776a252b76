"""The Open Inference Protocol (KServe v2) under each endpoint's URL: `{url}/v2/...`.

Stock clients (tritonclient's HTTP client, KServe's, MLServer's) take the endpoint's `url` as their
server address. Keys need the `invoke` scope; an endpoint of another tenant is a 404, as one that
does not exist. Errors are problems (RFC 9457) that also carry the protocol's `error` member, which
is what v2 clients read.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect

from api import inference
from api.deps import Invoker, RuntimeDep
from scheduler.inference import Route
from scheduler.services.tenancy.keys import Principal

router = APIRouter(prefix="/api/v1/endpoints/{endpoint_id}/v2", tags=["inference"])


# The protocol's answers, declared for the OpenAPI document; the routes write them with orjson.
class V2ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class V2Live(BaseModel):
    live: bool


class V2Ready(BaseModel):
    ready: bool


class V2Tensor(BaseModel):
    name: str
    datatype: str = Field(description="A v2 datatype: BOOL, UINT8 ... INT64, FP16, BF16, FP32, FP64.")
    shape: list[int] = Field(description="-1 marks the batch axis.")


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[V2Tensor]
    outputs: list[V2Tensor]


class V2Output(V2Tensor):
    data: list[Any] | None = Field(None, description="Row-major elements, unless sent as binary data.")
    parameters: dict[str, Any] | None = Field(None, description="`binary_data_size` for a binary output.")


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    parameters: dict[str, Any] = Field(description="`replica` and `batch_size` the request ran in.")
    outputs: list[V2Output]


EndpointId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^ep_[A-Za-z0-9]+$")]
ModelName = Annotated[str, Path(min_length=1, max_length=63)]
Version = Annotated[str, Path(min_length=1, max_length=16)]


def _error(exc: inference.InferError) -> Response:
    return inference.error_response(exc)


async def _route(runtime: Any, principal: Principal, endpoint_id: str) -> Route:
    g = inference.gateway(runtime)
    route = await g.route(endpoint_id)
    if route is None or (principal.tenant_id is not None and route.tenant_id != principal.tenant_id):
        raise inference.InferError(404, f"No endpoint {endpoint_id}.")
    return route


@router.get("", response_model=V2ServerMetadata, summary="Server metadata (v2)")
async def server_metadata(endpoint_id: EndpointId, runtime: RuntimeDep, principal: Invoker) -> Response:
    try:
        route = await _route(runtime, principal, endpoint_id)
    except inference.InferError as exc:
        return _error(exc)
    return Response(
        inference.orjson.dumps(
            {"name": f"ipucloud endpoint {route.name}", "version": "2", "extensions": ["binary_tensor_data"]}
        ),
        media_type="application/json",
    )


@router.get("/health/live", response_model=V2Live, summary="Liveness (v2)")
async def live(endpoint_id: EndpointId, runtime: RuntimeDep, principal: Invoker) -> Response:
    try:
        await _route(runtime, principal, endpoint_id)
    except inference.InferError as exc:
        return _error(exc)
    return Response(b'{"live":true}', media_type="application/json")


async def _ready(runtime: Any, principal: Principal, endpoint_id: str, model: str | None) -> Response:
    try:
        route = await _route(runtime, principal, endpoint_id)
        if model is not None and model != route.name:
            raise inference.InferError(404, f"no model {model!r} here; this endpoint serves {route.name!r}")
    except inference.InferError as exc:
        return _error(exc)
    ready = route.accepting and await inference.gateway(runtime).ready_replicas(endpoint_id) > 0
    # v2: 200 when ready, and a status that is not 200 otherwise (clients read the status alone).
    return Response(
        b'{"ready":true}' if ready else b'{"ready":false}', status_code=200 if ready else 503,
        media_type="application/json",
    )  # fmt: skip


@router.get("/health/ready", response_model=V2Ready, summary="Readiness (v2): a replica is serving")
async def ready(endpoint_id: EndpointId, runtime: RuntimeDep, principal: Invoker) -> Response:
    return await _ready(runtime, principal, endpoint_id, None)


@router.get("/models/{model}/ready", response_model=V2Ready, summary="Model readiness (v2)")
async def model_ready(
    endpoint_id: EndpointId, model: ModelName, runtime: RuntimeDep, principal: Invoker
) -> Response:
    return await _ready(runtime, principal, endpoint_id, model)


@router.get(
    "/models/{model}/versions/{version}/ready", response_model=V2Ready, summary="Model version readiness (v2)"
)
async def version_ready(
    endpoint_id: EndpointId, model: ModelName, version: Version, runtime: RuntimeDep, principal: Invoker
) -> Response:
    if version != "1":
        return _error(inference.InferError(404, f"model {model} has version 1 only"))
    return await _ready(runtime, principal, endpoint_id, model)


async def _metadata(runtime: Any, principal: Principal, endpoint_id: str, model: str) -> Response:
    try:
        route = await _route(runtime, principal, endpoint_id)
        if model != route.name:
            raise inference.InferError(404, f"no model {model!r} here; this endpoint serves {route.name!r}")
    except inference.InferError as exc:
        return _error(exc)
    return Response(inference.orjson.dumps(inference.model_metadata(route)), media_type="application/json")


@router.get(
    "/models/{model}", response_model=V2ModelMetadata, summary="Model metadata (v2): inputs and outputs"
)
async def metadata(
    endpoint_id: EndpointId, model: ModelName, runtime: RuntimeDep, principal: Invoker
) -> Response:
    return await _metadata(runtime, principal, endpoint_id, model)


@router.get(
    "/models/{model}/versions/{version}",
    response_model=V2ModelMetadata,
    summary="Model version metadata (v2)",
)
async def version_metadata(
    endpoint_id: EndpointId, model: ModelName, version: Version, runtime: RuntimeDep, principal: Invoker
) -> Response:
    if version != "1":
        return _error(inference.InferError(404, f"model {model} has version 1 only"))
    return await _metadata(runtime, principal, endpoint_id, model)


async def _infer(
    request: Request,
    runtime: Any,
    principal: Principal,
    endpoint_id: str,
    model: str,
    header_length: str | None,
) -> Response:
    try:
        route = await _route(runtime, principal, endpoint_id)
        body = await request.body()
        reply = await inference.infer(runtime, route, model, body, header_length)
    except inference.InferError as exc:
        return _error(exc)
    except ClientDisconnect:
        return Response(status_code=499)  # nobody reads it: the client went away
    media = reply.headers.pop("content-type", "application/json")
    return Response(reply.body, status_code=reply.status, headers=reply.headers, media_type=media)


_INFER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object", "description": "A v2 inference request."}},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
                "description": "The binary tensor extension: the JSON request, then the tensors' bytes "
                "(Inference-Header-Content-Length says where the JSON ends).",
            },
        },
    }
}


@router.post(
    "/models/{model}/infer",
    response_model=V2InferResponse,
    summary="Inference (v2)",
    openapi_extra=_INFER_BODY,
)
async def infer(
    request: Request,
    endpoint_id: EndpointId,
    model: ModelName,
    runtime: RuntimeDep,
    principal: Invoker,
    inference_header_content_length: Annotated[str | None, Header(max_length=12)] = None,
) -> Response:
    return await _infer(request, runtime, principal, endpoint_id, model, inference_header_content_length)


@router.post(
    "/models/{model}/versions/{version}/infer",
    response_model=V2InferResponse,
    summary="Inference of a version (v2)",
    openapi_extra=_INFER_BODY,
)
async def infer_version(
    request: Request,
    endpoint_id: EndpointId,
    model: ModelName,
    version: Version,
    runtime: RuntimeDep,
    principal: Invoker,
    inference_header_content_length: Annotated[str | None, Header(max_length=12)] = None,
) -> Response:
    if version != "1":
        return _error(inference.InferError(404, f"model {model} has version 1 only"))
    return await _infer(request, runtime, principal, endpoint_id, model, inference_header_content_length)
