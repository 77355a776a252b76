"""The V-IPU user endpoint (`ipucloud vipu-server`, port 8090): what a program on a partition talks to.

Every attempt is given `IPUOF_VIPU_API_HOST` and `IPUOF_VIPU_API_PORT`; this is what listens there.
It answers the V-IPU user API's operations over HTTP and JSON, one `POST /v1/<Operation>` each,
with the request and reply messages of V-IPU 1.18's `vipuuser.proto` (`GetPartitionStatusRequest`
in, `GetPartitionStatusReply` out, field names as the protos have them). docs/vipu.md lists every
operation, message and field, and says which fields are the cloud's own additions.

Keys are the cloud's: an API key (`read` to look, `submit` to create, remove and reset; an admin
key sees every partition) or an attempt's short-lived key (scheduler/services/capacity/attempt_keys.py),
sent as `Authorization: Bearer <key>` (the V-IPU CLI's `--api-access-key`). Errors are RFC 9457
problems whose `code` is the gRPC status the V-IPU CLI would report and whose `reason` names the
cause in the words of a job's `wait.reason`.

A separate app on its own port, beside the API, so that a site can expose it only to its IPU host
network as V-IPU's controller is; it shares the API's runtime, key checks and problem handling.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

import orjson
from anyio import to_thread
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api import problems
from api.deps import ClockDep, DbDep, RuntimeDep, SettingsDep, bearer_key, current_principal, rate_limits
from api.middleware import BodyLimit, RefuseControlCharacters
from api.ratelimit import RateLimits, check_rate_async
from api.routers import health
from scheduler import bus
from scheduler import runtime as runtime_module
from scheduler.db import Database
from scheduler.errors import DomainError, Forbidden, InvalidRequest
from scheduler.runtime import Runtime
from scheduler.services.capacity import attempt_keys, vipu_user
from scheduler.services.capacity.vipu_user import VipuCaller
from scheduler.services.clock import db_now
from scheduler.services.tenancy import keys
from scheduler.settings import Settings, get_settings
from vipu.ipuof import VIPU_API_VERSION
from vipu.machine_types import MACHINE_TYPE_NAMES

SERVER_VERSION = "0.1.0"

# The gRPC status a V-IPU client reports for each HTTP status the endpoint answers with.
GRPC_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "FAILED_PRECONDITION",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}

PartitionId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Requests ----------------------------------------------------------------------------------------------


class Empty(_Message):
    """A request with no fields (`ListPartitionsRequest`, `ListAllocationsRequest`, `GetVersionRequest`)."""


class GetPartitionStatusRequest(_Message):
    partition_id: PartitionId = Field(description="Unique identifier for the partition.")


class GcdID(_Message):
    id: int = Field(0, ge=0, le=65535)


class GetPartitionIpuofConfigRequest(_Message):
    partition_id: PartitionId = Field(description="Unique id of the Partition.")
    gcd_id: GcdID = Field(default_factory=GcdID, description="Gcd id (default 0).")


class PartitionRequirements(_Message):
    id: PartitionId = Field(description="The partition's id (`vipu create partition <id>`).")
    size: int = Field(ge=1, le=65536, description="IPUs: a power of two.")
    num_gcds: int = Field(1, ge=1, le=65536, description="Graph compile domains.")
    reconfigurable: bool = False
    machine_type: str | None = Field(
        None, description=f"ipucloud: one of {', '.join(MACHINE_TYPE_NAMES)} (default: any)."
    )


class CreatePartitionRequest(_Message):
    requirements: PartitionRequirements
    disable_auto_reset: bool = Field(False, description="Accepted; an emulated partition never errors.")
    relocatable: bool = Field(False, description="Accepted; partitions here are never moved.")


class RemovePartitionRequest(_Message):
    partition_id: PartitionId


class ResetPartitionRequest(_Message):
    partition_id: PartitionId
    num_gcds: int | None = Field(
        None, ge=1, le=65536, description="Split a reconfigurable partition anew (once nothing runs on it)."
    )


class ListIpuAttributesRequest(_Message):
    partition_id: PartitionId | None = Field(None, description="Only this partition's IPUs.")


# Replies -----------------------------------------------------------------------------------------------


class Progress(BaseModel):
    phase: str
    step: int
    steps: int
    samples: int
    percent: float
    eta_s: float
    throughput: float
    memory_per_ipu_bytes: int
    cluster_s: float


class Process(BaseModel):
    pid: int = Field(description="ipucloud: the attempt's id (an emulated attempt has no OS process).")
    job_id: str | None
    job_name: str | None
    user: str | None
    gcd: int
    state: str
    started_at: datetime | None
    elapsed_s: float
    progress: Progress | None


class Gcd(BaseModel):
    gcd_id: int
    ipus: list[str]
    processes: list[Process]


class PartitionStatus(BaseModel):
    id: str
    state: str = Field(description="PS_ACTIVE, PS_PENDING (a session waiting for IPUs) or PS_ERROR.")
    reason: str | None
    size: int
    num_gcds: int
    reconfigurable: bool
    machine_type: str | None
    target: str | None
    cluster_id: str | None
    units: list[str]
    ipus: list[str]
    kind: str
    tenant_id: str | None
    session_id: str | None
    job_id: str | None
    created_at: datetime | None
    gcds: list[Gcd]


class ListPartitionsReply(BaseModel):
    partitions: list[PartitionStatus]


class GetPartitionStatusReply(BaseModel):
    status: PartitionStatus


class GetPartitionIpuofConfigReply(BaseModel):
    ipuof_config: dict[str, Any]


class CreatePartitionReply(BaseModel):
    partition_id: str
    state: str
    session_id: str | None


class RemovePartitionReply(BaseModel):
    partition_id: str


class ResetPartitionReply(BaseModel):
    partition_id: str
    num_gcds: int
    interrupted_jobs: list[str]


class Allocation(BaseModel):
    id: str
    spec: dict[str, Any]


class ListAllocationsReply(BaseModel):
    allocations: list[Allocation]


class IpuAttributes(BaseModel):
    agent_id: str
    ipu: int
    partition_id: str
    device_id: int
    attributes: dict[str, str]


class ListIpuAttributesReply(BaseModel):
    ipu_attributes: list[IpuAttributes]


class VersionReply(BaseModel):
    version: str = Field(description="The V-IPU API version the messages follow.")
    server: str = Field(description="ipucloud's version.")
    host: str
    port: int


class IndexReply(BaseModel):
    service: str
    version: str
    operations: list[str]


# The caller --------------------------------------------------------------------------------------------


def _attempt_caller(db: Database, secret: bytes, key: str) -> VipuCaller:
    with db.read() as s:
        who = attempt_keys.authenticate(session=s, secret=secret, key=key)
    return VipuCaller(tenant_id=who.tenant_id, admin=False, may_change=False, attempt=who)


async def vipu_caller(request: Request, db: DbDep, settings: SettingsDep) -> VipuCaller:
    """The caller's API key (as the API checks it) or its attempt key (checked on every use, so it
    stops working the moment its attempt ends)."""
    key = bearer_key(request)
    if attempt_keys.is_attempt_key(key):
        caller = await to_thread.run_sync(_attempt_caller, db, settings.secret(), key)
        assert caller.attempt is not None
        await check_rate_async(
            rate_limits(request), f"attempt:{caller.attempt.attempt_id}", settings.rate_limit
        )
        return caller
    principal = await current_principal(request, db, settings)
    if principal.is_admin:
        return VipuCaller(tenant_id=None, admin=True, may_change=True)
    principal.require("read")
    keys.check_standing(principal)
    if principal.tenant_id is None:
        raise Forbidden("This key belongs to no tenant and is not an admin key.")
    return VipuCaller(tenant_id=principal.tenant_id, admin=False, may_change="submit" in principal.scopes)


Caller = Annotated[VipuCaller, Depends(vipu_caller)]

router = APIRouter()

OPERATIONS = (
    "GetVersion",
    "ListPartitions",
    "GetPartitionStatus",
    "GetPartitionIpuofConfig",
    "CreatePartition",
    "RemovePartition",
    "ResetPartition",
    "ListAllocations",
    "ListIpuAttributes",
)


@router.get("/", response_model=IndexReply, summary="What this endpoint is and the operations it answers")
def index() -> IndexReply:
    return IndexReply(
        service="ipucloud V-IPU endpoint",
        version=VIPU_API_VERSION,
        operations=[f"POST /v1/{op}" for op in OPERATIONS],
    )


@router.post("/v1/GetVersion", response_model=VersionReply, summary="The V-IPU API version (no key needed)")
def get_version(settings: SettingsDep, body: Empty | None = None) -> VersionReply:
    return VersionReply(
        version=VIPU_API_VERSION,
        server=SERVER_VERSION,
        host=settings.vipu_api_host,
        port=settings.vipu_api_port,
    )


@router.post("/v1/ListPartitions", response_model=ListPartitionsReply, summary="The caller's partitions")
def list_partitions(caller: Caller, db: DbDep, body: Empty | None = None) -> dict[str, Any]:
    with db.read() as s:
        return {"partitions": vipu_user.list_partitions(session=s, caller=caller, now=db_now(s))}


@router.post("/v1/GetPartitionStatus", response_model=GetPartitionStatusReply, summary="One partition")
def get_partition_status(body: GetPartitionStatusRequest, caller: Caller, db: DbDep) -> dict[str, Any]:
    with db.read() as s:
        status = vipu_user.partition_status(
            session=s, caller=caller, partition_id=body.partition_id, now=db_now(s)
        )
    return {"status": status}


@router.post(
    "/v1/GetPartitionIpuofConfig",
    response_model=GetPartitionIpuofConfigReply,
    summary="The IPUoF configuration of a partition's GCD (refused, with the cause, when it cannot "
    "be attached)",
)
def get_ipuof_config(body: GetPartitionIpuofConfigRequest, caller: Caller, db: DbDep) -> dict[str, Any]:
    with db.read() as s:
        return dict(
            vipu_user.ipuof_config(
                session=s,
                caller=caller,
                partition_id=body.partition_id,
                gcd=body.gcd_id.id,
                now=db_now(s),
            )
        )


@router.post(
    "/v1/CreatePartition",
    response_model=CreatePartitionReply,
    summary="Admin: carve a reserved partition; tenant: start a session (it queues for IPUs)",
)
def create_partition(
    body: CreatePartitionRequest, caller: Caller, db: DbDep, settings: SettingsDep, runtime: RuntimeDep
) -> dict[str, Any]:
    r = body.requirements
    if r.machine_type is not None and r.machine_type not in MACHINE_TYPE_NAMES:
        raise InvalidRequest(
            f"requirements.machine_type must be one of {', '.join(MACHINE_TYPE_NAMES)}, "
            f"not {r.machine_type!r}",
            field="requirements.machine_type",
            code="INVALID_ARGUMENT",
        )
    with db.write() as s:
        created = vipu_user.create_partition(
            session=s,
            caller=caller,
            partition_id=r.id,
            size=r.size,
            num_gcds=r.num_gcds,
            reconfigurable=r.reconfigurable,
            machine_type=r.machine_type,
            policy=settings.placement_policy,
            allocators=runtime.allocators,
            created_by=None,
        )
    bus.wake_scheduler("session" if created["session_id"] else "partition")
    return dict(created)


@router.post("/v1/RemovePartition", response_model=RemovePartitionReply, summary="Remove a partition")
def remove_partition(
    body: RemovePartitionRequest, caller: Caller, db: DbDep, clock: ClockDep
) -> dict[str, Any]:
    with db.write() as s:
        name = vipu_user.remove_partition(
            session=s, caller=caller, partition_id=body.partition_id, clock=clock
        )
    bus.wake_scheduler("partition")
    return {"partition_id": name}


@router.post("/v1/ResetPartition", response_model=ResetPartitionReply, summary="Reset a partition's IPUs")
def reset_partition(
    body: ResetPartitionRequest, caller: Caller, db: DbDep, settings: SettingsDep
) -> dict[str, Any]:
    with db.write() as s:
        out = vipu_user.reset_partition(
            session=s,
            caller=caller,
            partition_id=body.partition_id,
            num_gcds=body.num_gcds,
            max_attempts=settings.max_attempts,
        )
    bus.wake_scheduler("partition")
    return dict(out)


@router.post("/v1/ListAllocations", response_model=ListAllocationsReply, summary="The caller's allocations")
def list_allocations(caller: Caller, db: DbDep, body: Empty | None = None) -> dict[str, Any]:
    with db.read() as s:
        return {"allocations": vipu_user.list_allocations(session=s, caller=caller, now=db_now(s))}


@router.post(
    "/v1/ListIpuAttributes",
    response_model=ListIpuAttributesReply,
    summary="Attributes of the caller's IPUs",
)
def list_ipu_attributes(
    caller: Caller, db: DbDep, body: ListIpuAttributesRequest | None = None
) -> dict[str, Any]:
    with db.read() as s:
        attrs = vipu_user.ipu_attributes(
            session=s, caller=caller, partition_id=body.partition_id if body else None, now=db_now(s)
        )
    return {"ipu_attributes": attrs}


async def _domain_problem(request: Request, exc: Exception) -> Response:
    """A domain error as an RFC 9457 problem carrying the gRPC status a V-IPU client reports."""
    assert isinstance(exc, DomainError)
    extra = {k: v for k, v in exc.extra.items() if k not in {"type", "title", "status", "detail"}}
    extra.setdefault("code", GRPC_CODES.get(exc.status, "UNKNOWN"))
    headers = {"WWW-Authenticate": 'Bearer realm="ipucloud-vipu"'} if exc.status == 401 else None
    if exc.status == 429 and "retry_after" in exc.extra:
        headers = {"Retry-After": str(exc.extra["retry_after"])}
    return problems.problem(
        exc.status, exc.detail, slug=exc.slug, instance=request.url.path, headers=headers, **extra
    )


def _with_grpc_code(validation: Callable[..., Any]) -> Callable[..., Awaitable[Response]]:
    """The API's validation problem, with the gRPC status (`INVALID_ARGUMENT`) a V-IPU client reports."""

    async def invalid(request: Request, exc: Exception) -> Response:
        # FastAPI's own handler for validation errors is a coroutine.
        answer: Response = await validation(request, exc)
        data = orjson.loads(answer.body)
        data.setdefault("code", "INVALID_ARGUMENT")
        return problems.problem(
            data.pop("status"),
            data.pop("detail"),
            slug=str(data.pop("type")).rsplit("/", 1)[-1],
            **{k: v for k, v in data.items() if k != "title"},
        )

    return invalid


