"""Webhooks: a tenant's receivers, their signing secrets, a test ping, and their deliveries read back
and redelivered. Deliveries themselves are made by the notifier (`deliveries.py`); docs/notifications.md.
"""

from __future__ import annotations

import secrets as secrets_module
from base64 import b64encode
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from scheduler import webhook_http
from scheduler.db import Database
from scheduler.errors import Forbidden, InvalidRequest, LimitExceeded, NotFound
from scheduler.ids import new_id
from scheduler.models import Plan, Tenant, utcnow
from scheduler.notify_models import Webhook, WebhookDelivery
from scheduler.services.tenancy.notifications import EVENT_TYPES, PING
from scheduler.services.tenancy.scope import Scope, restrict, sees
from scheduler.settings import Settings


def new_secret() -> str:
    """A `whsec_` secret: 32 random bytes, base64, as the Standard Webhooks libraries read it."""
    return "whsec_" + b64encode(secrets_module.token_bytes(32)).decode()


def _check_events(events: Sequence[str]) -> list[str]:
    chosen = list(dict.fromkeys(events))
    unknown = [e for e in chosen if e not in EVENT_TYPES]
    if unknown:
        raise InvalidRequest(
            f"Unknown event types {unknown}; known: {', '.join(EVENT_TYPES)}.", field="events"
        )
    return chosen


def _check_url(url: str, allow_private: bool) -> str:
    try:
        return webhook_http.check_url(url, allow_private=allow_private)
    except webhook_http.Refused as exc:
        raise InvalidRequest(str(exc), field="url")


def check_manager(principal: Any) -> None:
    if not (principal.is_admin or principal.role == "owner"):
        raise Forbidden("Only an owner of the tenant manages its webhooks; members may read them.")


def create_webhook(
    *,
    session: Session,
    principal: Any,
    url: str,
    events: Sequence[str],
    description: str,
    allow_private: bool,
) -> tuple[Webhook, str]:
    """Register a receiver for the caller's tenant, within its plan's limit; the secret is returned
    once and never again."""
    check_manager(principal)
    if principal.tenant_id is None:
        raise Forbidden("A webhook belongs to a tenant; an admin key has none. Use a key of the tenant.")
    chosen = _check_events(events)
    url = _check_url(url, allow_private)
    limit = session.execute(
        select(Plan.max_webhooks)
        .join(Tenant, Tenant.plan_name == Plan.name)
        .where(Tenant.id == principal.tenant_id)
        .with_for_update(of=Tenant, key_share=True)
    ).scalar_one()
    count = session.execute(
        select(func.count(Webhook.id)).where(Webhook.tenant_id == principal.tenant_id)
    ).scalar_one()
    if count + 1 > limit:
        raise LimitExceeded(
            f"Your plan allows {limit} webhooks and you have {count}; remove one first.", limit="max_webhooks"
        )
    secret = new_secret()
    row = Webhook(
        id=new_id("wh"),
        tenant_id=principal.tenant_id,
        url=url,
        description=description,
        events=chosen,
        enabled=True,
        secret=secret,
        created_by=principal.key_id,
    )
    session.add(row)
    session.flush()
    return row, secret


def list_webhooks(*, session: Session, scope: Scope, after: str | None, limit: int) -> list[Webhook]:
    stmt = restrict(select(Webhook), Webhook.tenant_id, scope).order_by(Webhook.id).limit(limit)
    if after is not None:
        stmt = stmt.where(Webhook.id > after)
    return list(session.execute(stmt).scalars())


def get_webhook(*, session: Session, scope: Scope, webhook_id: str, lock: bool = False) -> Webhook:
    stmt = select(Webhook).where(Webhook.id == webhook_id)
    if lock:
        stmt = stmt.with_for_update()
    row = session.execute(stmt).scalar_one_or_none()
    if row is None or not sees(scope, row.tenant_id):
        raise NotFound(f"No webhook {webhook_id}.")
    return row


def update_webhook(
    *,
    session: Session,
    principal: Any,
    webhook_id: str,
    changes: dict[str, Any],
    allow_private: bool,
) -> Webhook:
    """Change a webhook's url, events, description or enabled; a null leaves a field as it is.
    Enabling a disabled webhook starts its failure count afresh."""
    check_manager(principal)
    row = get_webhook(session=session, scope=principal.scope, webhook_id=webhook_id, lock=True)
    if changes.get("url") is not None:
        row.url = _check_url(changes["url"], allow_private)
    if changes.get("events") is not None:
        row.events = _check_events(changes["events"])
    if changes.get("description") is not None:
        row.description = changes["description"]
    if changes.get("enabled") is not None:
        if changes["enabled"] and not row.enabled:
            row.failing_since = None
            row.disabled_reason = None
        row.enabled = bool(changes["enabled"])
        if not row.enabled and row.disabled_reason is None:
            row.disabled_reason = "disabled by its owner"
    row.updated_at = utcnow()
    session.flush()
    return row


