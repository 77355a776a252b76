"""Initial schema: tenants, keys, fleet, partitions, jobs, attempts, outbox, meter events.

Revision ID: 0001
Revises:
Create Date: 2026-12-02 16:10:42.239938
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "executables",
        sa.Column("key", sa.String(length=80), nullable=False),
        sa.Column("machine_type", sa.String(length=16), nullable=False),
        sa.Column("compile_s", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_executables")),
    )
    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_leases")),
    )
    op.create_table(
        "machines",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("pod", sa.Integer(), nullable=False),
        sa.Column("rack", sa.Integer(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("machine_type", sa.String(length=16), nullable=False),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.Column("health_reason", sa.String(length=500), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machines")),
    )
    op.create_index(op.f("ix_machines_pod"), "machines", ["pod"], unique=False)
    op.create_table(
        "plans",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=False),
        sa.Column("quota_ipu_hours", sa.Float(), nullable=False),
        sa.Column("trial_days", sa.Integer(), nullable=True),
        sa.Column("max_partition_size", sa.Integer(), nullable=False),
        sa.Column("max_concurrent_jobs", sa.Integer(), nullable=False),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=False),
        sa.Column("max_runtime_s", sa.BigInteger(), nullable=False),
        sa.Column("idle_timeout_s", sa.BigInteger(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("fairshare_weight", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_plans")),
    )
    op.create_table(
        "ipus",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("machine_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("health", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["machine_id"], ["machines.id"], name=op.f("fk_ipus_machine_id_machines")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ipus")),
    )
    op.create_index(op.f("ix_ipus_machine_id"), "ipus", ["machine_id"], unique=False)
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("plan_name", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=True),
        sa.Column("organisation", sa.String(length=200), nullable=True),
        sa.Column("contact_email", sa.String(length=254), nullable=True),
        sa.Column("quota_ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("used_ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("reserved_ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("fairshare_weight", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["plan_name"], ["plans.name"], name=op.f("fk_tenants_plan_name_plans")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("model", sa.String(length=40), nullable=False),
        sa.Column("task", sa.String(length=16), nullable=False),
        sa.Column("ipus", sa.Integer(), nullable=False),
        sa.Column("ipus_requested", sa.String(length=8), nullable=False),
        sa.Column("machine_type", sa.String(length=16), nullable=True),
        sa.Column("partition_name", sa.String(length=64), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_runtime_s", sa.BigInteger(), nullable=True),
        sa.Column("predicted_runtime_s", sa.Float(), nullable=False),
        sa.Column("reserved_ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=1000), nullable=True),
        sa.Column("wait", sa.JSON(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("submit_response", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_jobs_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
    )
    op.create_index("ix_jobs_state_priority", "jobs", ["state", "priority"], unique=False)
    op.create_index("ix_jobs_tenant_created", "jobs", ["tenant_id", "id"], unique=False)
    op.create_table(
        "members",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("email", sa.String(length=254), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_members_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_members")),
        sa.UniqueConstraint("tenant_id", "email", name="uq_members_tenant_email"),
    )
    op.create_index(op.f("ix_members_tenant_id"), "members", ["tenant_id"], unique=False)
    op.create_table(
        "trial_applications",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("email", sa.String(length=254), nullable=False),
        sa.Column("organisation", sa.String(length=200), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("intended_use", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=1000), nullable=True),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_trial_applications_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trial_applications")),
    )
    op.create_index(op.f("ix_trial_applications_status"), "trial_applications", ["status"], unique=False)
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("lookup", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("scopes", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("member_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["member_id"], ["members.id"], name=op.f("fk_api_keys_member_id_members")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("lookup", name=op.f("uq_api_keys_lookup")),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"], unique=False)
    op.create_table(
        "job_events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("message", sa.String(length=2000), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"], unique=False)
    op.create_table(
        "partitions",
        sa.Column(
            "pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("machine_type", sa.String(length=16), nullable=False),
        sa.Column("gcds", sa.Integer(), nullable=False),
        sa.Column("reconfigurable", sa.Boolean(), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        sa.Column("ipu_ids", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("released_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_partitions_job_id_jobs")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_partitions_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_partitions")),
    )
    op.create_index(op.f("ix_partitions_job_id"), "partitions", ["job_id"], unique=False)
    op.create_index(op.f("ix_partitions_released_at"), "partitions", ["released_at"], unique=False)
    op.create_index(op.f("ix_partitions_tenant_id"), "partitions", ["tenant_id"], unique=False)
    op.create_index(
        "uq_partitions_live_name",
        "partitions",
        ["name"],
        unique=True,
        sqlite_where=sa.text("released_at IS NULL"),
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.create_table(
        "attempts",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("partition_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("machine_type", sa.String(length=16), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("placed_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("cluster_s", sa.Float(), nullable=False),
        sa.Column("metered_ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("reservation_used_ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("ticks", sa.Integer(), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=True),
        sa.Column("end_reason", sa.String(length=1000), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_attempts_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["partition_pk"], ["partitions.pk"], name=op.f("fk_attempts_partition_pk_partitions")
        ),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_attempts_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),
    )
    op.create_index(op.f("ix_attempts_job_id"), "attempts", ["job_id"], unique=False)
    op.create_index(op.f("ix_attempts_partition_pk"), "attempts", ["partition_pk"], unique=False)
    op.create_index("ix_attempts_state_lease", "attempts", ["state", "lease_expires_at"], unique=False)
    op.create_index(
        "uq_attempts_live_partition",
        "attempts",
        ["partition_pk"],
        unique=True,
        sqlite_where=sa.text("state IN ('placed', 'running')"),
        postgresql_where=sa.text("state IN ('placed', 'running')"),
    )
    op.create_table(
        "ipu_assignments",
        sa.Column("ipu_id", sa.String(length=40), nullable=False),
        sa.Column("partition_pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.ForeignKeyConstraint(["ipu_id"], ["ipus.id"], name=op.f("fk_ipu_assignments_ipu_id_ipus")),
        sa.ForeignKeyConstraint(
            ["partition_pk"], ["partitions.pk"], name=op.f("fk_ipu_assignments_partition_pk_partitions")
        ),
        sa.PrimaryKeyConstraint("ipu_id", name=op.f("pk_ipu_assignments")),
    )
    op.create_index(
        op.f("ix_ipu_assignments_partition_pk"), "ipu_assignments", ["partition_pk"], unique=False
    )
    op.create_table(
        "meter_events",
        sa.Column("id", sa.String(length=80), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("ipu_ms", sa.BigInteger(), nullable=False),
        sa.Column("partition_size", sa.Integer(), nullable=False),
        sa.Column("cluster_s", sa.Float(), nullable=False),
        sa.Column("workload", sa.String(length=40), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_meter_events_attempt_id_attempts")
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_meter_events_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_meter_events_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_meter_events")),
    )
    op.create_index(op.f("ix_meter_events_attempt_id"), "meter_events", ["attempt_id"], unique=False)
    op.create_index(op.f("ix_meter_events_job_id"), "meter_events", ["job_id"], unique=False)
    op.create_index("ix_meter_events_tenant_at", "meter_events", ["tenant_id", "at"], unique=False)
    op.create_table(
        "outbox",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("attempt_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("published_at", sa.DateTime(), nullable=True),
        sa.Column("publish_count", sa.Integer(), nullable=False),
        sa.Column("acked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], name=op.f("fk_outbox_attempt_id_attempts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
    )
    op.create_index(op.f("ix_outbox_attempt_id"), "outbox", ["attempt_id"], unique=False)
    op.create_index("ix_outbox_pending", "outbox", ["published_at", "acked_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_outbox_pending", table_name="outbox")
    op.drop_index(op.f("ix_outbox_attempt_id"), table_name="outbox")
    op.drop_table("outbox")
    op.drop_index("ix_meter_events_tenant_at", table_name="meter_events")
    op.drop_index(op.f("ix_meter_events_job_id"), table_name="meter_events")
    op.drop_index(op.f("ix_meter_events_attempt_id"), table_name="meter_events")
    op.drop_table("meter_events")
    op.drop_index(op.f("ix_ipu_assignments_partition_pk"), table_name="ipu_assignments")
    op.drop_table("ipu_assignments")
    op.drop_index(
        "uq_attempts_live_partition",
        table_name="attempts",
        sqlite_where=sa.text("state IN ('placed', 'running')"),
        postgresql_where=sa.text("state IN ('placed', 'running')"),
    )
    op.drop_index("ix_attempts_state_lease", table_name="attempts")
    op.drop_index(op.f("ix_attempts_partition_pk"), table_name="attempts")
    op.drop_index(op.f("ix_attempts_job_id"), table_name="attempts")
    op.drop_table("attempts")
    op.drop_index(
        "uq_partitions_live_name",
        table_name="partitions",
        sqlite_where=sa.text("released_at IS NULL"),
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.drop_index(op.f("ix_partitions_tenant_id"), table_name="partitions")
    op.drop_index(op.f("ix_partitions_released_at"), table_name="partitions")
    op.drop_index(op.f("ix_partitions_job_id"), table_name="partitions")
    op.drop_table("partitions")
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index(op.f("ix_api_keys_tenant_id"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_index(op.f("ix_trial_applications_status"), table_name="trial_applications")
    op.drop_table("trial_applications")
    op.drop_index(op.f("ix_members_tenant_id"), table_name="members")
    op.drop_table("members")
    op.drop_index("ix_jobs_tenant_created", table_name="jobs")
    op.drop_index("ix_jobs_state_priority", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("tenants")
    op.drop_index(op.f("ix_ipus_machine_id"), table_name="ipus")
    op.drop_table("ipus")
    op.drop_table("plans")
    op.drop_index(op.f("ix_machines_pod"), table_name="machines")
    op.drop_table("machines")
    op.drop_table("leader_leases")
    op.drop_table("executables")
