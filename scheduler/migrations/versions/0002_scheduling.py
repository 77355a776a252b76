"""Scheduling: each tenant's decayed fair-share usage, sampled by the scheduler.

Revision ID: 0002_scheduling
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_scheduling"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("fairshare_usage_ipu_s", sa.Float(), server_default="0", nullable=False))
        batch.add_column(
            sa.Column("fairshare_used_ipu_ms", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("fairshare_sampled_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("fairshare_sampled_at")
        batch.drop_column("fairshare_used_ipu_ms")
        batch.drop_column("fairshare_usage_ipu_s")
