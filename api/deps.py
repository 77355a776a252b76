"""Typed dependencies: the database, the caller, and what the caller may do."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.ratelimit import check_not_exhausted, check_rate, count_failure
from scheduler.db import Database, get_database
from scheduler.errors import Unauthorized
from scheduler.services import keys
from scheduler.services.keys import Principal
from scheduler.settings import Settings, get_settings

log = logging.getLogger("ipucloud.api")


def _settings() -> Settings:
    return get_settings()


def _db() -> Database:
    return get_database()


SettingsDep = Annotated[Settings, Depends(_settings)]
DbDep = Annotated[Database, Depends(_db)]


# Declares `Authorization: Bearer` in the OpenAPI spec; the header itself is read below, so that
# every way of getting it wrong gets its own 401 problem rather than FastAPI's generic 403.
_bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    bearerFormat="ipuc_...",
    description="An API key: `Authorization: Bearer ipuc_...`.",
)


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


def current_principal(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer_scheme)] = None,
) -> Principal:
    """The caller's key, checked; rate-limited per key, and failed attempts per client address."""
    failures = f"authfail:{client_address(request)}"
    try:
        key = bearer_key(request)
        principal = keys.cached_principal(secret=settings.secret(), key=key)
        if principal is None:
            # Only a key not verified moments ago can be a guess: check the address's failure
            # budget before it reaches the database.
            check_not_exhausted(failures, settings.rate_limit)
            with db.read() as s:
                principal = keys.authenticate(session=s, secret=settings.secret(), key=key)
    except Unauthorized:
        check_not_exhausted(failures, settings.rate_limit)  # a guesser over budget gets 429
        count_failure(failures, settings.rate_limit)
        raise
    check_rate(f"key:{principal.key_id}", settings.rate_limit)
    if principal.key_id in keys.stale_last_use:
        try:
            with db.write() as s:
                keys.touch_last_used(session=s, key_id=principal.key_id)
        except Exception as exc:  # bookkeeping only: never the reason a request fails
            log.warning("could not record the use of key %s: %s", principal.key_id, type(exc).__name__)
    request.state.principal = principal
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


def reader(principal: CurrentPrincipal) -> Principal:
    principal.require("read")
    return principal


def submitter(principal: CurrentPrincipal) -> Principal:
    principal.require("submit")
    return principal


def admin(principal: CurrentPrincipal) -> Principal:
    principal.require("admin")
    return principal


Reader = Annotated[Principal, Depends(reader)]
Submitter = Annotated[Principal, Depends(submitter)]
Admin = Annotated[Principal, Depends(admin)]


def trial_rate(request: Request, settings: SettingsDep) -> None:
    """Trial applications come from anyone: limit them per client address."""
    check_rate(f"trial:{client_address(request)}", settings.trial_rate_limit)
