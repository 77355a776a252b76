"""Request and answer bodies of the webhook, event and notification-settings routes
(api/routers/webhooks.py, api/routers/notification_settings.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from scheduler.jobspec import JSON_NUMBER
from scheduler.notify_models import Event, Webhook, WebhookDelivery
from scheduler.services.tenancy.notifications import EVENT_TYPES
from scheduler.text import NO_HIDDEN, OPTIONAL_TEXT
from scheduler.webhook_http import MAX_URL_LENGTH

EventType = Literal[EVENT_TYPES]  # type: ignore[valid-type]
WebhookUrl = Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL_LENGTH, pattern=NO_HIDDEN)]
WebhookDescription = Annotated[str, StringConstraints(max_length=500, pattern=OPTIONAL_TEXT)]
MAX_OVERLAP_S = 7 * 86400


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: WebhookUrl = Field(
        description="Where events are POSTed: http(s), at most 2,000 characters, resolving to public "
        "addresses only (unless the cloud allows private ones)."
    )
    events: list[EventType] = Field(
        default_factory=list, max_length=len(EVENT_TYPES), description="Event types sent; empty: every type."
    )
    description: WebhookDescription = ""


class WebhookChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: WebhookUrl | None = None
    events: list[EventType] | None = Field(None, max_length=len(EVENT_TYPES))
    description: WebhookDescription | None = None
    enabled: bool | None = Field(
        None, description="false pauses it; true enables it again (failures forgotten)."
    )


class RotateSecret(BaseModel):
    # Strict: `false` or "60" is not a number of seconds.
    model_config = ConfigDict(extra="forbid", strict=True)

    overlap_s: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_OVERLAP_S,
            strict=False,
            description="Wall seconds the old secret keeps signing beside the new one "
            "(both signatures sent).",
        ),
        JSON_NUMBER,
    ] = 86400


class WebhookOut(BaseModel):
    id: str
    url: str
    description: str
    events: list[str] = Field(description="Event types sent; empty: every type.")
    enabled: bool
    disabled_reason: str | None = None
    failing_since: datetime | None = Field(None, description="Every delivery since then failed.")
    previous_secret_until: datetime | None = Field(
        None, description="Until then the secret before the last rotation signs too."
    )
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, w: Webhook) -> WebhookOut:
        now_valid = w.previous_secret_until if w.previous_secret else None
        return cls(
            id=w.id,
            url=w.url,
            description=w.description,
            events=list(w.events),
            enabled=w.enabled,
            disabled_reason=w.disabled_reason,
            failing_since=w.failing_since,
            previous_secret_until=now_valid,
            created_at=w.created_at,
            updated_at=w.updated_at,
        )


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (`whsec_...`). Shown once: store it now.")

    @classmethod
    def created(cls, w: Webhook, secret: str) -> WebhookCreated:
        return cls(**WebhookOut.of(w).model_dump(), secret=secret)


class WebhookTest(BaseModel):
    """What the receiver answered a signed `webhook.ping`."""

    ok: bool = Field(description="It answered 2xx.")
    status: int | None = Field(None, description="Its HTTP status; null: no answer.")
    latency_ms: int
    body_excerpt: str = Field(description="The start of its answer.")
    error: str | None = None
    webhook_id_header: str = Field(description="The `webhook-id` the ping carried.")


class DeliveryOut(BaseModel):
    id: int
    webhook_id: str
    event_id: str = Field(description="The event's id: the `webhook-id` header of every try.")
    event_type: str
    status: Literal["pending", "succeeded", "failed"]
    attempts: int
    next_attempt_at: datetime | None = Field(None, description="When a pending delivery is tried next.")
    last_status: int | None = None
    last_error: str | None = None
    last_latency_ms: int | None = None
    response_excerpt: str | None = None
    created_at: datetime
    last_attempt_at: datetime | None = None
    delivered_at: datetime | None = None

    @classmethod
    def of(cls, d: WebhookDelivery) -> DeliveryOut:
        return cls(
            id=d.id,
            webhook_id=d.webhook_id,
            event_id=d.event_id,
            event_type=d.event_type,
            status=d.status,
            attempts=d.attempts,
            next_attempt_at=d.next_attempt_at if d.status == "pending" else None,
            last_status=d.last_status,
            last_error=d.last_error,
            last_latency_ms=d.last_latency_ms,
            response_excerpt=d.response_excerpt,
            created_at=d.created_at,
            last_attempt_at=d.last_attempt_at,
            delivered_at=d.delivered_at,
        )


class EventOut(BaseModel):
    id: str = Field(description="Deterministic: one per state change; the `webhook-id` of its deliveries.")
    type: str
    data: dict[str, Any] = Field(description="Thin: ids and API URLs; read the object for the rest.")
    created_at: datetime

    @classmethod
    def of(cls, e: Event) -> EventOut:
        return cls(id=e.id, type=e.type, data=dict(e.data), created_at=e.created_at)


JobMailEvent = Literal[
    "job.started", "job.succeeded", "job.failed", "job.cancelled", "job.preempted", "job.runtime_warning"
]
BudgetKind = Literal["actual", "forecast"]
# 60.0 is an integer in JSON Schema; `true` and "60" are not numbers (scheduler/jobspec.py, JSON_NUMBER).
Percent = Annotated[int, Field(ge=1, le=100, strict=False), JSON_NUMBER]


class NotificationSettingsOut(BaseModel):
    """A member's e-mail choices (the defaults until they change one)."""

    member_id: str
    job_events: list[JobMailEvent] = Field(description="Which of the tenant's job events are mailed to you.")
    budget_thresholds: list[int] = Field(
        description="Shares of the grant (%) at which you are mailed, once per threshold per grant."
    )
    budget_kinds: list[BudgetKind] = Field(
        description="`actual` (used) and/or `forecast` (used + reserved by queued and running work + the "
        "last 24 h's charge carried on at that rate to the grant's expiry)."
    )
    trial_mail: bool = Field(description="Trial warnings: 7 days and 1 day before it ends, and its end.")
    session_mail: bool = Field(description="Your sessions: ending soon (idle or at their maximum) and ended.")
    webhook_mail: bool = Field(description="Owners: a webhook of the tenant was disabled.")


class NotificationSettingsChange(BaseModel):
    """`PUT /api/v1/notification-settings`: a field left out (or null) keeps its value."""

    model_config = ConfigDict(extra="forbid", strict=True)

    job_events: list[JobMailEvent] | None = Field(None, max_length=6)
    budget_thresholds: list[Percent] | None = Field(
        None, max_length=10, description="At most 10, each 1-100."
    )
    budget_kinds: list[BudgetKind] | None = Field(None, max_length=2)
    trial_mail: bool | None = None
    session_mail: bool | None = None
    webhook_mail: bool | None = None
