"""Plans and tenants."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.errors import Conflict, InvalidRequest, NotFound
from scheduler.ids import new_id
from scheduler.models import IPU_MS_PER_HOUR, ApiKey, Member, Plan, Tenant, utcnow
from scheduler.services import keys

# The plans a new cloud starts with. Admins edit them; nothing else depends on these numbers.
DEFAULT_PLANS: tuple[dict[str, object], ...] = (
    dict(
        name="trial",
        kind="trial",
        description="Free trial for individual developers",
        quota_ipu_hours=100.0,
        trial_days=30,
        max_partition_size=16,
        max_concurrent_jobs=2,
        max_queued_jobs=20,
        max_runtime_s=24 * 3600,
        idle_timeout_s=3600,
        priority=0,
        fairshare_weight=1.0,
    ),
    dict(
        name="trial-university",
        kind="trial",
        description="Free trial for university research projects",
        quota_ipu_hours=500.0,
        trial_days=90,
        max_partition_size=64,
        max_concurrent_jobs=4,
        max_queued_jobs=50,
        max_runtime_s=48 * 3600,
        idle_timeout_s=3600,
        priority=0,
        fairshare_weight=1.0,
    ),
    dict(
        name="trial-business",
        kind="trial",
        description="Free trial for companies evaluating IPUs",
        quota_ipu_hours=1000.0,
        trial_days=30,
        max_partition_size=64,
        max_concurrent_jobs=8,
        max_queued_jobs=100,
        max_runtime_s=72 * 3600,
        idle_timeout_s=3600,
        priority=1,
        fairshare_weight=1.0,
    ),
    dict(
        name="standard",
        kind="standard",
        description="Paid plan",
        quota_ipu_hours=10_000.0,
        trial_days=None,
        max_partition_size=256,
        max_concurrent_jobs=32,
        max_queued_jobs=1000,
        max_runtime_s=14 * 24 * 3600,
        idle_timeout_s=4 * 3600,
        priority=2,
        fairshare_weight=2.0,
    ),
    dict(
        name="internal",
        kind="internal",
        description="The operator's own teams",
        quota_ipu_hours=1_000_000.0,
        trial_days=None,
        max_partition_size=65_536,
        max_concurrent_jobs=10_000,
        max_queued_jobs=100_000,
        max_runtime_s=365 * 24 * 3600,
        idle_timeout_s=24 * 3600,
        priority=3,
        fairshare_weight=1.0,
    ),
)

TRIAL_PLAN_BY_CATEGORY = {
    "individual": "trial",
    "university": "trial-university",
    "business": "trial-business",
}


def seed_plans(*, session: Session) -> int:
    """Insert the default plans that are missing; never overwrite an admin's edits."""
    existing = set(session.execute(select(Plan.name)).scalars())
    added = 0
    for spec in DEFAULT_PLANS:
        if spec["name"] not in existing:
            session.add(Plan(**spec))
            added += 1
    session.flush()
    return added


def get_plan(*, session: Session, name: str) -> Plan:
    plan = session.get(Plan, name)
    if plan is None:
        raise NotFound(f"No plan named {name!r}.")
    return plan


def list_plans(*, session: Session) -> list[Plan]:
    return list(session.execute(select(Plan).order_by(Plan.name)).scalars())


def update_plan(*, session: Session, name: str, changes: dict[str, object]) -> Plan:
    plan = get_plan(session=session, name=name)
    for field, value in changes.items():
        setattr(plan, field, value)
    plan.updated_at = utcnow()
    session.flush()
    return plan


@dataclass
class CreatedTenant:
    tenant: Tenant
    api_key: str
    key: ApiKey


def create_tenant(
    *,
    session: Session,
    secret: bytes,
    name: str,
    plan: str,
    quota_ipu_hours: float | None = None,
    expires_at: datetime | None = None,
    fairshare_weight: float | None = None,
    owner_email: str | None = None,
    category: str | None = None,
    organisation: str | None = None,
) -> CreatedTenant:
    """Create a tenant, its owner and its first API key (returned once)."""
    plan_row = get_plan(session=session, name=plan)
    if session.execute(select(Tenant.id).where(Tenant.name == name)).first() is not None:
        raise Conflict(f"A tenant named {name!r} already exists.")
    hours = plan_row.quota_ipu_hours if quota_ipu_hours is None else quota_ipu_hours
    if expires_at is None and plan_row.trial_days is not None:
        expires_at = utcnow() + timedelta(days=plan_row.trial_days)
    tenant = Tenant(
        id=new_id("ten"),
        name=name,
        plan_name=plan_row.name,
        quota_ipu_ms=round(hours * IPU_MS_PER_HOUR),
        used_ipu_ms=0,
        reserved_ipu_ms=0,
        expires_at=expires_at,
        fairshare_weight=plan_row.fairshare_weight if fairshare_weight is None else fairshare_weight,
        contact_email=owner_email,
        category=category,
        organisation=organisation,
        status="active",
    )
    session.add(tenant)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"A tenant named {name!r} already exists.")
    owner = Member(
        id=new_id("mem"),
        tenant_id=tenant.id,
        email=owner_email or f"owner@{tenant.id}",
        name="owner",
        role="owner",
    )
    session.add(owner)
    session.flush()
    key_row, key = keys.create_key(
        session=session, secret=secret, tenant_id=tenant.id, name="first key", member_id=owner.id
    )
    return CreatedTenant(tenant=tenant, api_key=key, key=key_row)


def get_tenant(*, session: Session, tenant_id: str) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"No tenant {tenant_id}.")
    return tenant


def list_tenants(*, session: Session, after: str | None, limit: int) -> list[Tenant]:
    stmt = select(Tenant).order_by(Tenant.id).limit(limit)
    if after:
        stmt = stmt.where(Tenant.id > after)
    return list(session.execute(stmt).scalars())


def update_tenant(*, session: Session, tenant_id: str, changes: dict[str, object]) -> Tenant:
    tenant = get_tenant(session=session, tenant_id=tenant_id)
    if "plan" in changes:
        tenant.plan_name = get_plan(session=session, name=str(changes.pop("plan"))).name
    if "quota_ipu_hours" in changes:
        hours = changes.pop("quota_ipu_hours")
        assert isinstance(hours, int | float)
        tenant.quota_ipu_ms = round(hours * IPU_MS_PER_HOUR)
    if "status" in changes:
        status = changes.pop("status")
        if status not in ("active", "suspended"):
            raise InvalidRequest("status must be `active` or `suspended`.")
        tenant.status = str(status)
    for field in ("expires_at", "fairshare_weight"):
        if field in changes:
            setattr(tenant, field, changes.pop(field))
    if changes:
        raise InvalidRequest(f"Unknown tenant fields: {sorted(changes)}.")
    tenant.updated_at = utcnow()
    session.flush()
    return tenant


def ensure_admin_key(*, session: Session, secret: bytes) -> str | None:
    """Create the first admin (member and key) if the cloud has none; return the key only then."""
    existing = session.execute(
        select(ApiKey.id).where(ApiKey.tenant_id.is_(None), ApiKey.revoked_at.is_(None)).limit(1)
    ).first()
    if existing is not None:
        return None
    admin = Member(id=new_id("mem"), tenant_id=None, email="admin@localhost", name="admin", role="admin")
    session.add(admin)
    session.flush()
    _, key = keys.create_key(
        session=session,
        secret=secret,
        tenant_id=None,
        name="admin",
        scopes=list(keys.SCOPES),
        member_id=admin.id,
    )
    return key
