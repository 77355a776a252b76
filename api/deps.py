"""Typed dependencies: the runtime (and the settings and database it holds), the caller, and what
the caller may do."""

from __future__ import annotations

import logging
from typing import Annotated

from anyio import to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.ratelimit import RateLimits, check_not_exhausted, check_rate, check_rate_async, count_failure
from scheduler.clock import Clock
from scheduler.db import Database
from scheduler.errors import Unauthorized
from scheduler.runtime import Runtime
from scheduler.services.tenancy import keys
from scheduler.services.tenancy.keys import Principal
from scheduler.settings import Settings

log = logging.getLogger("ipucloud.api")


# Dependencies that do no I/O are `async`: FastAPI runs a plain `def` dependency in a worker
# thread, and a request would otherwise hop threads once per dependency.
async def get_runtime(request: Request) -> Runtime:
    """The app's runtime (api/app.py builds it at start-up): everything below derives from it."""
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def _settings(runtime: RuntimeDep) -> Settings:
    return runtime.settings


async def _db(runtime: RuntimeDep) -> Database:
    return runtime.db


async def _clock(runtime: RuntimeDep) -> Clock:
    return runtime.clock


SettingsDep = Annotated[Settings, Depends(_settings)]
DbDep = Annotated[Database, Depends(_db)]
# Cluster time against the wall clock: what every figure in cluster seconds is converted with.
ClockDep = Annotated[Clock, Depends(_clock)]


# Declares `Authorization: Bearer` in the OpenAPI spec; the header itself is read below, so that
# every way of getting it wrong gets its own 401 problem rather than FastAPI's generic 403.
_bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    bearerFormat="ipuc_...",
    description="An API key: `Authorization: Bearer ipuc_...`.",
)


def rate_limits(request: Request) -> RateLimits:
    """The app's rate limiters (`app.state.rate_limits`, made with the app: api/app.py,
    api/vipu_server.py)."""
    limits: RateLimits = request.app.state.rate_limits
    return limits


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def bearer_key(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized("Send `Authorization: Bearer <api key>`.")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("The Authorization header must be `Bearer <api key>`.")
    return value.strip()


async def current_principal(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer_scheme)] = None,
) -> Principal:
    """The caller's key, checked; rate-limited per key, and failed attempts per client address.

    A key verified moments ago is recognised on the event loop; anything else (a database read,
    the failure budget) runs in a worker thread."""
    failures = f"authfail:{client_address(request)}"
    limits = rate_limits(request)
    try:
        key = bearer_key(request)
        principal = keys.cached_principal(secret=settings.secret(), key=key)
    except Unauthorized:
        await to_thread.run_sync(_failed, limits, failures, settings)
        raise
    if principal is None:
        principal = await to_thread.run_sync(_authenticate, limits, db, settings, key, failures)
    await check_rate_async(limits, f"key:{principal.key_id}", settings.rate_limit)
    keys.check_standing(principal)
    if principal.key_id in keys.stale_last_use:
        await to_thread.run_sync(_touch, db, principal.key_id)
    request.state.principal = principal
    return principal


def _failed(limits: RateLimits, failures: str, settings: Settings) -> None:
    check_not_exhausted(limits, failures, settings.rate_limit)  # a guesser over budget gets 429
    count_failure(limits, failures, settings.rate_limit)


def _authenticate(limits: RateLimits, db: Database, settings: Settings, key: str, failures: str) -> Principal:
    # Only a key not verified moments ago can be a guess: check the address's failure budget
    # before it reaches the database.
    check_not_exhausted(limits, failures, settings.rate_limit)
    try:
        with db.read() as s:
            return keys.authenticate(session=s, secret=settings.secret(), key=key)
    except Unauthorized:
        count_failure(limits, failures, settings.rate_limit)
        raise


def _touch(db: Database, key_id: str) -> None:
    try:
        with db.write() as s:
            keys.touch_last_used(session=s, key_id=key_id)
    except Exception as exc:  # bookkeeping only: never the reason a request fails
        log.warning("could not record the use of key %s: %s", key_id, type(exc).__name__)


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def reader(principal: CurrentPrincipal) -> Principal:
    principal.require("read")
    return principal


async def submitter(principal: CurrentPrincipal) -> Principal:
    principal.require("submit")
    return principal


async def admin(principal: CurrentPrincipal) -> Principal:
    principal.require("admin")
    return principal


async def invoker(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer_scheme)] = None,
) -> Principal:
    """A key with the `invoke` scope, checked as `current_principal` checks any key but without the
    per-key request rate: an endpoint's own queue (`max_queue`, 429) is what bounds its callers, and a
    model server that refused its tenant's traffic at 600 requests a minute would serve no one."""
    failures = f"authfail:{client_address(request)}"
    limits = rate_limits(request)
    try:
        key = bearer_key(request)
        principal = keys.cached_principal(secret=settings.secret(), key=key)
    except Unauthorized:
        await to_thread.run_sync(_failed, limits, failures, settings)
        raise
    if principal is None:
        principal = await to_thread.run_sync(_authenticate, limits, db, settings, key, failures)
    keys.check_standing(principal)
    principal.require("invoke")
    request.state.principal = principal
    return principal


Reader = Annotated[Principal, Depends(reader)]
Submitter = Annotated[Principal, Depends(submitter)]
Admin = Annotated[Principal, Depends(admin)]
# Calls a tenant's inference endpoints (the v2 routes): a key with only `invoke` can do nothing else.
Invoker = Annotated[Principal, Depends(invoker)]


def trial_rate(request: Request, settings: SettingsDep) -> None:
    """Trial applications come from anyone: limit them per client address."""
    check_rate(rate_limits(request), f"trial:{client_address(request)}", settings.trial_rate_limit)
