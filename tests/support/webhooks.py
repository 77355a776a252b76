"""A tenant's webhook with one delivery, written directly (no address check, nothing sent): for the
tests that call every route, whose path parameters need a webhook and a delivery to exist."""

from __future__ import annotations

from typing import Any

from scheduler.ids import new_id
from scheduler.notify_models import Webhook, WebhookDelivery
from scheduler.services.tenancy import webhooks

# TEST-NET-1 (RFC 5737): never routed, and refused at connect time, so a test ping ends at once.
UNREACHABLE = "https://192.0.2.1/hook"


def make_webhook(db: Any, tenant_id: str, url: str = UNREACHABLE) -> tuple[str, int]:
    """Returns (webhook id, delivery id)."""
    with db.write() as s:
        hook = Webhook(
            id=new_id("wh"),
            tenant_id=tenant_id,
            url=url,
            description="",
            events=[],
            enabled=True,
            secret=webhooks.new_secret(),
        )
        s.add(hook)
        s.flush()
        delivery = WebhookDelivery(
            webhook_id=hook.id,
            tenant_id=tenant_id,
            event_id=f"job.succeeded:{hook.id}",
            event_type="job.succeeded",
            status="failed",
            attempts=1,
        )
        s.add(delivery)
        s.flush()
        return hook.id, delivery.id
