"""Dashboard sessions: an HttpOnly cookie holding a random token, the session itself in Redis.

Redis is keyed by a hash of the token, and the API key the user signed in with is stored only
sealed under a key derived from the token and the deployment secret: neither a Redis dump nor the
cookie alone yields the key. Every request unseals it and authenticates it again (cached for a
couple of seconds by `keys.authenticate`), so revoking the key or suspending the tenant ends the
session at once. JavaScript never sees the token (HttpOnly) or the key.

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

from scheduler import bus
from scheduler.errors import Forbidden, Unavailable
from scheduler.services.keys import Principal

COOKIE = "ipucloud_session"
FORM_COOKIE = "ipucloud_form"
TTL_S = 8 * 3600
PREFIX = "ipucloud:dash:session:"
FLASH_PREFIX = "ipucloud:dash:flash:"
TOKEN_BYTES = 32
_TAG_LEN = 16


def _redis_key(token: str) -> str:
    return PREFIX + hashlib.sha256(token.encode()).hexdigest()


def _material(secret: bytes, token: str) -> bytes:
    return hmac.new(secret, b"ipucloud-dashboard-session|" + token.encode(), hashlib.sha256).digest()


def _keystream(material: bytes, length: int) -> bytes:
    out = b""
    counter = 0
    while len(out) < length:
        out += hmac.new(material, b"stream|" + counter.to_bytes(4, "big"), hashlib.sha256).digest()
        counter += 1
    return out[:length]


def seal(api_key: str, *, secret: bytes, token: str) -> str:
    """Encrypt-then-MAC with HMAC-SHA256 as the PRF; each token (so each key stream) is used once."""
    material = _material(secret, token)
    plain = api_key.encode()
    cipher = bytes(a ^ b for a, b in zip(plain, _keystream(material, len(plain)), strict=True))
    tag = hmac.new(material, b"tag|" + cipher, hashlib.sha256).digest()[:_TAG_LEN]
    return (tag + cipher).hex()


def unseal(sealed: str, *, secret: bytes, token: str) -> str | None:
    try:
        raw = bytes.fromhex(sealed)
    except ValueError:
        return None
    tag, cipher = raw[:_TAG_LEN], raw[_TAG_LEN:]
    material = _material(secret, token)
    expected = hmac.new(material, b"tag|" + cipher, hashlib.sha256).digest()[:_TAG_LEN]
    if not hmac.compare_digest(tag, expected):
        return None
    plain = bytes(a ^ b for a, b in zip(cipher, _keystream(material, len(cipher)), strict=True))
    try:
        return plain.decode()
    except UnicodeDecodeError:
        return None


@dataclass
class DashSession:
    """The signed-in user of one request."""

    token: str
    principal: Principal
    csrf: str
    flashes: list[str] = field(default_factory=list)

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin

    @property
    def tenant_id(self) -> str | None:
        return self.principal.tenant_id


def _redis() -> redis.Redis:
    return bus.get_redis()


def _unavailable(exc: Exception) -> Unavailable:
    return Unavailable(f"The session store (Redis) is unreachable: {type(exc).__name__}. Retry shortly.")


def create(api_key: str, principal: Principal, *, secret: bytes) -> tuple[str, str]:
    """Store a new session; return (token for the cookie, CSRF token)."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    csrf = secrets.token_urlsafe(TOKEN_BYTES)
    record = {
        "sealed": seal(api_key, secret=secret, token=token),
        "key_id": principal.key_id,
        "csrf": csrf,
        "created": time.time(),
    }
    try:
        _redis().set(_redis_key(token), orjson.dumps(record), ex=TTL_S)
    except redis.RedisError as exc:
        raise _unavailable(exc)
    return token, csrf


def read(token: str, *, secret: bytes) -> tuple[str, str, str] | None:
    """(api key, key id, CSRF token) of a live session, sliding its expiry; None if there is none."""
    if not token or len(token) > 100:
        return None
    name = _redis_key(token)
    try:
        pipe = _redis().pipeline()
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
    api_key = unseal(str(record.get("sealed", "")), secret=secret, token=token)
    if api_key is None:
        return None
    return api_key, str(record.get("key_id", "")), str(record.get("csrf", ""))


def destroy(token: str) -> None:
    try:
        _redis().delete(_redis_key(token), FLASH_PREFIX + _redis_key(token))
    except redis.RedisError:
        pass  # the cookie is cleared anyway; the record expires by its TTL


def flash(session: DashSession, message: str) -> None:
    """A one-line notice shown on the next page this session renders (after a redirect)."""
    name = FLASH_PREFIX + _redis_key(session.token)
    try:
        pipe = _redis().pipeline()
        pipe.rpush(name, message[:500])
        pipe.expire(name, 300)
        pipe.execute()
    except redis.RedisError:
        pass  # a lost notice is cosmetic


def take_flashes(session: DashSession) -> list[str]:
    name = FLASH_PREFIX + _redis_key(session.token)
    try:
        pipe = _redis().pipeline()
        pipe.lrange(name, 0, -1)
        pipe.delete(name)
        raw, _ = pipe.execute()
    except redis.RedisError:
        return []
    return [m.decode() if isinstance(m, bytes) else str(m) for m in raw]


# Cookies ------------------------------------------------------------------------------------------------


def _secure(request: Request) -> bool:
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return proto == "https"


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
