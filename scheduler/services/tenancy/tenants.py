"""Plans and tenants."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.billing import ipu_ms_of_hours
from scheduler.errors import Conflict, InvalidRequest, NotFound
from scheduler.ids import new_id
from scheduler.models import ApiKey, Member, Plan, Tenant, utcnow
from scheduler.services.tenancy import keys

MIB = 2**20

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
        max_models=10,
        max_model_bytes=256 * MIB,
        preemptible_discount=0.5,
        checkpoint_retention_s=86400,
        max_session_s=6 * 3600,
        max_endpoints=2,
        max_endpoint_replicas=2,
        max_endpoint_ipus=8,
        max_array_size=64,
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
        max_models=25,
        max_model_bytes=1_024 * MIB,
        preemptible_discount=0.5,
        checkpoint_retention_s=3 * 86400,
        max_session_s=6 * 3600,
        max_endpoints=2,
        max_endpoint_replicas=2,
        max_endpoint_ipus=8,
        max_array_size=256,
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
        max_models=25,
        max_model_bytes=1_024 * MIB,
        preemptible_discount=0.5,
        checkpoint_retention_s=3 * 86400,
        max_session_s=6 * 3600,
        max_endpoints=2,
        max_endpoint_replicas=2,
        max_endpoint_ipus=8,
        max_array_size=256,
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
        max_models=200,
        max_model_bytes=4_096 * MIB,
        preemptible_discount=0.5,
        checkpoint_retention_s=7 * 86400,
        max_session_s=24 * 3600,
        max_endpoints=20,
        max_endpoint_replicas=16,
        max_endpoint_ipus=256,
        max_array_size=1000,
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
        max_models=10_000,
        max_model_bytes=65_536 * MIB,
        preemptible_discount=0.5,
        checkpoint_retention_s=30 * 86400,
        max_session_s=7 * 24 * 3600,
        max_endpoints=1000,
        max_endpoint_replicas=256,
        max_endpoint_ipus=65536,
        max_array_size=10000,
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


def list_plans(*, session: Session, after: str | None = None, limit: int = 1000) -> list[Plan]:
    """Plans by name; `after` is the name of the last plan of the previous page."""
    stmt = select(Plan).order_by(Plan.name).limit(limit)
    if after is not None:
        stmt = stmt.where(Plan.name > after)
    return list(session.execute(stmt).scalars())


# What an admin may change on a plan. `kind` and `name` are identity: tenants and the trial
# categories refer to them. A change applies to tenants on the plan at once (limits, priority),
# except the grant and the trial length, which a tenant receives when it is created.
EDITABLE_PLAN_FIELDS = frozenset(
    {
        "rates",
        "machine_types",
        "description",
        "quota_ipu_hours",
        "trial_days",
        "max_partition_size",
        "max_concurrent_jobs",
        "max_queued_jobs",
        "max_runtime_s",
        "idle_timeout_s",
        "max_session_s",
        "max_endpoints",
        "max_endpoint_replicas",
        "max_endpoint_ipus",
        "max_array_size",
        "priority",
        "fairshare_weight",
        "max_models",
        "max_model_bytes",
        "preemptible_discount",
        "checkpoint_retention_s",
        "never_preempt",
    }
)


def update_plan(*, session: Session, name: str, changes: dict[str, object]) -> Plan:
    """Change a plan's fields; a null leaves its field unchanged.

    `trial_days` is the lifetime a new tenant on the plan gets; it can be changed or given to any
    plan, but not removed through the API (a trial plan without an end would not be a trial).
    """
    unknown = sorted(set(changes) - EDITABLE_PLAN_FIELDS)
    if unknown:
        raise InvalidRequest(f"These plan fields cannot be changed: {unknown}.")
    size = changes.get("max_partition_size")
    if isinstance(size, int) and (size < 1 or size & (size - 1)):
        # Partitions are powers of two (vipu/partitions.py): 48 would admit nothing larger than 32.
        raise InvalidRequest(
            f"max_partition_size: partitions are a power of two IPUs (1, 2, 4 ... 65536), not {size}.",
            field="max_partition_size",
        )
    plan = get_plan(session=session, name=name)
    for field, value in changes.items():
        if value is None:
            continue
        if field == "rates":
            # Merged per type: setting one type's rate leaves the others as they were.
            value = {**(plan.rates or {}), **value}  # type: ignore[dict-item]
        if field == "machine_types" and not value:
            raise InvalidRequest("A plan runs jobs on at least one machine type.")
        setattr(plan, field, value)
    plan.updated_at = utcnow()
    session.flush()
    return plan


@dataclass
class CreatedTenant:
    tenant: Tenant
    api_key: str | None  # None when no key was minted (`with_key=False`)
    key: ApiKey | None
    owner_id: str


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
    owner_name: str = "owner",
    category: str | None = None,
    organisation: str | None = None,
    with_key: bool = True,
) -> CreatedTenant:
    """Create a tenant, its owner and (unless `with_key` is False) its first API key (returned once).

    A trial approved without a key gets its first key from the applicant's claim link instead.
    """
    plan_row = session.get(Plan, plan)
    if plan_row is None:
        raise InvalidRequest(f"No plan named {plan!r}; GET /api/v1/admin/plans lists them.", field="plan")
    same = session.execute(select(Tenant.name).where(func.lower(Tenant.name) == name.lower())).first()
    if same is not None:
        raise Conflict(f"A tenant named {same.name!r} already exists (names are unique whatever their case).")
    hours = plan_row.quota_ipu_hours if quota_ipu_hours is None else quota_ipu_hours
    if expires_at is None and plan_row.trial_days is not None:
        expires_at = utcnow() + timedelta(days=plan_row.trial_days)
    tenant = Tenant(
        id=new_id("ten"),
        name=name,
        plan_name=plan_row.name,
        quota_ipu_ms=ipu_ms_of_hours(hours),
        used_ipu_ms=0,
        reserved_ipu_ms=0,
        expires_at=expires_at,
        fairshare_weight=plan_row.fairshare_weight if fairshare_weight is None else fairshare_weight,
        contact_email=owner_email.lower() if owner_email else None,
        category=category,
        organisation=organisation,
        status="active",
    )
    session.add(tenant)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"A tenant named {name!r} already exists (names are unique whatever their case).")
    owner = Member(
        id=new_id("mem"),
        tenant_id=tenant.id,
        email=(owner_email or f"owner@{tenant.id}").lower(),
        name=owner_name,
        role="owner",
    )
    session.add(owner)
    session.flush()
    if not with_key:
        return CreatedTenant(tenant=tenant, api_key=None, key=None, owner_id=owner.id)
    key_row, key = keys.create_key(
        session=session, secret=secret, tenant_id=tenant.id, name="first key", member_id=owner.id
    )
    return CreatedTenant(tenant=tenant, api_key=key, key=key_row, owner_id=owner.id)


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
    """Change a tenant. Null leaves a field unchanged, except `expires_at` (null: never expires)."""
    tenant = get_tenant(session=session, tenant_id=tenant_id)
    changes = {k: v for k, v in changes.items() if v is not None or k == "expires_at"}
    if "plan" in changes:
        plan = session.get(Plan, str(changes.pop("plan")))
        if plan is None:
            raise InvalidRequest("No such plan; GET /api/v1/admin/plans lists them.", field="plan")
        tenant.plan_name = plan.name
    if "quota_ipu_hours" in changes:
        hours = changes.pop("quota_ipu_hours")
        if not isinstance(hours, int | float) or hours < 0:
            raise InvalidRequest("quota_ipu_hours must be a non-negative number.", field="quota_ipu_hours")
        tenant.quota_ipu_ms = ipu_ms_of_hours(hours)
    if "status" in changes:
        status = changes.pop("status")
        if status not in ("active", "suspended"):
            raise InvalidRequest("status must be `active` or `suspended`.", field="status")
        tenant.status = str(status)
        # Keys carry their tenant's standing in the key cache: a suspension applies at once here.
        keys.key_cache.forget_tenant(tenant.id)
    for field in ("expires_at", "fairshare_weight"):
        if field in changes:
            setattr(tenant, field, changes.pop(field))
    if changes:
        raise InvalidRequest(f"Unknown tenant fields: {sorted(changes)}.")
    tenant.updated_at = utcnow()
    session.flush()
    return tenant


def unique_tenant_name(*, session: Session, wanted: str) -> str:
    """A tenant name like `wanted` that no tenant has: letters, digits, space, `._-`; at most 100."""
    ascii_name = unicodedata.normalize("NFKD", wanted).encode("ascii", "ignore").decode()
    base = re.sub(r"[^A-Za-z0-9 ._-]+", "-", ascii_name).strip(" ._-")[:90].strip(" ._-") or "tenant"
    taken = set(
        session.execute(select(Tenant.name).where(Tenant.name.like(base.replace("%", "") + "%"))).scalars()
    )
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


# Members ---------------------------------------------------------------------------------------------

ROLES = ("owner", "member")


def list_members(*, session: Session, tenant_id: str, after: str | None, limit: int) -> list[Member]:
    get_tenant(session=session, tenant_id=tenant_id)
    stmt = select(Member).where(Member.tenant_id == tenant_id).order_by(Member.id).limit(limit)
    if after is not None:
        stmt = stmt.where(Member.id > after)
    return list(session.execute(stmt).scalars())


def get_member(*, session: Session, tenant_id: str, member_id: str) -> Member:
    member = session.get(Member, member_id)
    if member is None or member.tenant_id != tenant_id:
        raise NotFound(f"No member {member_id} in tenant {tenant_id}.")
    return member


def add_member(*, session: Session, tenant_id: str, email: str, name: str, role: str) -> Member:
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {list(ROLES)}.", field="role")
    get_tenant(session=session, tenant_id=tenant_id)
    email = email.lower()
    exists = session.execute(
        select(Member.id).where(Member.tenant_id == tenant_id, Member.email == email)
    ).first()
    if exists is not None:
        raise Conflict(f"{email} is already a member of this tenant.", member_id=exists[0])
    member = Member(id=new_id("mem"), tenant_id=tenant_id, email=email, name=name, role=role)
    session.add(member)
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        raise Conflict(f"{email} is already a member of this tenant.")
    return member


def _owners(session: Session, tenant_id: str) -> int:
    return session.execute(
        select(func.count()).select_from(Member).where(Member.tenant_id == tenant_id, Member.role == "owner")
    ).scalar_one()


def _lock_tenant(session: Session, tenant_id: str) -> Tenant:
    # Serialises membership changes of one tenant, so two removals cannot both leave it ownerless.
    tenant = session.execute(
        select(Tenant).where(Tenant.id == tenant_id).with_for_update(key_share=True)
    ).scalar_one_or_none()
    if tenant is None:
        raise NotFound(f"No tenant {tenant_id}.")
    return tenant


def update_member(*, session: Session, tenant_id: str, member_id: str, changes: dict[str, object]) -> Member:
    _lock_tenant(session, tenant_id)
    member = get_member(session=session, tenant_id=tenant_id, member_id=member_id)
    changes = {k: v for k, v in changes.items() if v is not None}
    unknown = sorted(set(changes) - {"role", "name"})
    if unknown:
        raise InvalidRequest(f"These member fields cannot be changed: {unknown}.")
    role = changes.get("role")
    if role is not None:
        if role not in ROLES:
            raise InvalidRequest(f"role must be one of {list(ROLES)}.", field="role")
        if member.role == "owner" and role != "owner" and _owners(session, tenant_id) <= 1:
            raise Conflict("This is the tenant's last owner; make another member owner first.")
        member.role = str(role)
    if "name" in changes:
        member.name = str(changes["name"])
    session.flush()
    # Keys carry their member's role in the key cache; drop them so the change applies at once here.
    for lookup, key_id in session.execute(
        select(ApiKey.lookup, ApiKey.id).where(ApiKey.member_id == member.id)
    ).tuples():
        keys.key_cache.forget(lookup, key_id=key_id)
    return member


def remove_member(*, session: Session, tenant_id: str, member_id: str) -> tuple[Member, int]:
    """Remove a member and revoke its keys; returns the member as it was and how many keys were revoked."""
    _lock_tenant(session, tenant_id)
    member = get_member(session=session, tenant_id=tenant_id, member_id=member_id)
    if member.role == "owner" and _owners(session, tenant_id) <= 1:
        raise Conflict("This is the tenant's last owner; make another member owner first.")
    revoked = keys.revoke_member_keys(session=session, member_id=member.id)
    # The revoked keys stay (for the record) but no longer point at the member, so it can go.
    session.execute(update(ApiKey).where(ApiKey.member_id == member.id).values(member_id=None))
    session.delete(member)
    session.flush()
    return member, revoked


def create_tenant_key(
    *,
    session: Session,
    secret: bytes,
    tenant_id: str,
    name: str,
    scopes: list[str] | None,
    expires_at: datetime | None,
    member_id: str | None,
    created_by: str | None,
) -> tuple[ApiKey, str]:
    """An admin's key for a tenant: it belongs to `member_id`, or by default the tenant's first owner."""
    get_tenant(session=session, tenant_id=tenant_id)
    if member_id is not None:
        member = session.get(Member, member_id)
        if member is None or member.tenant_id != tenant_id:
            raise InvalidRequest(f"No member {member_id} in this tenant.", field="member_id")
    else:
        member = first_owner(session=session, tenant_id=tenant_id)
    return keys.create_key(
        session=session,
        secret=secret,
        tenant_id=tenant_id,
        name=name,
        scopes=scopes,
        expires_at=expires_at,
        member_id=member.id if member is not None else None,
        created_by=created_by,
    )


def first_owner(*, session: Session, tenant_id: str) -> Member | None:
    return session.execute(
        select(Member)
        .where(Member.tenant_id == tenant_id, Member.role == "owner")
        .order_by(Member.id)
        .limit(1)
    ).scalar_one_or_none()


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
