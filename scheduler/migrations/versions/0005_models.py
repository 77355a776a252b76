"""Tenants' own ONNX graphs (weights stripped, kept in the database) and each plan's quota of them.

Revision ID: 0005_models
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_models"
down_revision = "0004"
branch_labels = None
depends_on = None

_MIB = 2**20


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_models", sa.Integer(), server_default="10", nullable=False))
        batch_op.add_column(
            sa.Column("max_model_bytes", sa.BigInteger(), server_default=str(256 * _MIB), nullable=False)
        )
    # The default plans get quotas in proportion to what they are for; admin-made plans keep the defaults.
    for name, count, size in (
        ("trial-university", 25, 1024 * _MIB),
        ("trial-business", 25, 1024 * _MIB),
        ("standard", 200, 4096 * _MIB),
        ("internal", 10_000, 65_536 * _MIB),
    ):
        op.execute(
            sa.text(
                "UPDATE plans SET max_models = :count, max_model_bytes = :size WHERE name = :name"
            ).bindparams(count=count, size=size, name=name)
        )
    op.create_table(
        "models",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("graph", sa.LargeBinary(), nullable=False),
        sa.Column("graph_bytes", sa.BigInteger(), nullable=False),
        sa.Column("uploaded_bytes", sa.BigInteger(), nullable=False),
        sa.Column("weights_stripped_bytes", sa.BigInteger(), nullable=False),
        sa.Column("dims", sa.JSON(), nullable=False),
        sa.Column("elementwise", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_models_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("tenant_id", "name", name="uq_models_tenant_name"),
    )
    op.create_index(op.f("ix_models_tenant_id"), "models", ["tenant_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_models_tenant_id"), table_name="models")
    op.drop_table("models")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("max_model_bytes")
        batch_op.drop_column("max_models")
