"""Host agents: one lease per agent instead of one per attempt.

An attempt that runs is held by an agent incarnation (`attempts.worker` names the agent,
`attempts.agent_epoch` its incarnation) and is live exactly as long as that agent's lease in
`agents` is. Its run's timeline is written once when it is taken, so its progress can be derived
instead of written on every heartbeat; the per-attempt lease column goes.

Revision ID: 0005_agents
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_agents"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=False),
        sa.Column("running", sa.Integer(), server_default="0", nullable=False),
        sa.Column("ipus_busy", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_agents")),
    )
    op.create_index("ix_agents_state_lease", "agents", ["state", "lease_expires_at"], unique=False)
    # Attempts that were running under per-attempt leases have no agent to answer for them: they
    # are ended by the reconciler's orphan sweep (a running attempt with no live agent).
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("agent_epoch", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("timeline", sa.JSON(), nullable=True))
        batch_op.drop_index("ix_attempts_state_lease")
        batch_op.drop_column("lease_expires_at")
        batch_op.create_index("ix_attempts_agent", ["worker", "agent_epoch", "state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_attempts_agent")
        batch_op.add_column(sa.Column("lease_expires_at", sa.DateTime(), nullable=True))
        batch_op.create_index("ix_attempts_state_lease", ["state", "lease_expires_at"], unique=False)
        batch_op.drop_column("timeline")
        batch_op.drop_column("agent_epoch")
    op.drop_index("ix_agents_state_lease", table_name="agents")
    op.drop_table("agents")
