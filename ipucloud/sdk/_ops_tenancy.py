"""Admin: tenants, plans, trials: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ipucloud.sdk._core import Call, Pager, model, operation, paginated
from ipucloud.sdk._ops_common import V1, _drop_none, _jsonable, _page, seg
from ipucloud.sdk.models import (
    ApiKey,
    ApiKeyCreated,
    Page,
    Plan,
    Tenant,
    TenantCreated,
    TrialApplication,
    TrialDecision,
)


class TenancyOps:
    """Admin: tenants, plans, tenants' keys and trial applications."""

    @operation
    def create_tenant(
        self,
        *,
        name: str,
        plan: str = "trial",
        quota_ipu_hours: float | None = None,
        expires_at: datetime | None = None,
        fairshare_weight: float | None = None,
        owner_email: str | None = None,
    ) -> Call[TenantCreated]:
        """Create a tenant; the result's `api_key` is its first key, shown only now."""
        body = _drop_none(
            name=name,
            plan=plan,
            quota_ipu_hours=quota_ipu_hours,
            expires_at=expires_at.isoformat() if expires_at else None,
            fairshare_weight=fairshare_weight,
            owner_email=owner_email,
        )
        return Call("POST", f"{V1}/admin/tenants", model(TenantCreated), json=body)

    @operation
    def list_tenants(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[Tenant]]:
        """Admin: one page of tenants with their plans, grants and usage."""
        params = {"limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/admin/tenants", _page(Tenant), params=params)

    @paginated
    def iter_tenants(self, *, page_size: int = 100) -> Pager[Tenant]:
        """Admin: every tenant, fetched page by page."""
        return lambda cursor: TenancyOps.list_tenants.build(self, limit=page_size, cursor=cursor)

    @operation
    def get_tenant(self, tenant_id: str) -> Call[Tenant]:
        """Admin: a tenant by id."""
        return Call("GET", f"{V1}/admin/tenants/{seg(tenant_id)}", model(Tenant))

    @operation
    def update_tenant(self, tenant_id: str, **changes: Any) -> Call[Tenant]:
        """Change `plan`, `quota_ipu_hours`, `expires_at`, `fairshare_weight` or `status`."""
        path = f"{V1}/admin/tenants/{seg(tenant_id)}"
        return Call("PATCH", path, model(Tenant), json=_jsonable(changes))

    @operation
    def list_plans(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[Plan]]:
        """Admin: one page of plans."""
        return Call("GET", f"{V1}/admin/plans", _page(Plan), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_plans(self, *, page_size: int = 100) -> Pager[Plan]:
        """Admin: every plan, fetched page by page."""
        return lambda cursor: TenancyOps.list_plans.build(self, limit=page_size, cursor=cursor)

    @operation
    def get_plan(self, name: str) -> Call[Plan]:
        """Admin: a plan by name: its limits, rates and machine types."""
        return Call("GET", f"{V1}/admin/plans/{seg(name)}", model(Plan))

    @operation
    def update_plan(self, name: str, **changes: Any) -> Call[Plan]:
        """Admin: change a plan's fields (`changes`, as the plan's JSON); returns the plan as it now is."""
        return Call("PATCH", f"{V1}/admin/plans/{seg(name)}", model(Plan), json=_jsonable(changes))

    @operation
    def list_tenant_keys(
        self, tenant_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> Call[Page[ApiKey]]:
        """Admin: one page of a tenant's API keys."""
        path = f"{V1}/admin/tenants/{seg(tenant_id)}/keys"
        return Call("GET", path, _page(ApiKey), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_tenant_keys(self, tenant_id: str, *, page_size: int = 100) -> Pager[ApiKey]:
        """Admin: every API key of a tenant, fetched page by page."""
        return lambda cursor: TenancyOps.list_tenant_keys.build(
            self, tenant_id, limit=page_size, cursor=cursor
        )

    @operation
    def create_tenant_key(
        self,
        tenant_id: str,
        *,
        name: str,
        scopes: list[str] | None = None,
        expires_at: datetime | None = None,
        member_id: str | None = None,
    ) -> Call[ApiKeyCreated]:
        """Admin: make an API key for a tenant; the answer holds its secret, shown this once."""
        body = _drop_none(
            name=name,
            scopes=scopes or None,
            expires_at=expires_at.isoformat() if expires_at else None,
            member_id=member_id,
        )
        path = f"{V1}/admin/tenants/{seg(tenant_id)}/keys"
        return Call("POST", path, model(ApiKeyCreated), json=body)

    @operation
    def revoke_tenant_key(self, tenant_id: str, key_id: str) -> Call[ApiKey]:
        """Admin: revoke one of a tenant's API keys."""
        path = f"{V1}/admin/tenants/{seg(tenant_id)}/keys/{seg(key_id)}"
        return Call("DELETE", path, model(ApiKey))

    @operation
    def list_trials(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Call[Page[TrialApplication]]:
        """Admin: one page of trial applications (optionally of one `status`)."""
        params = {"status": status, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/admin/trials", _page(TrialApplication), params=params)

    @paginated
    def iter_trials(self, *, status: str | None = None, page_size: int = 100) -> Pager[TrialApplication]:
        """Admin: every trial application, fetched page by page."""
        return lambda cursor: TenancyOps.list_trials.build(
            self, status=status, limit=page_size, cursor=cursor
        )

    @operation
    def get_trial(self, application_id: str) -> Call[TrialApplication]:
        """Admin: a trial application by id."""
        return Call("GET", f"{V1}/admin/trials/{seg(application_id)}", model(TrialApplication))

    @operation
    def approve_trial(
        self, application_id: str, *, plan: str | None = None, hand_over_key: bool = False
    ) -> Call[TrialDecision]:
        """Approve: creates the tenant. The applicant's mailed claim link mints its first key and the
        result's `api_key` is None; with `hand_over_key` it is the first key, shown only now, and no
        claim link is mailed."""
        body: dict[str, object] = {"plan": plan} if plan else {}
        if hand_over_key:
            body["hand_over_key"] = True
        path = f"{V1}/admin/trials/{seg(application_id)}/approve"
        return Call("POST", path, model(TrialDecision), json=body)

    @operation
    def reject_trial(self, application_id: str, *, reason: str) -> Call[TrialApplication]:
        """Admin: reject a trial application, with the `reason` its applicant is told."""
        path = f"{V1}/admin/trials/{seg(application_id)}/reject"
        return Call("POST", path, model(TrialApplication), json={"reason": reason})
