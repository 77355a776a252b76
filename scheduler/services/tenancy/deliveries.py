"""Delivering events to webhooks: the notifier's half (`workers/notifier.py` drives it).

The events table is the outbox: the notifier turns each new event into one delivery per subscribed
webhook (`fan_out`), claims the deliveries that are due (`claim_due`), sends each
(`scheduler/webhook_http.py`) and records the outcome (`record_outcome`), which schedules the next try
or ends the delivery. Nothing about a delivery lives only in the broker or in a worker's memory, so
none is lost across a restart of either: a claim not settled by its deadline is simply claimed again.
The same `webhook-id` (the event's id) is sent on every try.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypedDict

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from scheduler import webhook_http
from scheduler.clock import Clock
from scheduler.models import utcnow
from scheduler.notify_models import Event, Webhook, WebhookDelivery
from scheduler.services.tenancy.notifications import emit
from scheduler.services.tenancy.webhooks import render, signing_secrets

# The Standard Webhooks retry schedule (Svix's: immediately, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
# 10 h), stretched by 20 h and 24 h to about three days; cluster seconds, so `ipucloud up` and the
# tests compress it by their time scale. Each wait varies by up to a fifth, so the retries of a burst
# of failures do not all arrive together.
RETRY_SCHEDULE_S = (5, 300, 1800, 7200, 18000, 36000, 36000, 72000, 86400)
JITTER = 0.2
MAX_RETRY_AFTER_S = 86400.0
EXCERPT_STORED = 1000
MAX_CLAIM_ROUNDS = 20


def fan_out(*, session: Session, limit: int = 500) -> int:
    """Turn the oldest events not yet fanned out into one pending delivery per enabled webhook of their
    tenant that wants their type; returns how many events were handled."""
    stmt = select(Event).where(Event.fanned_out_at.is_(None)).order_by(Event.seq).limit(limit)
    if session.get_bind().dialect.name == "postgresql":
        # Replicas of the notifier take disjoint batches.
        stmt = stmt.with_for_update(skip_locked=True)
    events = list(session.execute(stmt).scalars())
    if not events:
        return 0
    tenants = {e.tenant_id for e in events}
    hooks = list(
        session.execute(
            select(Webhook.id, Webhook.tenant_id, Webhook.events).where(
                Webhook.tenant_id.in_(tenants), Webhook.enabled.is_(True)
            )
        )
    )
    now = utcnow()
    rows = [
        {
            "webhook_id": h.id,
            "tenant_id": e.tenant_id,
            "event_id": e.id,
            "event_type": e.type,
            "status": "pending",
            "attempts": 0,
            "next_attempt_at": now,
            "created_at": now,
            "event_at": e.created_at,
        }
        for e in events
        for h in hooks
        if h.tenant_id == e.tenant_id and (not h.events or e.type in h.events)
    ]
    if rows:
        session.execute(WebhookDelivery.__table__.insert(), rows)
    session.execute(update(Event).where(Event.seq.in_([e.seq for e in events])).values(fanned_out_at=now))
    return len(events)


def claim_due(
    *, session: Session, now: datetime, lease_s: float, limit: int = 200, per_webhook: int = 4
) -> list[int]:
    """Claim the deliveries due now (pending, their time come, not claimed or their claim run out)
    for `lease_s`; returns their ids. The guarded UPDATE lets one claimant have each.

    At most `per_webhook` deliveries of one webhook are in flight at once, so a slow receiver holds
    that many of the notifier's threads, not all of them, and the others' deliveries go on. The
    webhooks at their limit are skipped in the index, so a long backlog of one does not hide the
    others' deliveries from this pass."""
    in_flight: dict[str, int] = {
        webhook_id: n
        for webhook_id, n in session.execute(
            select(WebhookDelivery.webhook_id, func.count())
            .where(WebhookDelivery.claimed_until >= now, WebhookDelivery.status == "pending")
            .group_by(WebhookDelivery.webhook_id)
        ).tuples()
    }
    full = sorted(w for w, n in in_flight.items() if n >= per_webhook)
    due = and_(
        WebhookDelivery.status == "pending",
        WebhookDelivery.next_attempt_at <= now,
        or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now),
    )
    room = {w: per_webhook - n for w, n in in_flight.items()}
    ids: list[int] = []
    # Deliveries fanned out together are due at the same instant and sit in the index by webhook:
    # each round takes what the webhooks it meets have room for, then looks past the ones it filled.
    for _ in range(MAX_CLAIM_ROUNDS):
        stmt = select(WebhookDelivery.id, WebhookDelivery.webhook_id).where(due)
        if full:
            stmt = stmt.where(WebhookDelivery.webhook_id.not_in(full))
        rows = session.execute(stmt.order_by(WebhookDelivery.next_attempt_at).limit(limit)).all()
        for delivery_id, webhook_id in rows:
            if room.setdefault(webhook_id, per_webhook) > 0 and delivery_id not in ids:
                room[webhook_id] -= 1
                ids.append(delivery_id)
                if room[webhook_id] == 0:
                    full.append(webhook_id)
        if len(rows) < limit or len(ids) >= limit:
            break
    ids = ids[:limit]
    if not ids:
        return []
    claimed = session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(ids), due)
        .values(claimed_until=now + timedelta(seconds=lease_s))
        .returning(WebhookDelivery.id)
    ).scalars()
    return sorted(claimed)


