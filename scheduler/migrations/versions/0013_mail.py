"""E-mail: the mail outbox, members' notification settings, trial claim links, which events were
mailed, and who submitted a job and what of it they asked to be mailed (docs/notifications.md).

Revision ID: 0013_mail
Revises: 0012_notifications
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_mail"
down_revision = "0012_notifications"
branch_labels = None
depends_on = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("mailed_at", sa.DateTime(), nullable=True))
    # What happened before e-mail existed is not mailed now.
    op.execute("UPDATE events SET mailed_at = created_at")
    op.create_index("ix_events_mailed_at", "events", ["mailed_at", "seq"], unique=False)

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("submitted_by", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("notify", sa.JSON(), nullable=True))

    op.create_table(
        "mail_messages",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("member_id", sa.String(length=40), nullable=True),
        sa.Column("to_addr", sa.String(length=254), nullable=False),
        sa.Column("to_name", sa.String(length=100), nullable=False),
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("html", sa.Text(), nullable=False),
        sa.Column("unsubscribe", sa.String(length=16), nullable=True),
        sa.Column("sensitive", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("claimed_until", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_mail_messages_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mail_messages")),
        sa.UniqueConstraint("key", name=op.f("uq_mail_messages_key")),
    )
    op.create_index(
        "ix_mail_messages_due", "mail_messages", ["status", "next_attempt_at", "claimed_until"], unique=False
    )
    op.create_index("ix_mail_messages_created_at", "mail_messages", ["created_at"], unique=False)

    op.create_table(
        "notification_settings",
        sa.Column("member_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("job_events", sa.JSON(), nullable=False),
        sa.Column("budget_thresholds", sa.JSON(), nullable=False),
        sa.Column("budget_kinds", sa.JSON(), nullable=False),
        sa.Column("trial_mail", sa.Boolean(), nullable=False),
        sa.Column("session_mail", sa.Boolean(), nullable=False),
        sa.Column("webhook_mail", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["member_id"],
            ["members.id"],
            name=op.f("fk_notification_settings_member_id_members"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_notification_settings_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("member_id", name=op.f("pk_notification_settings")),
    )
    op.create_index(
        op.f("ix_notification_settings_tenant_id"), "notification_settings", ["tenant_id"], unique=False
    )

    op.create_table(
        "claim_links",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("application_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("member_id", sa.String(length=40), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_claim_links_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_claim_links")),
    )
    op.create_index(op.f("ix_claim_links_application_id"), "claim_links", ["application_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_claim_links_application_id"), table_name="claim_links")
    op.drop_table("claim_links")
    op.drop_index(op.f("ix_notification_settings_tenant_id"), table_name="notification_settings")
    op.drop_table("notification_settings")
    op.drop_index("ix_mail_messages_created_at", table_name="mail_messages")
    op.drop_index("ix_mail_messages_due", table_name="mail_messages")
    op.drop_table("mail_messages")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("notify")
        batch_op.drop_column("submitted_by")
    op.drop_index("ix_events_mailed_at", table_name="events")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_column("mailed_at")
