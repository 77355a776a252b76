"""Events and webhooks: what happened to a tenant, and its delivery, signed, to the tenant's receivers.

An event is written by `emit` in the transaction that made the state change (a job's end, a trial's
approval, a session's warning), with a deterministic id: one row per state change, however often the
transaction or a sweep is replayed. The events table is the outbox: the notifier (`workers/notifier.py`)
turns each new event into one delivery per subscribed webhook (`fan_out`), claims the deliveries that are
due (`claim_due`), sends each (`scheduler/webhook_http.py`) and records the outcome (`record_outcome`),
which schedules the next try or ends the delivery. Nothing about a delivery lives only in the broker or
in a worker's memory, so none is lost across a restart of either: a claim not settled by its deadline is
simply claimed again. The same `webhook-id` (the event's id) is sent on every try.

Thresholds of the grant and the trial's end are not state changes of one transaction (usage grows in
the agents' ticks, time passes): `sweep` writes them, with ids naming the threshold and the grant (or
the expiry), so each fires once and fires again when an admin changes the grant.
"""

from __future__ import annotations

import random
import secrets as secrets_module
from base64 import b64encode
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

import orjson
from sqlalchemy import and_, delete, event, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler import webhook_http
from scheduler.db import Database, changed
from scheduler.errors import Forbidden, InvalidRequest, LimitExceeded, NotFound
from scheduler.ids import new_id
from scheduler.models import SERVE_TASK, Job, MeterEvent, Plan, Tenant, utcnow
from scheduler.notify_models import Event, NotificationSetting, Webhook, WebhookDelivery
from scheduler.services.tenancy.scope import Scope, restrict, sees
from scheduler.settings import Settings

# Every event type. `endpoint.*` are written by inference endpoints (scheduler/services/endpoints.py);
# `trial.rejected` has no tenant to belong to, so it is only ever e-mailed to the applicant.
EVENT_TYPES = (
    "job.started",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.preempted",
    "job.runtime_warning",
    "session.ending_soon",
    "session.ended",
    "usage.threshold",
    "trial.approved",
    "trial.rejected",
    "trial.expiring",
    "trial.expired",
    "endpoint.ready",
    "endpoint.scaled",
    "endpoint.failed",
    "webhook.disabled",
)
PING = "webhook.ping"
# Jobs that are the machinery of something else (a session's hold, an endpoint's replica): their own
# events say what happened, not these jobs'.
HIDDEN_TASKS = frozenset({"session", SERVE_TASK})

# Share of the grant at which `usage.threshold` fires, actual (used) and forecast (used + reserved),
# besides every share a member of the tenant chose for their mail.
USAGE_THRESHOLDS = (50, 80, 100)
# `trial.expiring` this long before a trial's end.
TRIAL_WARNINGS = (("7d", timedelta(days=7)), ("1d", timedelta(days=1)))
EVENTS_KEPT = timedelta(days=30)

# The Standard Webhooks retry schedule (Svix's: immediately, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
# 10 h), stretched by 20 h and 24 h to about three days; cluster seconds, so `ipucloud up` and the
# tests compress it by their time scale. Each wait varies by up to a fifth, so the retries of a burst
# of failures do not all arrive together.
RETRY_SCHEDULE_S = (5, 300, 1800, 7200, 18000, 36000, 36000, 72000, 86400)
JITTER = 0.2
MAX_RETRY_AFTER_S = 86400.0
EXCERPT_STORED = 1000
MAX_CLAIM_ROUNDS = 20
MAX_EVENTS_FILTER = 50


def event_id(type_: str, key: str) -> str:
    return f"{type_}:{key}"[:160]


def _insert_ignore(session: Session, table: Any, rows: list[dict[str, Any]], key: str) -> None:
    ins = (
        postgresql.insert(table) if session.get_bind().dialect.name == "postgresql" else sqlite.insert(table)
    )
    session.execute(ins.on_conflict_do_nothing(index_elements=[key]), rows)


_PENDING = "ipucloud.events"


