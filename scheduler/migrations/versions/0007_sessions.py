"""Sessions: a held partition that runs its owner's jobs at once (scheduler/services/sessions/).

Revision ID: 0007_sessions
Revises: 0006_gcds
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_sessions"
down_revision = "0006_gcds"
branch_labels = None
depends_on = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("max_session_s", sa.BigInteger(), server_default=str(6 * 3600), nullable=False)
        )
    # Paid and internal plans hold sessions longer than the trials' six hours.
    op.execute("UPDATE plans SET max_session_s = 86400 WHERE kind = 'standard'")
    op.execute("UPDATE plans SET max_session_s = 604800 WHERE kind = 'internal'")
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("ended_reason", sa.String(length=32), nullable=True),
        sa.Column("ended_detail", sa.String(length=1000), nullable=True),
        sa.Column("ipus", sa.Integer(), nullable=False),
        sa.Column("machine", sa.String(length=16), nullable=False),
        sa.Column("gcds", sa.Integer(), server_default="1", nullable=False),
        sa.Column("max_duration_s", sa.BigInteger(), nullable=False),
        sa.Column("idle_timeout_s", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("partition_pk", BigIntPK, nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("idle_since", sa.DateTime(), nullable=True),
        sa.Column("warned_for", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_sessions_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["partition_pk"], ["partitions.pk"], name=op.f("fk_sessions_partition_pk_partitions")
        ),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_sessions_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_index("ix_sessions_tenant_id", "sessions", ["tenant_id", "id"], unique=False)
    op.create_index("ix_sessions_state", "sessions", ["state"], unique=False)
    op.create_index(op.f("ix_sessions_job_id"), "sessions", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_job_id"), table_name="sessions")
    op.drop_index("ix_sessions_state", table_name="sessions")
    op.drop_index("ix_sessions_tenant_id", table_name="sessions")
    op.drop_table("sessions")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("max_session_s")
