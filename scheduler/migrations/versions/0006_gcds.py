"""Graph compile domains: a reserved partition with N GCDs runs up to N jobs at once, one per GCD.

Revision ID: 0006_gcds
Revises: 0005_agents
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_gcds"
down_revision = "0005_agents"
branch_labels = None
depends_on = None

LIVE = "state IN ('placed', 'running')"


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gcd", sa.Integer(), server_default="0", nullable=False))
    op.drop_index("uq_attempts_live_partition", table_name="attempts")
    op.create_index(
        "uq_attempts_live_partition_gcd",
        "attempts",
        ["partition_pk", "gcd"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_attempts_live_partition_gcd", table_name="attempts")
    op.create_index(
        "uq_attempts_live_partition",
        "attempts",
        ["partition_pk"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("gcd")
