"""A job's and a plan's opt-out of preemption, `never_preempt` (issue 31, docs/scheduling.md): such a
job is never stopped for other work and is charged what it would be without the flag.

Jobs and plans stored before this keep being preemptible only as they were (the column defaults to
false).

Revision ID: 0017_never_preempt
Revises: 0016_array_idem
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_never_preempt"
down_revision = "0016_array_idem"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("never_preempt", sa.Boolean(), server_default="0", nullable=False))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("never_preempt", sa.Boolean(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("never_preempt")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("never_preempt")
