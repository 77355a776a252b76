"""Inference endpoints (scheduler/services/endpoints.py): the endpoints and their per-minute stats,
the plans' endpoint limits, the replicas' holder jobs by endpoint, and the `invoke` key scope, which
every key that may submit gains (it could already start work; invoking an endpoint is less).

Revision ID: 0011_endpoints
Revises: 0010_job_session
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_endpoints"
down_revision = "0010_job_session"
branch_labels = None
depends_on = None

# Per plan kind: endpoints a tenant may keep, replicas one may scale to, IPUs all may hold at their
# maxima. Trials (the columns' server defaults) stay small.
LIMITS = {
    "standard": (20, 16, 256),
    "internal": (1000, 256, 65536),
}
LIVE_NAME = "state NOT IN ('stopped', 'failed')"


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_endpoints", sa.Integer(), server_default="2", nullable=False))
        batch_op.add_column(
            sa.Column("max_endpoint_replicas", sa.Integer(), server_default="2", nullable=False)
        )
        batch_op.add_column(sa.Column("max_endpoint_ipus", sa.Integer(), server_default="8", nullable=False))
    for kind, (endpoints, replicas, ipus) in LIMITS.items():
        op.execute(
            sa.text(
                "UPDATE plans SET max_endpoints = :e, max_endpoint_replicas = :r, max_endpoint_ipus = :i "
                "WHERE kind = :k"
            ).bindparams(e=endpoints, r=replicas, i=ipus, k=kind)
        )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("endpoint_id", sa.String(length=40), nullable=True))
        batch_op.create_index("ix_jobs_endpoint_id", ["endpoint_id", "state"], unique=False)
    op.create_table(
        "endpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("model", sa.String(length=40), nullable=False),
        sa.Column("model_name", sa.String(length=100), nullable=False),
        sa.Column("workload", sa.JSON(), nullable=False),
        sa.Column("machine", sa.String(length=16), nullable=False),
        sa.Column("ipus_per_replica", sa.Integer(), nullable=False),
        sa.Column("ipus_requested", sa.String(length=8), nullable=False),
        sa.Column("serve", sa.JSON(), nullable=False),
        sa.Column("signature", sa.JSON(), nullable=False),
        sa.Column("replicas_min", sa.Integer(), nullable=False),
        sa.Column("replicas_max", sa.Integer(), nullable=False),
        sa.Column("desired_replicas", sa.Integer(), nullable=False),
        sa.Column("autoscaling", sa.JSON(), nullable=False),
        sa.Column("batching", sa.JSON(), nullable=False),
        sa.Column("max_queue", sa.Integer(), nullable=False),
        sa.Column("cold_start_timeout_s", sa.Float(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=1000), nullable=True),
        sa.Column("above_since", sa.DateTime(), nullable=True),
        sa.Column("below_since", sa.DateTime(), nullable=True),
        sa.Column("idle_since", sa.DateTime(), nullable=True),
        sa.Column("degraded_since", sa.DateTime(), nullable=True),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("checked_at", sa.DateTime(), nullable=True),
        sa.Column("rolled_up_to", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("stopped_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_endpoints_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoints")),
    )
    op.create_index("ix_endpoints_tenant_id", "endpoints", ["tenant_id", "id"], unique=False)
    op.create_index("ix_endpoints_state", "endpoints", ["state"], unique=False)
    op.create_index(
        "uq_endpoints_live_name",
        "endpoints",
        ["tenant_id", "name"],
        unique=True,
        sqlite_where=sa.text(LIVE_NAME),
        postgresql_where=sa.text(LIVE_NAME),
    )
    op.create_table(
        "endpoint_stats",
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("minute", sa.DateTime(), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("rejected", sa.BigInteger(), nullable=False),
        sa.Column("cold_starts", sa.Integer(), nullable=False),
        sa.Column("p50_ms", sa.Float(), nullable=True),
        sa.Column("p90_ms", sa.Float(), nullable=True),
        sa.Column("p99_ms", sa.Float(), nullable=True),
        sa.Column("mean_batch", sa.Float(), nullable=True),
        sa.Column("queue_delay_ms", sa.Float(), nullable=True),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"], ["endpoints.id"], name=op.f("fk_endpoint_stats_endpoint_id_endpoints")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_endpoint_stats_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("endpoint_id", "minute", name=op.f("pk_endpoint_stats")),
    )
    op.create_index(op.f("ix_endpoint_stats_tenant_id"), "endpoint_stats", ["tenant_id"], unique=False)
    # Keys that may submit work may invoke endpoints (scopes are stored sorted, space separated).
    conn = op.get_bind()
    keys = sa.table("api_keys", sa.column("id", sa.String), sa.column("scopes", sa.String))
    for key_id, scopes in conn.execute(sa.select(keys.c.id, keys.c.scopes)).all():
        have = set(scopes.split())
        if "submit" in have and "invoke" not in have:
            conn.execute(
                keys.update().where(keys.c.id == key_id).values(scopes=" ".join(sorted(have | {"invoke"})))
            )


def downgrade() -> None:
    conn = op.get_bind()
    keys = sa.table("api_keys", sa.column("id", sa.String), sa.column("scopes", sa.String))
    for key_id, scopes in conn.execute(sa.select(keys.c.id, keys.c.scopes)).all():
        have = set(scopes.split())
        if "invoke" in have:
            # A key that could only invoke keeps `read`, the least that leaves it a valid key.
            rest = sorted(have - {"invoke"}) or ["read"]
            conn.execute(keys.update().where(keys.c.id == key_id).values(scopes=" ".join(rest)))
    op.drop_index(op.f("ix_endpoint_stats_tenant_id"), table_name="endpoint_stats")
    op.drop_table("endpoint_stats")
    op.drop_index("uq_endpoints_live_name", table_name="endpoints")
    op.drop_index("ix_endpoints_state", table_name="endpoints")
    op.drop_index("ix_endpoints_tenant_id", table_name="endpoints")
    op.drop_table("endpoints")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_endpoint_id")
        batch_op.drop_column("endpoint_id")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("max_endpoint_ipus")
        batch_op.drop_column("max_endpoint_replicas")
        batch_op.drop_column("max_endpoints")
