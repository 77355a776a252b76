"""A bound on each tenant's queued jobs, so admission need not count a long queue per submission;
outbox rows indexed by when they were taken, for the reconciler's view of which queues move.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queued_jobs_bound", sa.Integer(), server_default="0", nullable=False))
    # Start from the truth, so the bound holds for queues that exist already.
    op.execute(
        "UPDATE tenants SET queued_jobs_bound = "
        "(SELECT count(*) FROM jobs WHERE jobs.tenant_id = tenants.id AND jobs.state = 'queued')"
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_acked_at", ["acked_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_acked_at")
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("queued_jobs_bound")