def emit(
    session: Session,
    *,
    tenant_id: str,
    type_: str,
    key: str,
    data: dict[str, Any],
    at: datetime | None = None,
) -> None:
    """Write an event in the caller's transaction, unless one of that id exists (a replay).

    The rows are inserted together as the transaction commits: an agent's tick or a scheduling pass
    that ends or starts hundreds of jobs adds one statement, not hundreds."""
    assert type_ in EVENT_TYPES, type_
    pending = session.info.setdefault(_PENDING, [])
    if not pending:
        event.listen(session, "before_commit", _insert_pending, once=True)
        event.listen(session, "after_rollback", _drop_pending, once=True)
    pending.append(
        {
            "id": event_id(type_, key),
            "tenant_id": tenant_id,
            "type": type_,
            "data": data,
            "created_at": at or utcnow(),
        }
    )


def _insert_pending(session: Session) -> None:
    rows = session.info.pop(_PENDING, [])
    if rows:
        session.flush()  # the rows they name (a tenant made in this transaction) first
        # The first row of an id stays (here and in the table); a repeat is dropped.
        unique: dict[str, dict[str, Any]] = {}
        for row in rows:
            unique.setdefault(row["id"], row)
        _insert_ignore(session, Event.__table__, list(unique.values()), "id")


def _drop_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)


def job_event(session: Session, job: Job, type_: str, *, key: str, **extra: Any) -> None:
    """A job's event: thin, its id and where to read it."""
    if job.task in HIDDEN_TASKS:
        return
    data = {"id": job.id, "name": job.name, "state": str(job.state), "url": f"/api/v1/jobs/{job.id}"}
    emit(session, tenant_id=job.tenant_id, type_=type_, key=key, data={**data, **extra})


# ------------------------------------------------------------------------------------------ webhooks


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


# ------------------------------------------------------------------------------------ events, deliveries


class EventView(TypedDict):
    id: str
    seq: int
    type: str
    data: dict[str, Any]
    created_at: datetime


def list_events(
    *, session: Session, scope: Scope, before: int | None, limit: int, types: Sequence[str] = ()
) -> list[Event]:
    """The scope's events of the last 30 days, newest first; `before` is the `seq` of the last one of
    the previous page."""
    stmt = (
        restrict(select(Event), Event.tenant_id, scope)
        .where(Event.created_at >= utcnow() - EVENTS_KEPT)
        .order_by(Event.seq.desc())
        .limit(limit)
    )
    if before is not None:
        stmt = stmt.where(Event.seq < before)
    if types:
        stmt = stmt.where(Event.type.in_(list(types)))
    return list(session.execute(stmt).scalars())


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


# ---------------------------------------------------------------------------------------- the notifier


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
    attempts: int, time_scale: float, retry_after_s: float | None, rng: random.Random
) -> float | None:
    """Wall seconds until the next try after `attempts` failed ones; None when the schedule is spent."""
    if attempts > len(RETRY_SCHEDULE_S):
        return None
    base = RETRY_SCHEDULE_S[attempts - 1] / time_scale
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
    time_scale: float,
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
        elif (now - hook.failing_since).total_seconds() * time_scale >= disable_after_s:
            delivery.status = "failed"
            disabled = _disable(
                session, hook, f"every delivery failed for {disable_after_s / 86400:g} days", now
            )
        else:
            delay = retry_delay_s(
                delivery.attempts, time_scale, outcome.retry_after_s, rng or random.Random()
            )
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


class SweepResult(TypedDict):
    usage: int
    trials: int
    runtime: int


# `job.runtime_warning` at these shares of a job's time limit (`max_runtime_s`).
RUNTIME_WARNINGS = (50, 80, 90)


