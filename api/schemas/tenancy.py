"""Tenants, their members, API keys and trial applications."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.schemas.common import Email, Hours, PersonName, PlanName, TenantName, UtcDatetime, Weight
from scheduler.models import ApiKey, Member, TrialApplication
from scheduler.services.tenancy.keys import key_state
from scheduler.text import LINE, TEXT

# Tenants, members, plans ------------------------------------------------------------------------------


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TenantName
    plan: PlanName = "trial"
    quota_ipu_hours: Hours | None = Field(None, description="Default: the plan's grant.")
    expires_at: UtcDatetime | None = Field(None, description="Default: the plan's trial length, if any.")
    fairshare_weight: Weight | None = None
    owner_email: Email | None = None


class TenantUpdate(BaseModel):
    """Fields to change; a null leaves the field as it is, except `expires_at` (null: never expires)."""

    model_config = ConfigDict(extra="forbid")

    plan: PlanName | None = None
    quota_ipu_hours: Hours | None = None
    expires_at: UtcDatetime | None = None
    fairshare_weight: Weight | None = None
    status: Literal["active", "suspended"] | None = None


class TenantOut(BaseModel):
    id: str
    name: str
    plan: str
    status: Literal["active", "suspended", "expired"] = Field(
        description="`expired`: active, but its trial has ended (it can read, not submit)."
    )
    quota_ipu_hours: float
    used_ipu_hours: float
    reserved_ipu_hours: float
    remaining_ipu_hours: float
    expires_at: datetime | None = None
    fairshare_weight: float
    category: str | None = None
    organisation: str | None = None
    created_at: datetime


class TenantCreated(TenantOut):
    api_key: str = Field(description="The tenant's first API key. Shown once: store it now.")


class MemberOut(BaseModel):
    id: str
    tenant_id: str
    email: str
    name: str
    role: Literal["owner", "member"]
    created_at: datetime

    @classmethod
    def of(cls, m: Member) -> MemberOut:
        return cls(
            id=m.id,
            tenant_id=m.tenant_id or "",
            email=m.email,
            name=m.name,
            role=m.role,
            created_at=m.created_at,
        )


class MemberCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: Email
    name: PersonName = Field(description="How the member is shown.")
    role: Literal["owner", "member"] = "member"


class MemberUpdate(BaseModel):
    """Null or absent fields stay as they are."""

    model_config = ConfigDict(extra="forbid")

    name: PersonName | None = None
    role: Literal["owner", "member"] | None = None


class MemberRemoved(MemberOut):
    revoked_keys: int = Field(description="How many of the member's keys were revoked with it.")


# API keys ---------------------------------------------------------------------------------------------

Scope = Literal["read", "submit", "invoke", "admin"]
TenantScope = Literal["read", "submit", "invoke"]
KeyName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=LINE)]


class ApiKeyOut(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="The key's first characters, to recognise it; never the secret.")
    scopes: list[Scope]
    tenant_id: str | None = None
    member_id: str | None = None
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = Field(None, description="Within a minute.")
    created_by: str | None = Field(None, description="The id of the key that created this one.")

    @classmethod
    def of(cls, k: ApiKey) -> ApiKeyOut:
        return cls(**_key_fields(k))


def _key_fields(k: ApiKey) -> dict[str, Any]:
    return dict(
        id=k.id,
        name=k.name,
        prefix=f"ipuc_{k.lookup[:6]}",
        scopes=k.scopes.split(),
        tenant_id=k.tenant_id,
        member_id=k.member_id,
        state=key_state(k),
        created_at=k.created_at,
        expires_at=k.expires_at,
        revoked_at=k.revoked_at,
        last_used_at=k.last_used_at,
        created_by=k.created_by,
    )


class ApiKeyCreated(ApiKeyOut):
    api_key: str = Field(description="The key itself. Shown once: store it now.")

    @classmethod
    def created(cls, k: ApiKey, api_key: str) -> ApiKeyCreated:
        return cls(**_key_fields(k), api_key=api_key)


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: KeyName
    scopes: list[Scope] | None = Field(
        None,
        min_length=1,
        max_length=4,
        description="Default: the creating key's scopes. A key never gets a scope its creator lacks.",
    )
    expires_at: UtcDatetime | None = Field(
        None,
        description="Default: never, or the creating key's expiry if it has one (a key cannot outlive it).",
    )
    member_id: Annotated[str, StringConstraints(min_length=1, max_length=40)] | None = Field(
        None, description="Owners may create a key for another member of the tenant; default: yourself."
    )


class AdminKeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: KeyName
    scopes: list[TenantScope] | None = Field(
        None,
        min_length=1,
        max_length=3,
        description="Default: all three. A key with only `invoke` calls the tenant's inference endpoints "
        "and nothing else.",
    )
    expires_at: UtcDatetime | None = None
    member_id: Annotated[str, StringConstraints(min_length=1, max_length=40)] | None = Field(
        None, description="The member the key belongs to; default: the tenant's first owner."
    )


# Trials -----------------------------------------------------------------------------------------------

Category = Literal["business", "university", "individual"]
TrialStatus = Literal["pending", "approved", "rejected"]


class TrialApplicationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: PersonName = Field(description="Your name.")
    email: Email
    organisation: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=LINE)] = Field(
        description="Company, university or project (individuals: anything that describes you)."
    )
    category: Category
    intended_use: Annotated[str, StringConstraints(min_length=10, max_length=5000, pattern=TEXT)] = Field(
        description="What you want to run on IPUs (10 to 5000 characters)."
    )


class TrialReceipt(BaseModel):
    """What an applicant gets back: the application as recorded."""

    id: str
    status: TrialStatus
    name: str
    email: str
    organisation: str
    category: Category
    created_at: datetime

    @classmethod
    def of(cls, a: TrialApplication) -> TrialReceipt:
        return cls(**_receipt_fields(a))


def _receipt_fields(a: TrialApplication) -> dict[str, Any]:
    return dict(
        id=a.id,
        status=a.status,
        name=a.name,
        email=a.email,
        organisation=a.organisation,
        category=a.category,
        created_at=a.created_at,
    )


class TrialApplicationOut(TrialReceipt):
    intended_use: str
    reason: str | None = None
    tenant_id: str | None = None
    plan: str | None = None
    decided_at: datetime | None = None
    decided_by: str | None = None

    @classmethod
    def of(cls, a: TrialApplication) -> TrialApplicationOut:
        return cls(
            **_receipt_fields(a),
            intended_use=a.intended_use,
            reason=a.reason,
            tenant_id=a.tenant_id,
            plan=a.plan,
            decided_at=a.decided_at,
            decided_by=a.decided_by,
        )


class TrialApprove(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: PlanName | None = Field(None, description="Default: the trial plan of the application's category.")
    hand_over_key: bool = Field(
        False,
        strict=True,  # true or false, not "yes": it decides who sees a secret
        description=(
            "Mint the tenant's first key now and answer it, for the admin to hand over (when mail cannot "
            "reach the applicant). Then no claim link is mailed; the applicant's mail says the key comes "
            "from the admin. Default: no key now; the applicant's claim link mints the first key."
        ),
    )


class TrialReject(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=TEXT)] = Field(
        description="Why; the applicant may be told."
    )


class TrialDecision(BaseModel):
    application: TrialApplicationOut
    tenant: TenantOut
    api_key: str | None = Field(
        description=(
            "The new tenant's first API key, only with `hand_over_key`: shown once, store it now. "
            "Otherwise null: the applicant's claim link mints the first key."
        )
    )
