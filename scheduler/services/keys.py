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
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from scheduler.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from scheduler.ids import new_id
from scheduler.models import ApiKey, Member, Tenant, utcnow
from scheduler.services.scope import Scope, scope_of

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
    """Who is calling: a key, its tenant (None for a global admin) and what it may do.

    `role` is the role of the member the key belongs to (`admin`, `owner`, `member`, or None for a
    key whose member was removed); `expires_at` is the key's own expiry, which bounds the keys it
    may create.
    """

    key_id: str
    tenant_id: str | None
    member_id: str | None
    scopes: frozenset[str]
    role: str | None = None
    expires_at: datetime | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes and self.tenant_id is None

    @property
    def manages_keys(self) -> bool:
        """Owners manage their tenant's keys, admins the global ones; members only their own."""
        return self.is_admin or (self.tenant_id is not None and self.role == "owner")

    @property
    def scope(self) -> Scope:
        """The tenants whose objects this key may see (Forbidden for a global key without `admin`)."""
        return scope_of(self)

    def require(self, scope: str) -> None:
        if scope == "admin":
            if not self.is_admin:
                raise Forbidden("This route is for cloud administrators only.")
        elif scope not in self.scopes and not self.is_admin:
            raise Forbidden(f"This key lacks the `{scope}` scope.")


def normalise_scopes(scopes: list[str] | None, *, tenant_key: bool) -> str:
    allowed = TENANT_SCOPES if tenant_key else SCOPES
    chosen = list(dict.fromkeys(list(allowed) if scopes is None else scopes))
    bad = [s for s in chosen if s not in allowed]
    if bad or not chosen:
        raise InvalidRequest(
            f"Scopes must be a non-empty subset of {list(allowed)}; got {chosen}.", field="scopes"
        )
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
    created_by: str | None = None,
) -> tuple[ApiKey, str]:
    """Create a key; the plain key is returned once and never stored."""
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidRequest("expires_at must be in the future.", field="expires_at")
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
        created_by=created_by,
    )
    session.add(row)
    session.flush()
    return row, key


def issue_key(
    *,
    session: Session,
    secret: bytes,
    principal: Principal,
    name: str,
    scopes: list[str] | None = None,
    expires_at: datetime | None = None,
    member_id: str | None = None,
) -> tuple[ApiKey, str]:
    """A key created by a caller for its own tenant (or, for an admin, a global key).

    Only owners (and admins, for global keys) create keys. A key never grants more than the key
    that created it: its scopes are a subset of the creator's and it expires no later, so a leaked
    read-only or short-lived key cannot mint a stronger or longer-lived one.
    """
    if not principal.manages_keys:
        raise Forbidden("Only an owner of the tenant can create API keys; ask an owner or an admin.")
    if scopes is not None:
        extra = sorted(set(scopes) - principal.scopes)
        if extra:
            raise Forbidden(f"A key cannot grant scopes the key creating it lacks: {extra}.")
    else:
        allowed = SCOPES if principal.tenant_id is None else TENANT_SCOPES
        scopes = [s for s in allowed if s in principal.scopes]
    if principal.expires_at is not None:
        if expires_at is None:
            expires_at = principal.expires_at
        elif expires_at > principal.expires_at:
            raise Forbidden("A key cannot outlive the key creating it; choose an earlier expires_at.")
    if member_id is None:
        member_id = principal.member_id
    else:
        member = session.get(Member, member_id)
        if member is None or member.tenant_id != principal.tenant_id:
            raise InvalidRequest(f"No member {member_id} in this tenant.", field="member_id")
    return create_key(
        session=session,
        secret=secret,
        tenant_id=principal.tenant_id,
        name=name,
        scopes=scopes,
        expires_at=expires_at,
        member_id=member_id,
        created_by=principal.key_id,
    )


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


def cached_principal(*, secret: bytes, key: str) -> Principal | None:
    """The principal of a key verified moments ago (no database read), or None.

    Raises Unauthorized for a malformed key, as `authenticate` would."""
    lookup = parse_key(key)
    cached = key_cache.get(lookup)
    if cached is not None:
        key_hash, principal, expires_at = cached
        if hmac.compare_digest(key_hash, hash_key(key, secret)) and (
            expires_at is None or expires_at > utcnow()
        ):
            return principal
    return None


def authenticate(*, session: Session, secret: bytes, key: str) -> Principal:
    """The principal of a presented key, or Unauthorized (malformed, unknown, revoked, expired)."""
    principal = cached_principal(secret=secret, key=key)
    if principal is not None:
        return principal
    lookup = parse_key(key)
    presented = hash_key(key, secret)
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
    role = None
    if row.member_id is not None:
        role = session.execute(select(Member.role).where(Member.id == row.member_id)).scalar_one_or_none()
    principal = Principal(
        row.id, row.tenant_id, row.member_id, frozenset(row.scopes.split()), role, row.expires_at
    )
    key_cache.put(lookup, row.key_hash, principal, row.expires_at)
    if row.last_used_at is None or row.last_used_at < utcnow() - LAST_USED_RESOLUTION:
        stale_last_use.add(row.id)
    return principal


