"""Usage, trials, keys: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ipucloud.sdk._core import Call, Pager, model, operation, paginated, text
from ipucloud.sdk._ops_common import V1, _iso, _page, seg
from ipucloud.sdk.models import ApiKey, ApiKeyCreated, Page, TrialApplication, Usage


class AccountOps:
    """The caller's own tenant: usage, applying for a trial, API keys."""

    @operation
    def usage(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[Usage]:
        """The tenant's metered IPU-hours, remaining grant and breakdowns."""
        params = {"since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/usage", model(Usage), params=params)

    @operation
    def usage_csv(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[str]:
        """Your usage as CSV text, one row per job: machine type, rate, raw and charged IPU-hours."""
        params = {"format": "csv", "since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/usage", text, params=params)

    @operation
    def apply_for_trial(
        self, *, name: str, email: str, organisation: str, category: str, intended_use: str
    ) -> Call[TrialApplication]:
        """Apply for a free trial (no key needed); an admin approves it."""
        body = {
            "name": name,
            "email": email,
            "organisation": organisation,
            "category": category,
            "intended_use": intended_use,
        }
        return Call("POST", f"{V1}/trials", model(TrialApplication), json=body, authenticated=False)

    @operation
    def list_keys(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[ApiKey]]:
        """The keys this key may see: an owner's tenant's, a member's own, or the admin keys."""
        return Call("GET", f"{V1}/keys", _page(ApiKey), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_keys(self, *, page_size: int = 100) -> Pager[ApiKey]:
        """Every API key of your tenant (never their secrets), fetched page by page."""
        return lambda cursor: AccountOps.list_keys.build(self, limit=page_size, cursor=cursor)

    @operation
    def create_key(
        self, *, name: str, scopes: list[str] | None = None, expires_at: datetime | None = None
    ) -> Call[ApiKeyCreated]:
        """A new key for the caller's tenant; `api_key` is the key, shown only now."""
        body: dict[str, Any] = {"name": name}
        if scopes:
            body["scopes"] = scopes
        if expires_at:
            body["expires_at"] = expires_at.isoformat()
        return Call("POST", f"{V1}/keys", model(ApiKeyCreated), json=body)

    @operation
    def revoke_key(self, key_id: str) -> Call[ApiKey]:
        """Revoke one of your tenant's API keys: it is refused from now on."""
        return Call("DELETE", f"{V1}/keys/{seg(key_id)}", model(ApiKey))
