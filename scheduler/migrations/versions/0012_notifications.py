"""Notifications: events (the outbox every webhook delivery starts from), webhooks, their deliveries,
and a plan's limit on webhooks (docs/notifications.md).

Revision ID: 0012_notifications
Revises: 0011_endpoints
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_notifications"
down_revision = "0011_endpoints"
branch_labels = None
depends_on = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_webhooks", sa.Integer(), server_default="10", nullable=False))

    op.create_table(
        "events",
        sa.Column("seq", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=160), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("fanned_out_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_events_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_events")),
        sa.UniqueConstraint("id", name=op.f("uq_events_id")),
    )
    op.create_index("ix_events_tenant_seq", "events", ["tenant_id", "seq"], unique=False)
    op.create_index("ix_events_fanned_out_at", "events", ["fanned_out_at", "seq"], unique=False)
    op.create_index("ix_events_created_at", "events", ["created_at"], unique=False)

    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("disabled_reason", sa.String(length=500), nullable=True),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("previous_secret", sa.String(length=100), nullable=True),
        sa.Column("previous_secret_until", sa.DateTime(), nullable=True),
        sa.Column("failing_since", sa.DateTime(), nullable=True),
        sa.Column("created_by", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_webhooks_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_index("ix_webhooks_tenant_id", "webhooks", ["tenant_id", "id"], unique=False)

    op.create_table(
        "webhook_deliveries",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("webhook_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=160), nullable=False),
        sa.Column("event_type", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("claimed_until", sa.DateTime(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("last_latency_ms", sa.Integer(), nullable=True),
        sa.Column("response_excerpt", sa.String(length=1000), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("event_at", sa.DateTime(), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["webhooks.id"],
            name=op.f("fk_webhook_deliveries_webhook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_webhook_deliveries_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["status", "next_attempt_at", "webhook_id", "claimed_until"],
        unique=False,
    )
    op.create_index(
        "ix_webhook_deliveries_webhook_due",
        "webhook_deliveries",
        ["webhook_id", "status", "next_attempt_at"],
        unique=False,
    )
    op.create_index(
        "ix_webhook_deliveries_claimed_until", "webhook_deliveries", ["claimed_until"], unique=False
    )
    op.create_index("ix_webhook_deliveries_webhook", "webhook_deliveries", ["webhook_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_webhook", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_claimed_until", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_webhook_due", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhooks_tenant_id", table_name="webhooks")
    op.drop_table("webhooks")
    op.drop_index("ix_events_created_at", table_name="events")
    op.drop_index("ix_events_fanned_out_at", table_name="events")
    op.drop_index("ix_events_tenant_seq", table_name="events")
    op.drop_table("events")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("max_webhooks")
