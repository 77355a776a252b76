"""Claim links: how an approved trial applicant gets their first key.

Approving a trial mails the applicant a single-use link, valid 72 hours (wall time), whose token is
kept only as a hash. Following it (a POST from the page the link opens, so a mail scanner that fetches
the link uses nothing) mints the owner's API key, shows it once and signs the applicant in. A used or
expired link is a 410 that says only that.
"""

from __future__ import annotations

import hashlib
import secrets as secrets_module
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.errors import Gone, NotFound
from scheduler.models import ApiKey, Member, Tenant, utcnow
from scheduler.notify_models import ClaimLink
from scheduler.services.tenancy import keys

CLAIM_TTL = timedelta(hours=72)
TOKEN_BYTES = 32
MAX_TOKEN = 100
GONE = "This link was used already or has expired. Sign in with the key it showed, or ask us for a new link."


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(*, session: Session, application_id: str, tenant_id: str, member_id: str) -> str:
    """A new link's token (returned once, to be mailed); only its hash is stored."""
    token = secrets_module.token_urlsafe(TOKEN_BYTES)
    now = utcnow()
    session.add(
        ClaimLink(
            token_hash=_hash(token),
            application_id=application_id,
            tenant_id=tenant_id,
            member_id=member_id,
            expires_at=now + CLAIM_TTL,
            created_at=now,
        )
    )
    return token


def _find(session: Session, token: str, *, lock: bool) -> ClaimLink:
    if not token or len(token) > MAX_TOKEN:
        raise NotFound("No such link.")
    stmt = select(ClaimLink).where(ClaimLink.token_hash == _hash(token))
    if lock:
        stmt = stmt.with_for_update()
    row = session.execute(stmt).scalar_one_or_none()
    if row is None:
        raise NotFound("No such link.")
    tenant = session.get(Tenant, row.tenant_id)
    if row.used_at is not None or row.expires_at <= utcnow() or tenant is None or tenant.status != "active":
        raise Gone(GONE)
    return row


def check(*, session: Session, token: str) -> str:
    """The tenant's name if the link may still be used; Gone or NotFound otherwise. Uses nothing."""
    row = _find(session, token, lock=False)
    tenant = session.get(Tenant, row.tenant_id)
    return tenant.name if tenant else ""


@dataclass(frozen=True)
class Claimed:
    tenant_id: str
    tenant_name: str
    member_id: str
    key: ApiKey
    api_key: str


def claim(*, session: Session, secret: bytes, token: str) -> Claimed:
    """Use the link: mint the applicant's key (shown once by the caller). A second use is Gone."""
    row = _find(session, token, lock=True)
    row.used_at = utcnow()
    member = session.get(Member, row.member_id)
    tenant = session.get(Tenant, row.tenant_id)
    if member is None or tenant is None:
        raise Gone(GONE)
    key, api_key = keys.create_key(
        session=session,
        secret=secret,
        tenant_id=row.tenant_id,
        name="first key (claim link)",
        member_id=member.id,
    )
    session.flush()
    return Claimed(
        tenant_id=tenant.id, tenant_name=tenant.name, member_id=member.id, key=key, api_key=api_key
    )
