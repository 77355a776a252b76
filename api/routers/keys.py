"""The caller's API keys: list, create (shown once), revoke.

Owners see and manage every key of their tenant; members see only their own keys and may revoke
them but not create keys; an admin key manages the global (admin) keys here. A key never creates a
key with more scopes or a later expiry than its own.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import DbDep, Reader, SettingsDep, Submitter
from api.schemas import ApiKeyCreated, ApiKeyOut, CursorParam, KeyCreate, Page, decode_cursor, encode_cursor
from scheduler.services.tenancy import keys as key_service

router = APIRouter(prefix="/api/v1", tags=["keys"])

KeyId = Annotated[str, Path(min_length=1, max_length=40)]


@router.get("/keys", response_model=Page[ApiKeyOut], summary="The API keys this key may see, oldest first")
def list_keys(
    principal: Reader,
    db: DbDep,
    cursor: CursorParam = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    include_revoked: bool = True,
) -> Page[ApiKeyOut]:
    with db.read() as s:
        rows = key_service.list_visible_keys(
            session=s,
            principal=principal,
            after=decode_cursor(cursor),
            limit=limit + 1,
            include_revoked=include_revoked,
        )
        items = [ApiKeyOut.of(k) for k in rows[:limit]]
    return Page[ApiKeyOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


@router.post(
    "/keys",
    status_code=201,
    response_model=ApiKeyCreated,
    summary="Create an API key (owners; shown once)",
)
def create_key(body: KeyCreate, principal: Submitter, db: DbDep, settings: SettingsDep) -> ApiKeyCreated:
    with db.write() as s:
        row, key = key_service.issue_key(
            session=s,
            secret=settings.secret(),
            principal=principal,
            name=body.name,
            scopes=list(body.scopes) if body.scopes is not None else None,
            expires_at=body.expires_at,
            member_id=body.member_id,
        )
        return ApiKeyCreated.created(row, key)


@router.delete(
    "/keys/{key_id}",
    response_model=ApiKeyOut,
    summary="Revoke a key (at once here, within 2 s in every API process)",
)
def revoke_key(key_id: KeyId, principal: Submitter, db: DbDep) -> ApiKeyOut:
    with db.write() as s:
        return ApiKeyOut.of(key_service.revoke_visible_key(session=s, principal=principal, key_id=key_id))
