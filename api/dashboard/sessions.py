"""Dashboard sessions: an HttpOnly cookie holding a random token, the session itself in Redis.

Redis is keyed by a hash of the token and holds the id of the API key the user signed in with (and
its tenant and member), never the key or anything that yields it. Every request checks by that id
that the key is still active, unexpired and its tenant not suspended (`keys.principal_by_id`, cached
for a couple of seconds as authentication is), so revoking the key, suspending the tenant or signing
out ends the session at once. JavaScript never sees the token (HttpOnly).

Every form carries a per-session CSRF token; forms shown before sign-in (sign in, apply for a
trial) use a double-submit cookie instead.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field

import orjson
import redis
from fastapi import Request, Response

from scheduler.errors import Forbidden, Unavailable
from scheduler.runtime import Runtime
from scheduler.services.tenancy.keys import Principal

COOKIE = "ipucloud_session"
FORM_COOKIE = "ipucloud_form"
TTL_S = 8 * 3600
PREFIX = "ipucloud:dash:session:"
FLASH_PREFIX = "ipucloud:dash:flash:"
TOKEN_BYTES = 32
# The shape of a session record; a record of another version (one made before sessions stopped
# holding the key) is not read, so its user is simply signed out.
VERSION = 2


def _redis_key(token: str) -> str:
    return PREFIX + hashlib.sha256(token.encode()).hexdigest()


@dataclass
class DashSession:
    """The signed-in user of one request."""

    token: str
    principal: Principal
    csrf: str
    # Where the session lives (`store_of`): its notices (`flash`) go there too.
    store: redis.Redis = field(repr=False)
    flashes: list[str] = field(default_factory=list)

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin

    @property
    def tenant_id(self) -> str | None:
        return self.principal.tenant_id


@dataclass(frozen=True)
class Record:
    """What Redis keeps of a session: who signed in (by key id), never with what."""

    key_id: str
    tenant_id: str | None
    member_id: str | None
    csrf: str


def store_of(request: Request) -> redis.Redis:
    """The session store: the Redis of the app's runtime (`app.state.runtime`, api/app.py)."""
    rt: Runtime = request.app.state.runtime
    return rt.redis


def _unavailable(exc: Exception) -> Unavailable:
    return Unavailable(f"The session store (Redis) is unreachable: {type(exc).__name__}. Retry shortly.")


def create(store: redis.Redis, principal: Principal) -> tuple[str, str]:
    """Store a new session for a verified principal; return (token for the cookie, CSRF token)."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    csrf = secrets.token_urlsafe(TOKEN_BYTES)
    record = {
        "v": VERSION,
        "key_id": principal.key_id,
        "tenant_id": principal.tenant_id,
        "member_id": principal.member_id,
        "csrf": csrf,
        "created": time.time(),
    }
    try:
        store.set(_redis_key(token), orjson.dumps(record), ex=TTL_S)
    except redis.RedisError as exc:
        raise _unavailable(exc)
    return token, csrf


def read(store: redis.Redis, token: str) -> Record | None:
    """The record of a live session, sliding its expiry; None if there is none."""
    if not token or len(token) > 100:
        return None
    name = _redis_key(token)
    try:
        pipe = store.pipeline()
        pipe.get(name)
        pipe.expire(name, TTL_S)
        raw, _ = pipe.execute()
    except redis.RedisError as exc:
        raise _unavailable(exc)
    if raw is None:
        return None
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("v") != VERSION or not record.get("key_id"):
        destroy(store, token)
        return None
    return Record(
        key_id=str(record["key_id"]),
        tenant_id=record.get("tenant_id"),
        member_id=record.get("member_id"),
        csrf=str(record.get("csrf", "")),
    )


def exists(store: redis.Redis, token: str) -> bool:
    """Whether the session is still there (not signed out), without sliding its expiry."""
    try:
        return bool(store.exists(_redis_key(token)))
    except redis.RedisError as exc:
        raise _unavailable(exc)


def destroy(store: redis.Redis, token: str) -> None:
    try:
        store.delete(_redis_key(token), FLASH_PREFIX + _redis_key(token))
    except redis.RedisError:
        pass  # the cookie is cleared anyway; the record expires by its TTL


def flash(session: DashSession, message: str) -> None:
    """A one-line notice shown on the next page this session renders (after a redirect)."""
    name = FLASH_PREFIX + _redis_key(session.token)
    try:
        pipe = session.store.pipeline()
        pipe.rpush(name, message[:500])
        pipe.expire(name, 300)
        pipe.execute()
    except redis.RedisError:
        pass  # a lost notice is cosmetic


def take_flashes(session: DashSession) -> list[str]:
    name = FLASH_PREFIX + _redis_key(session.token)
    try:
        pipe = session.store.pipeline()
        pipe.lrange(name, 0, -1)
        pipe.delete(name)
        raw, _ = pipe.execute()
    except redis.RedisError:
        return []
    return [m.decode() if isinstance(m, bytes) else str(m) for m in raw]


# Cookies ------------------------------------------------------------------------------------------------


def _secure(request: Request) -> bool:
    # The scheme the client used: uvicorn sets it from X-Forwarded-Proto only when the request came
    # through a proxy the operator trusts (IPUCLOUD_TRUSTED_PROXIES); the header itself may be forged.
    return request.url.scheme == "https"


def set_session_cookie(response: Response, request: Request, token: str) -> None:
    response.set_cookie(
        COOKIE,
        token,
        max_age=TTL_S,
        httponly=True,
        samesite="lax",
        secure=_secure(request),
        path="/",
    )


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="lax", secure=_secure(request))


def form_token(request: Request) -> tuple[str, bool]:
    """The double-submit token for forms shown before sign-in: (token, whether to set the cookie)."""
    existing = request.cookies.get(FORM_COOKIE, "")
    if 20 <= len(existing) <= 100:
        return existing, False
    return secrets.token_urlsafe(TOKEN_BYTES), True


def set_form_cookie(response: Response, request: Request, token: str) -> None:
    response.set_cookie(
        FORM_COOKIE, token, max_age=TTL_S, httponly=True, samesite="strict", secure=_secure(request), path="/"
    )


# CSRF -------------------------------------------------------------------------------------------------


def check_origin(request: Request) -> None:
    """Refuse a cross-site POST outright when the browser says where it comes from."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return
    host = request.headers.get("host", "")
    if origin.split("://", 1)[-1] != host:
        raise Forbidden("This form was sent from another site.")


def check_csrf(request: Request, sent: str | None, expected: str) -> None:
    check_origin(request)
    if not sent or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Forbidden("The form expired or did not come from this site; reload the page and try again.")