def claim_next(*, session: Session, webhook_id: str, now: datetime, lease_s: float) -> int | None:
    """Claim the oldest due delivery of one webhook, for the thread that just settled one of its
    deliveries to send next: its in-flight count stays where it was, and a busy webhook's deliveries
    follow one another without waiting for the notifier's next pass. None when none is due."""
    due = and_(
        WebhookDelivery.webhook_id == webhook_id,
        WebhookDelivery.status == "pending",
        WebhookDelivery.next_attempt_at <= now,
        or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now),
    )
    oldest = select(WebhookDelivery.id).where(due).order_by(WebhookDelivery.next_attempt_at).limit(1)
    if session.get_bind().dialect.name == "postgresql":
        # Two threads of one webhook take two deliveries, not the same one.
        oldest = oldest.with_for_update(skip_locked=True)
    return session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == oldest.scalar_subquery(), due)
        .values(claimed_until=now + timedelta(seconds=lease_s))
        .returning(WebhookDelivery.id)
    ).scalar_one_or_none()


@dataclass(frozen=True)
class Outgoing:
    """A claimed delivery, ready to send: what `webhook_http.send` needs."""

    delivery_id: int
    webhook_id: str
    url: str
    msg_id: str
    body: bytes
    secrets: list[str]


def outgoing(*, session: Session, delivery_id: int, now: datetime, public_url: str | None) -> Outgoing | None:
    """The request a claimed, still pending delivery makes; None if there is nothing to send."""
    row = session.execute(
        select(WebhookDelivery, Webhook, Event)
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .join(Event, Event.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.id == delivery_id)
    ).first()
    if row is None:
        return None
    delivery, hook, ev = row
    if delivery.status != "pending" or not hook.enabled:
        return None
    return Outgoing(
        delivery_id=delivery.id,
        webhook_id=hook.id,
        url=hook.url,
        msg_id=ev.id,
        body=render(ev.type, dict(ev.data), ev.created_at, public_url),
        secrets=signing_secrets(hook, now),
    )


def retry_delay_s(
    attempts: int, clock: Clock, retry_after_s: float | None, rng: random.Random
) -> float | None:
    """Wall seconds until the next try after `attempts` failed ones; None when the schedule is spent."""
    if attempts > len(RETRY_SCHEDULE_S):
        return None
    base = clock.to_wall(RETRY_SCHEDULE_S[attempts - 1])
    delay = base * (1 + rng.uniform(-JITTER, JITTER))
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, MAX_RETRY_AFTER_S))
    return delay


class DeliveryResult(TypedDict):
    status: str
    disabled: bool


def record_outcome(
    *,
    session: Session,
    delivery_id: int,
    outcome: webhook_http.Outcome,
    now: datetime,
    clock: Clock,
    disable_after_s: float,
    rng: random.Random | None = None,
) -> DeliveryResult | None:
    """Write what a try got: success ends the delivery; a failure schedules the next try or, with the
    schedule spent, fails it; a 410 (the receiver is gone) fails it and disables the webhook, as does
    failing every delivery for `disable_after_s` (cluster seconds). None if the delivery was no longer
    pending (settled by another try)."""
    delivery = session.execute(
        select(WebhookDelivery).where(WebhookDelivery.id == delivery_id).with_for_update()
    ).scalar_one_or_none()
    if delivery is None or delivery.status != "pending":
        return None
    delivery.attempts += 1
    delivery.last_attempt_at = now
    delivery.last_status = outcome.status
    delivery.last_latency_ms = outcome.latency_ms
    delivery.last_error = outcome.error[:500] if outcome.error else None
    delivery.response_excerpt = outcome.excerpt[:EXCERPT_STORED] or None
    delivery.claimed_until = None
    disabled = False
    if outcome.ok:
        delivery.status = "succeeded"
        delivery.delivered_at = now
        # The common case touches the webhook's row only when it was failing.
        session.execute(
            update(Webhook)
            .where(Webhook.id == delivery.webhook_id, Webhook.failing_since.is_not(None))
            .values(failing_since=None)
        )
    else:
        hook = session.execute(
            select(Webhook).where(Webhook.id == delivery.webhook_id).with_for_update()
        ).scalar_one()
        if hook.failing_since is None:
            hook.failing_since = now
        if outcome.status == 410:
            delivery.status = "failed"
            disabled = _disable(session, hook, "the receiver answered 410 Gone", now)
        elif clock.cluster_since(hook.failing_since, now) >= disable_after_s:
            delivery.status = "failed"
            disabled = _disable(
                session, hook, f"every delivery failed for {disable_after_s / 86400:g} days", now
            )
        else:
            delay = retry_delay_s(delivery.attempts, clock, outcome.retry_after_s, rng or random.Random())
            if delay is None:
                delivery.status = "failed"
            else:
                delivery.next_attempt_at = now + timedelta(seconds=delay)
    return DeliveryResult(status=delivery.status, disabled=disabled)


def _disable(session: Session, hook: Webhook, reason: str, now: datetime) -> bool:
    if not hook.enabled:
        return False
    hook.enabled = False
    hook.disabled_reason = reason
    hook.updated_at = now
    # What was still waiting for it ends here; its owner can redeliver once it is fixed.
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.webhook_id == hook.id, WebhookDelivery.status == "pending")
        .values(status="failed", last_error=f"webhook disabled: {reason}"[:500], claimed_until=None)
    )
    emit(
        session,
        tenant_id=hook.tenant_id,
        type_="webhook.disabled",
        key=f"{hook.id}:{now.isoformat()}",
        data={"id": hook.id, "reason": reason, "url": f"/api/v1/webhooks/{hook.id}"},
        at=now,
    )
    return True
