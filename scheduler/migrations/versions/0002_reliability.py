"""Reliability: a durable record of the reconciler's repairs (counted in the API's /metrics).

Revision ID: 0002_reliability
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_reliability"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reconciler_actions",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("partition_pk", sa.BigInteger(), nullable=True),
        sa.Column("leader_epoch", sa.BigInteger(), nullable=False),
        sa.Column("detail", sa.String(length=500), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconciler_actions")),
    )
    op.create_index("ix_reconciler_actions_action_at", "reconciler_actions", ["action", "at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_reconciler_actions_action_at", table_name="reconciler_actions")
    op.drop_table("reconciler_actions")
