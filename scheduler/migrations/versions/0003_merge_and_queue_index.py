"""Merge the parallel 0002 branches; index jobs by (tenant, state) for admission's queued count.

Revision ID: 0003
Revises: 0002_reliability, 0002_scheduling, 0002_tenancy
"""

from alembic import op

revision = "0003"
down_revision = ("0002_reliability", "0002_scheduling", "0002_tenancy")
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_tenant_state", ["tenant_id", "state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_tenant_state")
