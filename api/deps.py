"""Typed dependencies: the database, the caller, and what the caller may do."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.ratelimit import check_rate
from scheduler.db import Database, get_database
from scheduler.errors import Unauthorized
from scheduler.services import keys
from scheduler.services.keys import Principal
from scheduler.settings import Settings, get_settings


def _settings() -> Settings:
    return get_settings()


def _db() -> Database:
    return get_database()


SettingsDep = Annotated[Settings, Depends(_settings)]
DbDep = Annotated[Database, Depends(_db)]


def bearer_key(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized("Send `Authorization: Bearer <api key>`.")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("The Authorization header must be `Bearer <api key>`.")
    return value.strip()


def current_principal(request: Request, db: DbDep, settings: SettingsDep) -> Principal:
    key = bearer_key(request)
    lookup = keys.parse_key(key)
    check_rate(f"key:{lookup}", settings.rate_limit)
    with db.read() as s:
        principal = keys.authenticate(session=s, secret=settings.secret(), key=key)
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
