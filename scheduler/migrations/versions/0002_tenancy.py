"""Tenancy: one pending trial application per address, decisions recorded, key audit trail.

Revision ID: 0002_tenancy
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_tenancy"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trial_applications") as batch:
        batch.add_column(sa.Column("plan", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("decided_by", sa.String(length=40), nullable=True))
    op.create_index(
        "uq_trial_applications_pending_email",
        "trial_applications",
        ["email"],
        unique=True,
        sqlite_where=sa.text("status = 'pending'"),
        postgresql_where=sa.text("status = 'pending'"),
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("created_by", sa.String(length=40), nullable=True))
    op.create_index(op.f("ix_api_keys_member_id"), "api_keys", ["member_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_api_keys_member_id"), table_name="api_keys")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("created_by")
    op.drop_index("uq_trial_applications_pending_email", table_name="trial_applications")
    with op.batch_alter_table("trial_applications") as batch:
        batch.drop_column("decided_by")
        batch.drop_column("plan")
