"""The notification tables: events (the outbox every notification starts from), webhooks and their
deliveries. Mapped on `scheduler.models.Base`, which imports this module at its end so that the one
metadata (migrations, the test database's truncation) holds them; they live apart so the core models
stay readable (docs/notifications.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.model_base import Base, UTCDateTime, utcnow

# As scheduler.models spells it (SQLite auto-increments only a column declared INTEGER); repeated here
# because this module is imported while that one is still being read.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Event(Base):
    """One thing that happened to a tenant, written in the transaction that made it happen.

    `id` is deterministic (`job.succeeded:job_...`, one per state change), so a replayed transaction
    or a sweep that runs twice writes nothing twice, and it is the `webhook-id` every delivery and
    retry of it carries. `seq` orders the table for the notifier's fan-out and for cursor pages."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_tenant_seq", "tenant_id", "seq"),
        # What the notifier has not yet turned into deliveries.
        Index("ix_events_fanned_out_at", "fanned_out_at", "seq"),
        Index("ix_events_created_at", "created_at"),
        Index("ix_events_mailed_at", "mailed_at", "seq"),
    )

    seq: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(160), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    type: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    fanned_out_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # When the notifier turned it into e-mail (or decided none was due); None: not yet.
    mailed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Webhook(Base):
    """A tenant's receiver: a URL, the event types it wants (empty: all) and its signing secret.

    The secret is kept as sent (`whsec_...`): signing needs it, a hash would not do. It is shown once
    at creation and at rotation, and never read back by any route, log line or export. During a
    rotation's overlap `previous_secret` signs too, so a receiver may switch at its own pace."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_tenant_id", "tenant_id", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    url: Mapped[str] = mapped_column(String(2000))
    description: Mapped[str] = mapped_column(String(500), default="")
    events: Mapped[list[str]] = mapped_column(JSON)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    disabled_reason: Mapped[str | None] = mapped_column(String(500), nullable=True)
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100), nullable=True)
    previous_secret_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Since when every delivery has failed (None: the last one succeeded); disabled after long enough.
    failing_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_by: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class WebhookDelivery(Base):
    """One event on its way to one webhook: pending until a receiver answers 2xx (succeeded) or its
    retries run out (failed). `claimed_until` is the notifier's lease on a delivery in flight: one not
    done by then (its message or its worker lost) is published again."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # The notifier's claims read what is due in time order, skipping the webhooks that have all the
        # deliveries in flight they may have, from the index alone.
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at", "webhook_id", "claimed_until"),
        # A webhook's next due delivery (claimed as one settles), and what is in flight now.
        Index("ix_webhook_deliveries_webhook_due", "webhook_id", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_claimed_until", "claimed_until"),
        Index("ix_webhook_deliveries_webhook", "webhook_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    event_id: Mapped[str] = mapped_column(String(160))
    event_type: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | succeeded | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    last_latency_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response_excerpt: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # When the event's state change happened: a delivery's latency is counted from it.
    event_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class MailMessage(Base):
    """One e-mail in the outbox: written in the transaction that decided to send it (a trial's
    decision) or by the notifier from an event, then sent by the notifier (SMTP, or an `.eml` file
    under the data directory when no SMTP server is configured). `key` makes it once per cause:
    `event:<event id>:<member id>`, `claim:<application id>`. A claimed message whose sender died is
    claimed again when `claimed_until` passes, so none is lost (at least once).

    A `sensitive` message (a claim link) has its bodies blanked once sent: the link lives in the
    database only until it is on its way."""

    __tablename__ = "mail_messages"
    __table_args__ = (
        Index("ix_mail_messages_due", "status", "next_attempt_at", "claimed_until"),
        Index("ix_mail_messages_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(40))
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True)
    member_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    to_addr: Mapped[str] = mapped_column(String(254))
    to_name: Mapped[str] = mapped_column(String(100), default="")
    subject: Mapped[str] = mapped_column(String(300))
    text: Mapped[str] = mapped_column(Text)
    html: Mapped[str] = mapped_column(Text)
    # The settings category its List-Unsubscribe link turns off (None: a message the person asked for).
    unsubscribe: Mapped[str | None] = mapped_column(String(16), nullable=True)
    sensitive: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class NotificationSetting(Base):
    """A member's e-mail choices (`GET/PUT /api/v1/notification-settings`); a member without a row
    has the defaults (scheduler/services/tenancy/mail.py, DEFAULTS)."""

    __tablename__ = "notification_settings"

    member_id: Mapped[str] = mapped_column(ForeignKey("members.id", ondelete="CASCADE"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    job_events: Mapped[list[str]] = mapped_column(JSON)
    budget_thresholds: Mapped[list[int]] = mapped_column(JSON)
    budget_kinds: Mapped[list[str]] = mapped_column(JSON)
    trial_mail: Mapped[bool] = mapped_column(Boolean, default=True)
    session_mail: Mapped[bool] = mapped_column(Boolean, default=True)
    webhook_mail: Mapped[bool] = mapped_column(Boolean, default=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class ClaimLink(Base):
    """A single-use link mailed to an approved trial applicant: it shows the tenant's first key once
    and signs the applicant in. Only a hash of its token is kept."""

    __tablename__ = "claim_links"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    application_id: Mapped[str] = mapped_column(String(40), index=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    member_id: Mapped[str] = mapped_column(String(40))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
