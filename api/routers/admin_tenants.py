"""Admin routes for tenancy: tenants, their members and keys, plans, and trial applications."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import Admin, DbDep, SettingsDep
from api.schemas import (
    AdminKeyCreate,
    ApiKeyCreated,
    ApiKeyOut,
    CursorParam,
    MemberCreate,
    MemberOut,
    MemberRemoved,
    MemberUpdate,
    Page,
    PlanOut,
    PlanUpdate,
    TenantCreate,
    TenantCreated,
    TenantOut,
    TenantUpdate,
    TrialApplicationOut,
    TrialApprove,
    TrialDecision,
    TrialReject,
    TrialStatus,
    decode_cursor,
    encode_cursor,
)
from api.views import tenant_out
from scheduler.services.tenancy import keys as key_service
from scheduler.services.tenancy import tenants as tenant_service
from scheduler.services.tenancy import trials as trial_service

router = APIRouter(prefix="/api/v1/admin", tags=["admin: tenants"])

TenantId = Annotated[str, Path(min_length=1, max_length=40)]
MemberId = Annotated[str, Path(min_length=1, max_length=40)]
KeyId = Annotated[str, Path(min_length=1, max_length=40)]
PlanPath = Annotated[str, Path(min_length=1, max_length=64)]
ApplicationId = Annotated[str, Path(min_length=1, max_length=40)]
Limit = Annotated[int, Query(ge=1, le=500)]


def _next(rows: Sequence[object], limit: int, key: str) -> str | None:
    return encode_cursor(getattr(rows[limit - 1], key)) if len(rows) > limit else None


# Tenants ----------------------------------------------------------------------------------------------


@router.post(
    "/tenants", status_code=201, response_model=TenantCreated, summary="Create a tenant and its first key"
)
def create_tenant(body: TenantCreate, principal: Admin, db: DbDep, settings: SettingsDep) -> TenantCreated:
    with db.write() as s:
        created = tenant_service.create_tenant(
            session=s,
            secret=settings.secret(),
            name=body.name,
            plan=body.plan,
            quota_ipu_hours=body.quota_ipu_hours,
            expires_at=body.expires_at,
            fairshare_weight=body.fairshare_weight,
            owner_email=body.owner_email,
        )
        return TenantCreated(**tenant_out(created.tenant).model_dump(), api_key=created.api_key)


@router.get("/tenants", response_model=Page[TenantOut], summary="List tenants")
def list_tenants(
    principal: Admin, db: DbDep, cursor: CursorParam = None, limit: Limit = 100
) -> Page[TenantOut]:
    with db.read() as s:
        rows = tenant_service.list_tenants(session=s, after=decode_cursor(cursor), limit=limit + 1)
        items = [tenant_out(t) for t in rows[:limit]]
    return Page[TenantOut](items=items, next_cursor=_next(rows, limit, "id"))


@router.get("/tenants/{tenant_id}", response_model=TenantOut, summary="A tenant")
def get_tenant(tenant_id: TenantId, principal: Admin, db: DbDep) -> TenantOut:
    with db.read() as s:
        return tenant_out(tenant_service.get_tenant(session=s, tenant_id=tenant_id))


@router.patch(
    "/tenants/{tenant_id}",
    response_model=TenantOut,
    summary="Change a tenant's plan, quota, expiry or status",
)
def update_tenant(tenant_id: TenantId, body: TenantUpdate, principal: Admin, db: DbDep) -> TenantOut:
    with db.write() as s:
        t = tenant_service.update_tenant(
            session=s, tenant_id=tenant_id, changes=body.model_dump(exclude_unset=True)
        )
        return tenant_out(t)


# Members ----------------------------------------------------------------------------------------------


@router.get("/tenants/{tenant_id}/members", response_model=Page[MemberOut], summary="A tenant's members")
def list_members(
    tenant_id: TenantId, principal: Admin, db: DbDep, cursor: CursorParam = None, limit: Limit = 100
) -> Page[MemberOut]:
    with db.read() as s:
        rows = tenant_service.list_members(
            session=s, tenant_id=tenant_id, after=decode_cursor(cursor), limit=limit + 1
        )
        items = [MemberOut.of(m) for m in rows[:limit]]
    return Page[MemberOut](items=items, next_cursor=_next(rows, limit, "id"))


@router.post(
    "/tenants/{tenant_id}/members",
    status_code=201,
    response_model=MemberOut,
    summary="Add a member (owner or member) to a tenant",
)
def add_member(tenant_id: TenantId, body: MemberCreate, principal: Admin, db: DbDep) -> MemberOut:
    with db.write() as s:
        member = tenant_service.add_member(
            session=s, tenant_id=tenant_id, email=body.email, name=body.name, role=body.role
        )
        return MemberOut.of(member)


@router.patch(
    "/tenants/{tenant_id}/members/{member_id}",
    response_model=MemberOut,
    summary="Change a member's role or name",
)
def update_member(
    tenant_id: TenantId, member_id: MemberId, body: MemberUpdate, principal: Admin, db: DbDep
) -> MemberOut:
    with db.write() as s:
        member = tenant_service.update_member(
            session=s, tenant_id=tenant_id, member_id=member_id, changes=body.model_dump(exclude_unset=True)
        )
        return MemberOut.of(member)


@router.delete(
    "/tenants/{tenant_id}/members/{member_id}",
    response_model=MemberRemoved,
    summary="Remove a member and revoke its keys (never the last owner)",
)
def remove_member(tenant_id: TenantId, member_id: MemberId, principal: Admin, db: DbDep) -> MemberRemoved:
    with db.write() as s:
        member, revoked = tenant_service.remove_member(session=s, tenant_id=tenant_id, member_id=member_id)
        return MemberRemoved(**MemberOut.of(member).model_dump(), revoked_keys=revoked)


# A tenant's keys --------------------------------------------------------------------------------------


@router.get("/tenants/{tenant_id}/keys", response_model=Page[ApiKeyOut], summary="A tenant's API keys")
def list_tenant_keys(
    tenant_id: TenantId,
    principal: Admin,
    db: DbDep,
    cursor: CursorParam = None,
    limit: Limit = 100,
    include_revoked: bool = True,
) -> Page[ApiKeyOut]:
    with db.read() as s:
        tenant_service.get_tenant(session=s, tenant_id=tenant_id)
        rows = key_service.list_keys(
            session=s,
            tenant_id=tenant_id,
            after=decode_cursor(cursor),
            limit=limit + 1,
            include_revoked=include_revoked,
        )
        items = [ApiKeyOut.of(k) for k in rows[:limit]]
    return Page[ApiKeyOut](items=items, next_cursor=_next(rows, limit, "id"))


@router.post(
    "/tenants/{tenant_id}/keys",
    status_code=201,
    response_model=ApiKeyCreated,
    summary="Create a key for a tenant (shown once)",
)
def create_tenant_key(
    tenant_id: TenantId, body: AdminKeyCreate, principal: Admin, db: DbDep, settings: SettingsDep
) -> ApiKeyCreated:
    with db.write() as s:
        row, key = tenant_service.create_tenant_key(
            session=s,
            secret=settings.secret(),
            tenant_id=tenant_id,
            name=body.name,
            scopes=list(body.scopes) if body.scopes is not None else None,
            expires_at=body.expires_at,
            member_id=body.member_id,
            created_by=principal.key_id,
        )
        return ApiKeyCreated.created(row, key)


@router.delete(
    "/tenants/{tenant_id}/keys/{key_id}",
    response_model=ApiKeyOut,
    summary="Revoke a tenant's key (at once here, within 2 s in every API process)",
)
def revoke_tenant_key(tenant_id: TenantId, key_id: KeyId, principal: Admin, db: DbDep) -> ApiKeyOut:
    with db.write() as s:
        return ApiKeyOut.of(key_service.revoke_key(session=s, key_id=key_id, tenant_id=tenant_id))


# Plans ------------------------------------------------------------------------------------------------


@router.get("/plans", response_model=Page[PlanOut], summary="List plans")
def list_plans(principal: Admin, db: DbDep, cursor: CursorParam = None, limit: Limit = 100) -> Page[PlanOut]:
    with db.read() as s:
        rows = tenant_service.list_plans(session=s, after=decode_cursor(cursor), limit=limit + 1)
        items = [PlanOut.of(p) for p in rows[:limit]]
    return Page[PlanOut](items=items, next_cursor=_next(rows, limit, "name"))


@router.get("/plans/{name}", response_model=PlanOut, summary="A plan")
def get_plan(name: PlanPath, principal: Admin, db: DbDep) -> PlanOut:
    with db.read() as s:
        return PlanOut.of(tenant_service.get_plan(session=s, name=name))


@router.patch(
    "/plans/{name}",
    response_model=PlanOut,
    summary="Change a plan (limits apply to its tenants at once; grants to new tenants)",
)
def update_plan(name: PlanPath, body: PlanUpdate, principal: Admin, db: DbDep) -> PlanOut:
    with db.write() as s:
        plan = tenant_service.update_plan(session=s, name=name, changes=body.model_dump(exclude_unset=True))
        return PlanOut.of(plan)


# Trial applications -----------------------------------------------------------------------------------


@router.get(
    "/trials", response_model=Page[TrialApplicationOut], summary="Trial applications in order of arrival"
)
def list_trials(
    principal: Admin,
    db: DbDep,
    status: TrialStatus | None = None,
    cursor: CursorParam = None,
    limit: Limit = 100,
) -> Page[TrialApplicationOut]:
    with db.read() as s:
        rows = trial_service.list_applications(
            session=s, status=status, after=decode_cursor(cursor), limit=limit + 1
        )
        items = [TrialApplicationOut.of(a) for a in rows[:limit]]
    return Page[TrialApplicationOut](items=items, next_cursor=_next(rows, limit, "id"))


@router.get("/trials/{application_id}", response_model=TrialApplicationOut, summary="A trial application")
def get_trial(application_id: ApplicationId, principal: Admin, db: DbDep) -> TrialApplicationOut:
    with db.read() as s:
        return TrialApplicationOut.of(trial_service.get_application(session=s, application_id=application_id))


@router.post(
    "/trials/{application_id}/approve",
    response_model=TrialDecision,
    summary="Approve: create the tenant; the applicant's claim link mints its first key",
)
def approve_trial(
    application_id: ApplicationId,
    principal: Admin,
    db: DbDep,
    settings: SettingsDep,
    body: TrialApprove | None = None,
) -> TrialDecision:
    with db.write() as s:
        application, created = trial_service.approve(
            session=s,
            secret=settings.secret(),
            application_id=application_id,
            plan=body.plan if body is not None else None,
            decided_by=principal.key_id,
            link_base=settings.link_base,
            hand_over_key=body is not None and body.hand_over_key,
        )
        return TrialDecision(
            application=TrialApplicationOut.of(application),
            tenant=tenant_out(created.tenant),
            api_key=created.api_key,
        )


@router.post(
    "/trials/{application_id}/reject", response_model=TrialApplicationOut, summary="Reject, with a reason"
)
def reject_trial(
    application_id: ApplicationId, body: TrialReject, principal: Admin, db: DbDep, settings: SettingsDep
) -> TrialApplicationOut:
    with db.write() as s:
        application = trial_service.reject(
            session=s,
            application_id=application_id,
            reason=body.reason,
            decided_by=principal.key_id,
            link_base=settings.link_base,
        )
        return TrialApplicationOut.of(application)