def _runtime_warnings(session: Session, now: datetime) -> int:
    """Warn the owners of running jobs that have used 50, 80 or 90% of their time limit. The run
    time counts as the limit does: what earlier attempts ran since the owner last started or resumed
    the job, and this attempt's run after its restore (scheduler/services/batch/attempts.py, take_many)."""
    from scheduler.models import Attempt, AttemptState

    rows = session.execute(
        select(Attempt, Job)
        .join(Job, Job.id == Attempt.job_id)
        .where(
            Attempt.state == AttemptState.RUNNING,
            Attempt.gcd >= 0,
            Job.max_runtime_s.is_not(None),
            Job.task.not_in(list(HIDDEN_TASKS)),
        )
    ).all()
    due: list[tuple[Job, int, float]] = []
    for attempt, job in rows:
        timeline = attempt.timeline or {}
        if attempt.started_at is None or not timeline or not job.max_runtime_s:
            continue
        ran = (now - attempt.started_at).total_seconds() * float(timeline["scale"])
        before = max(0.0, float(timeline.get("run_base_s", 0.0)) - job.runtime_base_s)
        run_s = before + max(0.0, ran - attempt.unbilled_s)
        crossed = [pct for pct in RUNTIME_WARNINGS if 100 * run_s >= pct * job.max_runtime_s]
        if crossed:
            # Only the highest: a sweep that first sees 85% says 80%, not 50% and 80%.
            due.append((job, crossed[-1], run_s))
    keys = {event_id("job.runtime_warning", f"{job.id}:{job.attempts}:{pct}") for job, pct, _ in due}
    known: set[str] = set()
    for chunk in _chunks(sorted(keys), 500):
        known.update(session.execute(select(Event.id).where(Event.id.in_(chunk))).scalars())
    written = 0
    for job, pct, run_s in due:
        key = f"{job.id}:{job.attempts}:{pct}"
        if event_id("job.runtime_warning", key) in known:
            continue
        job_event(
            session,
            job,
            "job.runtime_warning",
            key=key,
            percent=pct,
            max_runtime_s=job.max_runtime_s,
            run_s=round(run_s, 3),
        )
        written += 1
    return written


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# The forecast's recent burn: the grant's charge over this much cluster time, as a rate.
BURN_WINDOW_CLUSTER_S = 86400.0


def forecast_ipu_ms(
    *,
    used_ipu_ms: int,
    reserved_ipu_ms: int,
    burn_ipu_ms: int,
    window_s: float,
    now: datetime,
    expires_at: datetime | None,
) -> int:
    """What the grant will have spent by its expiry: what is used, what queued and running work holds,
    and the recent burn (`burn_ipu_ms` charged over the last `window_s` wall seconds) carried on at the
    same rate until `expires_at`. A grant with no expiry, or one already past it, has no burn to come;
    a window of refunds burns nothing."""
    ahead_s = (expires_at - now).total_seconds() if expires_at is not None else 0.0
    burn = max(0, burn_ipu_ms) * max(0.0, ahead_s) / window_s if window_s > 0 else 0.0
    return used_ipu_ms + reserved_ipu_ms + int(burn)


def _recent_burn(session: Session, tenant_ids: list[str], since: datetime) -> dict[str, int]:
    """Each tenant's charge (rate x IPU-ms, refunds netted) metered since `since`."""
    found: dict[str, int] = {}
    for chunk in _chunks(tenant_ids, 500):
        rows = session.execute(
            select(MeterEvent.tenant_id, func.coalesce(func.sum(MeterEvent.ipu_ms), 0))
            .where(MeterEvent.tenant_id.in_(chunk), MeterEvent.at >= since)
            .group_by(MeterEvent.tenant_id)
        ).tuples()
        found.update((tenant_id, int(total)) for tenant_id, total in rows)
    return found


