"""Checkpoints and preemptible work: the checkpoints table, a job's `preemptible` and
`checkpoint_every_s`, an attempt's unbilled restore time and preemption deadline, and each plan's
preemptible discount and checkpoint retention (docs/checkpoints.md).

Revision ID: 0008_checkpoints
Revises: 0007_sessions
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_checkpoints"
down_revision = "0007_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("preemptible_discount", sa.Float(), server_default="0.5", nullable=False)
        )
        batch_op.add_column(
            sa.Column(
                "checkpoint_retention_s", sa.BigInteger(), server_default=str(7 * 86400), nullable=False
            )
        )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("preemptible", sa.Boolean(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("checkpoint_every_s", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("runtime_base_s", sa.Float(), server_default="0", nullable=False))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("unbilled_s", sa.Float(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("preempt_deadline", sa.DateTime(timezone=False), nullable=True))
    op.create_table(
        "checkpoints",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("executable_key", sa.String(length=80), nullable=False),
        sa.Column("machine_type", sa.String(length=16), nullable=False),
        sa.Column("cluster_s", sa.Float(), nullable=False),
        sa.Column("run_s", sa.Float(), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=False), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_checkpoints_attempt_id_attempts")
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("attempt_id", "step", name="uq_checkpoints_attempt_step"),
    )
    op.create_index("ix_checkpoints_job_id_id", "checkpoints", ["job_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_checkpoints_job_id_id", table_name="checkpoints")
    op.drop_table("checkpoints")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("preempt_deadline")
        batch_op.drop_column("unbilled_s")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("runtime_base_s")
        batch_op.drop_column("checkpoint_every_s")
        batch_op.drop_column("preemptible")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("checkpoint_retention_s")
        batch_op.drop_column("preemptible_discount")