def create_vipu_app(settings: Settings | None = None, *, runtime: Runtime | None = None) -> FastAPI:
    """The V-IPU endpoint on `settings` (by default the environment's), or on a runtime handed in."""
    if runtime is not None:
        settings = runtime.settings
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is not None:
            yield
            return
        built = Runtime.from_settings(settings)
        app.state.runtime = built
        runtime_module.install(built)
        try:
            yield
        finally:
            runtime_module.install(None)
            built.close()

    app = FastAPI(
        lifespan=lifespan,
        title="ipucloud V-IPU endpoint",
        version=SERVER_VERSION,
        summary=f"The V-IPU {VIPU_API_VERSION} user API over HTTP and JSON: partitions, IPUoF configuration, "
        "allocations, IPU attributes.",
        docs_url=None,
        redoc_url=None,
    )
    if runtime is not None:
        app.state.runtime = runtime
    # Its own limiters, on its runtime's broker; API processes share their counts through Redis.
    app.state.rate_limits = RateLimits(settings)
    problems.install(app)
    app.add_exception_handler(DomainError, _domain_problem)
    validation = app.exception_handlers[RequestValidationError]
    app.add_exception_handler(RequestValidationError, _with_grpc_code(validation))

    app.add_middleware(RefuseControlCharacters)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.include_router(health.router)
    app.include_router(router)
    return app
