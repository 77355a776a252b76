"""API keys: `ipuc_` + 12-character public lookup + 43-character secret + 6-character checksum.

The secret is 256 random bits. The CRC32 checksum catches a mistyped key before any lookup, the
lookup part finds the row without scanning, and the database keeps only an HMAC of the whole key
(keyed by the deployment secret), compared in constant time. A key is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler.errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from scheduler.ids import new_id
from scheduler.models import ApiKey, Tenant, utcnow

PREFIX = "ipuc_"
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
LOOKUP_LEN = 12
SECRET_LEN = 43  # 62**43 > 2**256
CHECK_LEN = 6
KEY_LEN = len(PREFIX) + LOOKUP_LEN + SECRET_LEN + CHECK_LEN
SCOPES = ("read", "submit", "admin")
TENANT_SCOPES = ("read", "submit")


def _b62(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return "".join(reversed(out))


def _checksum(body: str) -> str:
    return _b62(zlib.crc32(body.encode()), CHECK_LEN)


def generate_key() -> tuple[str, str]:
    """Return (key, lookup)."""
    lookup = "".join(secrets.choice(_B62) for _ in range(LOOKUP_LEN))
    secret = _b62(secrets.randbits(256), SECRET_LEN)
    body = PREFIX + lookup + secret
    return body + _checksum(body), lookup


def parse_key(key: str) -> str:
    """Return the lookup part, or raise Unauthorized for anything that is not a well-formed key."""
    if len(key) != KEY_LEN or not key.startswith(PREFIX):
        raise Unauthorized("That is not an ipucloud API key (they start with `ipuc_`).")
    body, check = key[:-CHECK_LEN], key[-CHECK_LEN:]
    if any(c not in _B62 for c in key[len(PREFIX) :]):
        raise Unauthorized("The API key contains characters a key never has.")
    if not hmac.compare_digest(_checksum(body), check):
        raise Unauthorized("The API key's checksum does not match: it was mistyped or truncated.")
    return body[len(PREFIX) : len(PREFIX) + LOOKUP_LEN]


def hash_key(key: str, secret: bytes) -> str:
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key, its tenant (None for a global admin) and what it may do."""

    key_id: str
    tenant_id: str | None
    member_id: str | None
    scopes: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes and self.tenant_id is None

    def require(self, scope: str) -> None:
        if scope == "admin":
            if not self.is_admin:
                raise Forbidden("This route is for cloud administrators only.")
        elif scope not in self.scopes and not self.is_admin:
            raise Forbidden(f"This key lacks the `{scope}` scope.")


def normalise_scopes(scopes: list[str] | None, *, tenant_key: bool) -> str:
    allowed = TENANT_SCOPES if tenant_key else SCOPES
    chosen = list(dict.fromkeys(scopes or list(allowed)))
    bad = [s for s in chosen if s not in allowed]
    if bad or not chosen:
        raise InvalidRequest(f"Scopes must be a non-empty subset of {list(allowed)}; got {chosen}.")
    return " ".join(sorted(chosen))


def create_key(
    *,
    session: Session,
    secret: bytes,
    tenant_id: str | None,
    name: str,
    scopes: list[str] | None = None,
    expires_at: datetime | None = None,
    member_id: str | None = None,
) -> tuple[ApiKey, str]:
    """Create a key; the plain key is returned once and never stored."""
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidRequest("expires_at must be in the future.")
    key, lookup = generate_key()
    row = ApiKey(
        id=new_id("key"),
        lookup=lookup,
        key_hash=hash_key(key, secret),
        name=name,
        scopes=normalise_scopes(scopes, tenant_key=tenant_id is not None),
        tenant_id=tenant_id,
        member_id=member_id,
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return row, key


class _KeyCache:
    """A short-lived cache of verified keys: most requests then need no database round trip.

    Revocation in this process clears the entry at once; other processes see it within `ttl`.
    """

    def __init__(self, ttl: float = 2.0, size: int = 10_000) -> None:
        self.ttl = ttl
        self.size = size
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, str, Principal, datetime | None]] = {}

    def get(self, lookup: str) -> tuple[str, Principal, datetime | None] | None:
        with self._lock:
            entry = self._entries.get(lookup)
            if entry is None or entry[0] < time.monotonic():
                return None
            return entry[1], entry[2], entry[3]

    def put(self, lookup: str, key_hash: str, principal: Principal, expires_at: datetime | None) -> None:
        with self._lock:
            if len(self._entries) >= self.size:
                self._entries.clear()
            self._entries[lookup] = (time.monotonic() + self.ttl, key_hash, principal, expires_at)

    def forget(self, lookup: str | None = None) -> None:
        with self._lock:
            if lookup is None:
                self._entries.clear()
            else:
                self._entries.pop(lookup, None)


key_cache = _KeyCache()


def authenticate(*, session: Session, secret: bytes, key: str) -> Principal:
    lookup = parse_key(key)
    presented = hash_key(key, secret)
    cached = key_cache.get(lookup)
    if cached is not None:
        key_hash, principal, expires_at = cached
        if hmac.compare_digest(key_hash, presented) and (expires_at is None or expires_at > utcnow()):
            return principal
    row = session.execute(select(ApiKey).where(ApiKey.lookup == lookup)).scalar_one_or_none()
    if row is None or not hmac.compare_digest(row.key_hash, presented):
        raise Unauthorized("Unknown API key.")
    if row.revoked_at is not None:
        raise Unauthorized("This API key was revoked.")
    if row.expires_at is not None and row.expires_at <= utcnow():
        raise Unauthorized("This API key has expired.")
    if row.tenant_id is not None:
        status = session.execute(select(Tenant.status).where(Tenant.id == row.tenant_id)).scalar_one()
        if status == "deleted":
            raise Unauthorized("This API key's tenant no longer exists.")
    principal = Principal(row.id, row.tenant_id, row.member_id, frozenset(row.scopes.split()))
    key_cache.put(lookup, row.key_hash, principal, row.expires_at)
    return principal


def list_keys(*, session: Session, tenant_id: str | None) -> list[ApiKey]:
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id)
    return list(session.execute(stmt).scalars())


def revoke_key(*, session: Session, key_id: str, tenant_id: str | None, any_tenant: bool = False) -> ApiKey:
    row = session.get(ApiKey, key_id)
    if row is None or (not any_tenant and row.tenant_id != tenant_id):
        raise NotFound(f"No API key {key_id}.")
    if row.revoked_at is None:
        session.execute(update(ApiKey).where(ApiKey.id == key_id).values(revoked_at=utcnow()))
        row.revoked_at = utcnow()
    key_cache.forget(row.lookup)
    return row