# Keys whose `last_used_at` is older than its resolution, to be touched by `touch_last_used`.
# Recording every use would turn each request into a write; once a minute is enough to tell live
# keys from forgotten ones.
LAST_USED_RESOLUTION = timedelta(minutes=1)
stale_last_use: set[str] = set()


def touch_last_used(*, session: Session, key_id: str) -> None:
    now = utcnow()
    session.execute(
        update(ApiKey)
        .where(
            ApiKey.id == key_id,
            or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < now - LAST_USED_RESOLUTION),
        )
        .values(last_used_at=now)
    )
    stale_last_use.discard(key_id)


def list_keys(
    *,
    session: Session,
    tenant_id: str | None,
    member_id: str | None = None,
    after: str | None = None,
    limit: int = 100,
    include_revoked: bool = True,
) -> list[ApiKey]:
    """Keys of a tenant (None: the global admin keys), oldest first; `after` is a key id."""
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id).limit(limit)
    if member_id is not None:
        stmt = stmt.where(ApiKey.member_id == member_id)
    if after is not None:
        stmt = stmt.where(ApiKey.id > after)
    if not include_revoked:
        stmt = stmt.where(ApiKey.revoked_at.is_(None))
    return list(session.execute(stmt).scalars())


def get_key(*, session: Session, key_id: str, tenant_id: str | None, member_id: str | None = None) -> ApiKey:
    """A key of that tenant (and member, if given); anything else is indistinguishable from missing."""
    row = session.get(ApiKey, key_id)
    if row is None or row.tenant_id != tenant_id or (member_id is not None and row.member_id != member_id):
        raise NotFound(f"No API key {key_id}.")
    return row


def revoke_key(
    *, session: Session, key_id: str, tenant_id: str | None, member_id: str | None = None
) -> ApiKey:
    """Revoke a key of that tenant (None: a global key). Idempotent; effective at once in this process.

    Other API processes stop accepting it within the key cache's TTL (2 s).
    """
    row = get_key(session=session, key_id=key_id, tenant_id=tenant_id, member_id=member_id)
    if row.revoked_at is None:
        if row.tenant_id is None and "admin" in row.scopes.split():
            others = session.execute(
                select(func.count())
                .select_from(ApiKey)
                .where(
                    ApiKey.tenant_id.is_(None),
                    ApiKey.revoked_at.is_(None),
                    ApiKey.id != row.id,
                    ApiKey.scopes.contains("admin"),
                    or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > utcnow()),
                )
            ).scalar_one()
            if others == 0:
                raise Conflict("This is the last valid admin key; create another before revoking it.")
        now = utcnow()
        session.execute(
            update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=now)
        )
        row.revoked_at = now
    key_cache.forget(row.lookup)
    return row


def _own_filter(principal: Principal) -> str | None:
    """Owners and admins see every key of their tenant (or the global keys); others only their own."""
    if principal.manages_keys:
        return None
    # A key without a member (its member was removed) is not anyone's; it sees nothing but itself.
    return principal.member_id or principal.key_id


def list_visible_keys(
    *, session: Session, principal: Principal, after: str | None, limit: int, include_revoked: bool = True
) -> list[ApiKey]:
    own = _own_filter(principal)
    stmt = select(ApiKey).where(ApiKey.tenant_id == principal.tenant_id).order_by(ApiKey.id).limit(limit)
    if own is not None:
        stmt = stmt.where(or_(ApiKey.member_id == own, ApiKey.id == principal.key_id))
    if after is not None:
        stmt = stmt.where(ApiKey.id > after)
    if not include_revoked:
        stmt = stmt.where(ApiKey.revoked_at.is_(None))
    return list(session.execute(stmt).scalars())


def revoke_visible_key(*, session: Session, principal: Principal, key_id: str) -> ApiKey:
    """Revoke a key the caller may see (an owner any of its tenant's, a member its own)."""
    own = _own_filter(principal)
    if own is not None and key_id != principal.key_id:
        get_key(session=session, key_id=key_id, tenant_id=principal.tenant_id, member_id=own)
    return revoke_key(session=session, key_id=key_id, tenant_id=principal.tenant_id)


def revoke_member_keys(*, session: Session, member_id: str) -> int:
    """Revoke every live key of a member (on removal); returns how many were revoked."""
    rows = list(
        session.execute(
            select(ApiKey).where(ApiKey.member_id == member_id, ApiKey.revoked_at.is_(None))
        ).scalars()
    )
    now = utcnow()
    for row in rows:
        row.revoked_at = now
        key_cache.forget(row.lookup)
    session.flush()
    return len(rows)


def key_state(row: ApiKey) -> str:
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= utcnow():
        return "expired"
    return "active"
