"""The webhook and event operations, a part of `Operations` (`_api.py`) kept in a file of its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ipucloud.sdk._core import Call, Pager, model, operation, paginated
from ipucloud.sdk.models import Delivery, Event, Page, Webhook, WebhookCreated, WebhookTest

V1 = "/api/v1"


def _seg(value: str | int) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


def _page(item: type[Any]) -> Any:
    return model(Page[item])  # type: ignore[valid-type]


class WebhookOperations:
    """Webhooks (owners manage, members read) and the tenant's events (docs/notifications.md)."""

    @operation
    def create_webhook(
        self, url: str, *, events: Sequence[str] = (), description: str = ""
    ) -> Call[WebhookCreated]:
        """Register a receiver; `events` empty means every type. The answer's `secret` is shown once."""
        body = {"url": url, "events": list(events), "description": description}
        return Call("POST", f"{V1}/webhooks", model(WebhookCreated), json=body)

    @operation
    def list_webhooks(self, *, limit: int = 50, cursor: str | None = None) -> Call[Page[Webhook]]:
        """One page of your tenant's webhooks."""
        return Call("GET", f"{V1}/webhooks", _page(Webhook), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_webhooks(self, *, page_size: int = 50) -> Pager[Webhook]:
        """Every webhook of your tenant, fetched page by page."""
        return lambda cursor: WebhookOperations.list_webhooks.build(self, limit=page_size, cursor=cursor)

    @operation
    def get_webhook(self, webhook_id: str) -> Call[Webhook]:
        """A webhook of yours by id: its URL, event types and state."""
        return Call("GET", f"{V1}/webhooks/{_seg(webhook_id)}", model(Webhook))

    @operation
    def change_webhook(
        self,
        webhook_id: str,
        *,
        url: str | None = None,
        events: Sequence[str] | None = None,
        description: str | None = None,
        enabled: bool | None = None,
    ) -> Call[Webhook]:
        """Change what is given; `enabled=True` re-enables a disabled webhook."""
        fields = {"url": url, "events": None if events is None else list(events), "description": description}
        body = {k: v for k, v in {**fields, "enabled": enabled}.items() if v is not None}
        return Call("PATCH", f"{V1}/webhooks/{_seg(webhook_id)}", model(Webhook), json=body)

    @operation
    def delete_webhook(self, webhook_id: str) -> Call[Webhook]:
        """Delete a webhook of yours: nothing more is delivered to it."""
        return Call("DELETE", f"{V1}/webhooks/{_seg(webhook_id)}", model(Webhook))

    @operation
    def rotate_webhook_secret(self, webhook_id: str, *, overlap_s: int = 86400) -> Call[WebhookCreated]:
        """A new secret (shown once); the old one signs beside it for `overlap_s` seconds."""
        path = f"{V1}/webhooks/{_seg(webhook_id)}/rotate-secret"
        return Call("POST", path, model(WebhookCreated), json={"overlap_s": overlap_s})

    @operation
    def test_webhook(self, webhook_id: str) -> Call[WebhookTest]:
        """Send a signed `webhook.ping` now: the receiver's status, latency and a body excerpt."""
        return Call("POST", f"{V1}/webhooks/{_seg(webhook_id)}/test", model(WebhookTest))

    @operation
    def list_deliveries(
        self, webhook_id: str, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Call[Page[Delivery]]:
        """A webhook's deliveries, newest first; `status` is pending, succeeded or failed."""
        params = {"status": status, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/webhooks/{_seg(webhook_id)}/deliveries", _page(Delivery), params=params)

    @paginated
    def iter_deliveries(
        self, webhook_id: str, *, status: str | None = None, page_size: int = 50
    ) -> Pager[Delivery]:
        """Every delivery of one webhook (newest first), fetched page by page."""
        return lambda cursor: WebhookOperations.list_deliveries.build(
            self, webhook_id, status=status, limit=page_size, cursor=cursor
        )

    @operation
    def redeliver(self, webhook_id: str, delivery_id: int) -> Call[Delivery]:
        """Send a delivery's event again, with the same `webhook-id`."""
        path = f"{V1}/webhooks/{_seg(webhook_id)}/deliveries/{_seg(delivery_id)}/redeliver"
        return Call("POST", path, model(Delivery))

    @operation
    def list_events(
        self, *, types: Sequence[str] = (), limit: int = 100, cursor: str | None = None
    ) -> Call[Page[Event]]:
        """The tenant's events of the last 30 days, newest first."""
        params = {"type": list(types) or None, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/events", _page(Event), params=params)

    @paginated
    def iter_events(self, *, types: Sequence[str] = (), page_size: int = 100) -> Pager[Event]:
        """Every event of your tenant (newest first), fetched page by page."""
        return lambda cursor: WebhookOperations.list_events.build(
            self, types=types, limit=page_size, cursor=cursor
        )