def sweep(*, session: Session, now: datetime, time_scale: float = 1.0) -> SweepResult:
    """Write the events no single transaction makes: jobs near their time limit, grant thresholds
    crossed and trials ending.
    Their ids name the threshold and the grant (or the expiry), so each is written once, and again
    after an admin changes the grant (or the expiry).

    A threshold's `forecast` counts used + reserved + the recent burn to the grant's expiry: the charge
    of the last 24 h of cluster time (`time_scale` cluster seconds a wall second) extrapolated at that
    rate to `expires_at`."""
    result = SweepResult(usage=0, trials=0, runtime=_runtime_warnings(session, now))
    # Members choose their own thresholds (scheduler/services/tenancy/mail.py): the events are written
    # at every threshold one of a tenant's members chose, as well as the defaults.
    chosen: dict[str, set[int]] = {}
    for tenant_id, thresholds in session.execute(
        select(NotificationSetting.tenant_id, NotificationSetting.budget_thresholds)
    ).tuples():
        chosen.setdefault(tenant_id, set()).update(int(t) for t in thresholds)
    lowest = min([*USAGE_THRESHOLDS, *(t for ts in chosen.values() for t in ts)]) / 100
    window_s = BURN_WINDOW_CLUSTER_S / time_scale
    columns = (Tenant.id, Tenant.quota_ipu_ms, Tenant.used_ipu_ms, Tenant.reserved_ipu_ms, Tenant.expires_at)
    live = (Tenant.quota_ipu_ms > 0, Tenant.status == "active")
    crossed = list(
        session.execute(
            select(*columns).where(
                *live,
                Tenant.used_ipu_ms + Tenant.reserved_ipu_ms >= Tenant.quota_ipu_ms * lowest,
            )
        ).all()
    )
    # A grant that expires may cross a forecast threshold on its burn alone: those below the lowest
    # threshold on used + reserved are read with their burn (only they: a grant with no expiry has none).
    below = list(
        session.execute(
            select(*columns).where(
                *live,
                Tenant.expires_at > now,
                Tenant.used_ipu_ms + Tenant.reserved_ipu_ms < Tenant.quota_ipu_ms * lowest,
            )
        ).all()
    )
    burning = [t.id for t in [*crossed, *below] if t.expires_at is not None and t.expires_at > now]
    burns = _recent_burn(session, burning, now - timedelta(seconds=window_s)) if burning else {}
    for t in [*crossed, *below]:
        burn = burns.get(t.id, 0)
        forecast = forecast_ipu_ms(
            used_ipu_ms=t.used_ipu_ms,
            reserved_ipu_ms=t.reserved_ipu_ms,
            burn_ipu_ms=burn,
            window_s=window_s,
            now=now,
            expires_at=t.expires_at,
        )
        for pct in sorted({*USAGE_THRESHOLDS, *chosen.get(t.id, ())}):
            for kind, amount in (("actual", t.used_ipu_ms), ("forecast", forecast)):
                if amount * 100 >= t.quota_ipu_ms * pct:
                    emit(
                        session,
                        tenant_id=t.id,
                        type_="usage.threshold",
                        key=f"{t.id}:{t.quota_ipu_ms}:{kind}:{pct}",
                        data={
                            "tenant_id": t.id,
                            "threshold_percent": pct,
                            "kind": kind,
                            "grant_ipu_hours": t.quota_ipu_ms / 3_600_000,
                            "used_ipu_hours": t.used_ipu_ms / 3_600_000,
                            "reserved_ipu_hours": t.reserved_ipu_ms / 3_600_000,
                            "recent_burn_ipu_hours": burn / 3_600_000,
                            "forecast_ipu_hours": forecast / 3_600_000,
                            "expires_at": t.expires_at.isoformat() if t.expires_at else None,
                            "url": "/api/v1/usage",
                        },
                        at=now,
                    )
                    result["usage"] += 1
    ending = session.execute(
        select(Tenant.id, Tenant.expires_at).where(
            Tenant.expires_at.is_not(None),
            Tenant.expires_at <= now + max(w for _, w in TRIAL_WARNINGS),
            Tenant.expires_at > now - timedelta(days=1),
        )
    ).all()
    for trial in ending:
        expires = trial.expires_at.isoformat()
        data = {"tenant_id": trial.id, "expires_at": expires, "url": "/api/v1/usage"}
        if trial.expires_at <= now:
            emit(
                session,
                tenant_id=trial.id,
                type_="trial.expired",
                key=f"{trial.id}:{expires}",
                data=data,
                at=now,
            )
            result["trials"] += 1
            continue
        for name, ahead in TRIAL_WARNINGS:
            if trial.expires_at - ahead <= now:
                emit(
                    session,
                    tenant_id=trial.id,
                    type_="trial.expiring",
                    key=f"{trial.id}:{expires}:{name}",
                    data={**data, "within": name},
                    at=now,
                )
                result["trials"] += 1
    return result


def prune(*, session: Session, now: datetime) -> int:
    """Forget events and settled deliveries older than 30 days."""
    cutoff = now - EVENTS_KEPT
    gone = changed(
        session,
        delete(WebhookDelivery).where(
            WebhookDelivery.created_at < cutoff, WebhookDelivery.status != "pending"
        ),
    )
    return gone + changed(
        session, delete(Event).where(Event.created_at < cutoff, Event.fanned_out_at.is_not(None))
    )
