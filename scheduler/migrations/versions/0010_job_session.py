"""A job names its session in a column of its own, indexed, so a session's page reads its jobs
by index instead of reading the JSON spec of every job its tenant ever ran
(scheduler/services/sessions/).

Revision ID: 0010_job_session
Revises: 0009_job_priority
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_job_session"
down_revision = "0009_job_priority"
branch_labels = None
depends_on = None

# The session a stored spec names, in each database's JSON dialect.
SPEC_SESSION = {
    "sqlite": "json_extract(spec, '$.session')",
    "postgresql": "spec->>'session'",
}


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("session_id", sa.String(length=40), nullable=True))
        batch_op.create_index("ix_jobs_session_id", ["session_id", "id"], unique=False)
    named = SPEC_SESSION[op.get_bind().dialect.name]
    op.execute(sa.text(f"UPDATE jobs SET session_id = {named} WHERE {named} IS NOT NULL"))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_session_id")
        batch_op.drop_column("session_id")
