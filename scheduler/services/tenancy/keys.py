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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from scheduler.errors import Conflict, Forbidden, InvalidRequest, NotFound, TenantInactive, Unauthorized
from scheduler.ids import new_id
from scheduler.models import ApiKey, Member, Tenant, utcnow
from scheduler.services.tenancy.scope import Scope, scope_of

PREFIX = "ipuc_"
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
LOOKUP_LEN = 12
SECRET_LEN = 43  # 62**43 > 2**256
CHECK_LEN = 6
KEY_LEN = len(PREFIX) + LOOKUP_LEN + SECRET_LEN + CHECK_LEN
# `invoke` calls a tenant's inference endpoints and nothing else (api/deps.py, `Invoker`): a key
# that can only invoke can be handed to the application that serves its users.
SCOPES = ("read", "submit", "invoke", "admin")
TENANT_SCOPES = ("read", "submit", "invoke")


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
    may create; `suspended` says its tenant is suspended (`check_standing` refuses it).
    """

    key_id: str
    tenant_id: str | None
    member_id: str | None
    scopes: frozenset[str]
    role: str | None = None
    expires_at: datetime | None = None
    suspended: bool = False

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
    if not tenant_key and "admin" not in chosen:
        # A key of no tenant sees every tenant's jobs: only an admin may hold one.
        raise InvalidRequest("A global key (one of no tenant) must have the `admin` scope.", field="scopes")
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
    check_standing(principal)
    if principal.tenant_id is not None:
        tenant = session.get(Tenant, principal.tenant_id)
        if tenant is not None and tenant.expires_at is not None and tenant.expires_at <= utcnow():
            raise TenantInactive(
                f"The trial of {tenant.name} ended on {tenant.expires_at:%Y-%m-%d}: its keys can read, "
                "not create keys."
            )
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

    Entries are found by the key's public lookup part (a presented key) or by its id (a dashboard
    session, an open stream re-checking its key). Revoking a key, changing its member's role or its
    tenant's status in this process drops its entries at once; other processes see it within `ttl`.
    """

    def __init__(
        self, ttl: float = 2.0, size: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock  # a test can drive expiry without sleeping past a deadline on a loaded machine
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, str, Principal]] = {}  # lookup -> (deadline, hash, principal)
        self._by_id: dict[str, tuple[float, Principal]] = {}

    def get(self, lookup: str) -> tuple[str, Principal] | None:
        with self._lock:
            entry = self._entries.get(lookup)
            if entry is None or entry[0] < self.clock():
                return None
            return entry[1], entry[2]

    def get_id(self, key_id: str) -> Principal | None:
        with self._lock:
            entry = self._by_id.get(key_id)
            if entry is None or entry[0] < self.clock():
                return None
            return entry[1]

    def refresh_due(self, lookup: str) -> bool:
        """Whether the entry of ``lookup`` is live and in the second half of its life."""
        with self._lock:
            entry = self._entries.get(lookup)
            return entry is not None and 0 <= entry[0] - self.clock() < self.ttl / 2

    def renew(self, lookup: str, key_hash: str, principal: Principal) -> None:
        """``put``, only if ``lookup`` is still cached: a key dropped meanwhile (revoked, its tenant
        suspended in this process) is not brought back by a check that read the row before."""
        with self._lock:
            if lookup not in self._entries:
                return
        self.put(lookup, key_hash, principal)

    def put(self, lookup: str | None, key_hash: str | None, principal: Principal) -> None:
        deadline = self.clock() + self.ttl
        with self._lock:
            if len(self._entries) >= self.size or len(self._by_id) >= self.size:
                self._entries.clear()
                self._by_id.clear()
            if lookup is not None and key_hash is not None:
                self._entries[lookup] = (deadline, key_hash, principal)
            self._by_id[principal.key_id] = (deadline, principal)

    def forget(self, lookup: str | None = None, *, key_id: str | None = None) -> None:
        """Drop one key's entries (by lookup, id or both); with neither, drop everything."""
        with self._lock:
            if lookup is None and key_id is None:
                self._entries.clear()
                self._by_id.clear()
                return
            if lookup is not None:
                entry = self._entries.pop(lookup, None)
                if entry is not None:
                    self._by_id.pop(entry[2].key_id, None)
            if key_id is not None:
                self._by_id.pop(key_id, None)
                for name in [n for n, e in self._entries.items() if e[2].key_id == key_id]:
                    del self._entries[name]

    def forget_tenant(self, tenant_id: str) -> None:
        """Drop every key of a tenant (its status changed: suspended keys stop working at once here)."""
        with self._lock:
            for name in [n for n, e in self._entries.items() if e[2].tenant_id == tenant_id]:
                del self._entries[name]
            for key_id in [k for k, e in self._by_id.items() if e[1].tenant_id == tenant_id]:
                del self._by_id[key_id]


key_cache = _KeyCache()


def _live(principal: Principal) -> bool:
    return principal.expires_at is None or principal.expires_at > utcnow()


