"""Job arrays and sweeps (one handle for many jobs), dependencies between jobs, singleton jobs, and a
plan's limit on an array's size (docs/sweeps.md).

Revision ID: 0014_arrays
Revises: 0013_mail
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_arrays"
down_revision = "0013_mail"
branch_labels = None
depends_on = None

# The default plans' array limits (scheduler/services/tenancy/tenants.py); an admin's own plans get 64.
_SIZES = {"trial": 64, "trial-university": 256, "trial-business": 256, "standard": 1000, "internal": 10000}


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_array_size", sa.Integer(), server_default="64", nullable=False))
    plans = sa.table("plans", sa.column("name", sa.String), sa.column("max_array_size", sa.Integer))
    for name, size in _SIZES.items():
        op.execute(plans.update().where(plans.c.name == name).values(max_array_size=size))

    op.create_table(
        "arrays",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("indices", sa.String(length=1000), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("sweep", sa.JSON(), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("reserved_at_submit_ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_arrays_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_arrays")),
    )
    op.create_index("ix_arrays_tenant_id", "arrays", ["tenant_id", "id"], unique=False)

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("array_id", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("params", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("depends_on", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("held_for", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("singleton", sa.Boolean(), server_default="0", nullable=False))
        batch_op.create_index("ix_jobs_array_id", ["array_id", "array_index"], unique=False)
        batch_op.create_index("ix_jobs_held_for", ["held_for"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_held_for")
        batch_op.drop_index("ix_jobs_array_id")
        batch_op.drop_column("singleton")
        batch_op.drop_column("held_for")
        batch_op.drop_column("depends_on")
        batch_op.drop_column("params")
        batch_op.drop_column("array_index")
        batch_op.drop_column("array_id")
    op.drop_index("ix_arrays_tenant_id", table_name="arrays")
    op.drop_table("arrays")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("max_array_size")
