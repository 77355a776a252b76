"""Machine types as data and a fleet that changes while it runs: machines know their unit's layout
(POD64, POD16, server), server model and whether they were retired; plans may set per-type rates and
restrict types; a job that may run on several types keeps what each would need; attempts and meter
events keep the type and rate they were billed at; attempts keep how long their job waited.

Revision ID: 0005_fleet
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_fleet"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("machines", schema=None) as batch_op:
        batch_op.add_column(sa.Column("layout", sa.String(16), server_default="pod64", nullable=False))
        batch_op.add_column(sa.Column("model", sa.String(16), nullable=True))
        batch_op.add_column(sa.Column("retired_at", sa.DateTime(timezone=False), nullable=True))
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rates", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("machine_types", sa.JSON(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("options", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("prefer", sa.String(8), server_default="time", nullable=False))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rate", sa.Float(), server_default="1.0", nullable=False))
        batch_op.add_column(sa.Column("queue_wait_s", sa.Float(), nullable=True))
    with op.batch_alter_table("meter_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("machine_type", sa.String(16), nullable=True))
        batch_op.add_column(sa.Column("rate", sa.Float(), server_default="1.0", nullable=False))
        batch_op.add_column(sa.Column("raw_ipu_ms", sa.BigInteger(), nullable=True))
    # What was billed before rates existed was billed at 1.0 on the attempt's type.
    op.execute(
        "UPDATE meter_events SET raw_ipu_ms = ipu_ms, machine_type = "
        "(SELECT attempts.machine_type FROM attempts WHERE attempts.id = meter_events.attempt_id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("meter_events", schema=None) as batch_op:
        batch_op.drop_column("raw_ipu_ms")
        batch_op.drop_column("rate")
        batch_op.drop_column("machine_type")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("queue_wait_s")
        batch_op.drop_column("rate")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("prefer")
        batch_op.drop_column("options")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("machine_types")
        batch_op.drop_column("rates")
    with op.batch_alter_table("machines", schema=None) as batch_op:
        batch_op.drop_column("retired_at")
        batch_op.drop_column("model")
        batch_op.drop_column("layout")