def cached_principal(*, secret: bytes, key: str) -> Principal | None:
    """The principal of a key verified moments ago (no database read), or None.

    Raises Unauthorized for a malformed key, as `authenticate` would."""
    lookup = parse_key(key)
    cached = key_cache.get(lookup)
    if cached is not None:
        key_hash, principal = cached
        if hmac.compare_digest(key_hash, hash_key(key, secret)) and _live(principal):
            return principal
    return None


def refresh_due(key: str) -> bool:
    """Whether a cached key is due its check ahead of expiry (``reverify``); False for a malformed key."""
    try:
        return key_cache.refresh_due(parse_key(key))
    except Unauthorized:
        return False


def reverify(*, session: Session, secret: bytes, key: str) -> None:
    """Check a cached key against the database again, before its entry expires: renewed if it still
    grants what it did, dropped if not (revoked, expired, its tenant gone). The inference fast path calls
    it off its event loop for a key in the second half of its entry's life, so that the requests of a
    key in steady use never find it expired: each such miss went through FastAPI's whole stack and a
    database read, every two seconds in every API process (a stall in the endpoint's p99 at one
    connection). Other processes still see a revocation within the cache's ``ttl``."""
    lookup = parse_key(key)
    row = session.execute(select(ApiKey).where(ApiKey.lookup == lookup)).scalar_one_or_none()
    try:
        if row is None or not hmac.compare_digest(row.key_hash, hash_key(key, secret)):
            raise Unauthorized("Unknown API key.")
        principal = _principal_of(session, row)
    except Unauthorized:
        key_cache.forget(lookup)
        return
    key_cache.renew(lookup, row.key_hash, principal)
    if row.last_used_at is None or row.last_used_at < utcnow() - LAST_USED_RESOLUTION:
        stale_last_use.add(row.id)


def _principal_of(session: Session, row: ApiKey) -> Principal:
    """The principal of a key row, or Unauthorized if the row no longer grants anything."""
    if row.revoked_at is not None:
        raise Unauthorized("This API key was revoked.")
    if row.expires_at is not None and row.expires_at <= utcnow():
        raise Unauthorized("This API key has expired.")
    suspended = False
    if row.tenant_id is not None:
        status = session.execute(select(Tenant.status).where(Tenant.id == row.tenant_id)).scalar_one()
        if status == "deleted":
            raise Unauthorized("This API key's tenant no longer exists.")
        suspended = status == "suspended"
    role = None
    if row.member_id is not None:
        role = session.execute(select(Member.role).where(Member.id == row.member_id)).scalar_one_or_none()
    return Principal(
        row.id,
        row.tenant_id,
        row.member_id,
        frozenset(row.scopes.split()),
        role,
        row.expires_at,
        suspended,
    )


def authenticate(*, session: Session, secret: bytes, key: str) -> Principal:
    """The principal of a presented key, or Unauthorized (malformed, unknown, revoked, expired).

    A key of a suspended tenant authenticates (its principal says `suspended`); `check_standing`
    refuses it, after the rate limit has counted the request."""
    principal = cached_principal(secret=secret, key=key)
    if principal is not None:
        return principal
    lookup = parse_key(key)
    presented = hash_key(key, secret)
    row = session.execute(select(ApiKey).where(ApiKey.lookup == lookup)).scalar_one_or_none()
    if row is None or not hmac.compare_digest(row.key_hash, presented):
        raise Unauthorized("Unknown API key.")
    principal = _principal_of(session, row)
    key_cache.put(lookup, row.key_hash, principal)
    if row.last_used_at is None or row.last_used_at < utcnow() - LAST_USED_RESOLUTION:
        stale_last_use.add(row.id)
    return principal


def cached_principal_by_id(key_id: str) -> Principal | None:
    """The principal of a key id checked moments ago (no database read), or None."""
    principal = key_cache.get_id(key_id)
    return principal if principal is not None and _live(principal) else None


def principal_by_id(*, session: Session, key_id: str) -> Principal:
    """The principal of a key known by its id (a dashboard session, an open stream), checked as
    `authenticate` checks a presented key and cached as long; Unauthorized if it grants nothing now."""
    principal = cached_principal_by_id(key_id)
    if principal is not None:
        return principal
    row = session.get(ApiKey, key_id)
    if row is None:
        raise Unauthorized("Unknown API key.")
    principal = _principal_of(session, row)
    key_cache.put(None, None, principal)
    return principal


def check_standing(principal: Principal) -> Principal:
    """Refuse the keys of a suspended tenant (403 `tenant-inactive`): they may do nothing at all."""
    if principal.suspended:
        raise TenantInactive(
            "This tenant is suspended: its keys and dashboard sessions do nothing until an admin "
            "makes it active again."
        )
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
    key_cache.forget(row.lookup, key_id=row.id)
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
        key_cache.forget(row.lookup, key_id=row.id)
    session.flush()
    return len(rows)


def key_state(row: ApiKey) -> str:
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= utcnow():
        return "expired"
    return "active"