def delete_webhook(*, session: Session, principal: Any, webhook_id: str) -> Webhook:
    check_manager(principal)
    row = get_webhook(session=session, scope=principal.scope, webhook_id=webhook_id, lock=True)
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == row.id))
    session.delete(row)
    session.flush()
    return row


def rotate_secret(
    *, session: Session, principal: Any, webhook_id: str, overlap_s: int
) -> tuple[Webhook, str]:
    """A new secret (returned once); the old one keeps signing beside it for `overlap_s` wall seconds,
    so a receiver can change over without missing a delivery."""
    check_manager(principal)
    row = get_webhook(session=session, scope=principal.scope, webhook_id=webhook_id, lock=True)
    secret = new_secret()
    if overlap_s > 0:
        row.previous_secret = row.secret
        row.previous_secret_until = utcnow() + timedelta(seconds=overlap_s)
    else:
        row.previous_secret = None
        row.previous_secret_until = None
    row.secret = secret
    row.updated_at = utcnow()
    session.flush()
    return row, secret


def signing_secrets(row: Webhook, now: datetime) -> list[str]:
    """The secrets that sign a request now: the current one, and the previous while its overlap lasts."""
    found = [row.secret]
    if row.previous_secret and row.previous_secret_until and row.previous_secret_until > now:
        found.append(row.previous_secret)
    return found


def ping_body(row: Webhook, now: datetime) -> bytes:
    return render(PING, {"webhook_id": row.id, "url": f"/api/v1/webhooks/{row.id}"}, now, None)


@dataclass(frozen=True)
class Ping:
    """A test ping's answer: the receiver's `outcome` and the `webhook-id` it was sent with."""

    outcome: webhook_http.Outcome
    msg_id: str


def send_ping(*, db: Database, principal: Any, webhook_id: str, settings: Settings) -> Ping:
    """A signed `webhook.ping` to one of the caller's webhooks now (API and dashboard alike)."""
    with db.read() as s:
        check_manager(principal)
        row = get_webhook(session=s, scope=principal.scope, webhook_id=webhook_id)
        now = utcnow()
        secrets = signing_secrets(row, now)
        url = row.url
        msg_id = new_id("ping")
        body = ping_body(row, now)
    # Outside the transaction: the receiver may take its whole timeout.
    outcome = webhook_http.send(
        url=url,
        msg_id=msg_id,
        body=body,
        secrets=secrets,
        timeout_s=settings.webhook_timeout_s,
        max_bytes=settings.webhook_max_response_bytes,
        allow_private=settings.webhook_allow_private,
        timestamp=now,
    )
    return Ping(outcome, msg_id)


def render(type_: str, data: dict[str, Any], at: datetime, public_url: str | None) -> bytes:
    """The body sent: the Standard Webhooks payload shape, `{type, timestamp, data}`; `data.url`
    absolute when the cloud knows its public URL."""
    if public_url and isinstance(data.get("url"), str) and data["url"].startswith("/"):
        data = {**data, "url": public_url.rstrip("/") + data["url"]}
    return orjson.dumps({"type": type_, "timestamp": at.isoformat(), "data": data})


DELIVERY_STATUSES = ("pending", "succeeded", "failed")


def list_deliveries(
    *,
    session: Session,
    scope: Scope,
    webhook_id: str,
    status: str | None,
    before: int | None,
    limit: int,
) -> list[WebhookDelivery]:
    """A webhook's deliveries, newest first."""
    get_webhook(session=session, scope=scope, webhook_id=webhook_id)
    stmt = (
        select(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == webhook_id)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit)
    )
    if status is not None:
        stmt = stmt.where(WebhookDelivery.status == status)
    if before is not None:
        stmt = stmt.where(WebhookDelivery.id < before)
    return list(session.execute(stmt).scalars())


def redeliver(*, session: Session, principal: Any, webhook_id: str, delivery_id: int) -> WebhookDelivery:
    """Send a delivery's event again, as a new delivery with the same `webhook-id` (the event's id),
    so a receiver that deduplicates on it sees a repeat."""
    check_manager(principal)
    hook = get_webhook(session=session, scope=principal.scope, webhook_id=webhook_id)
    old = session.get(WebhookDelivery, delivery_id)
    if old is None or old.webhook_id != hook.id:
        raise NotFound(f"No delivery {delivery_id} of webhook {webhook_id}.")
    if not hook.enabled:
        raise InvalidRequest(
            "The webhook is disabled; enable it first (PATCH enabled=true).", field="enabled"
        )
    row = WebhookDelivery(
        webhook_id=hook.id,
        tenant_id=hook.tenant_id,
        event_id=old.event_id,
        event_type=old.event_type,
        status="pending",
        attempts=0,
        next_attempt_at=utcnow(),
        event_at=old.event_at,
    )
    session.add(row)
    session.flush()
    return row
