"""A job stores the priority its owner gave (-100 to 100). Before, it stored that plus 1,000 times
its plan's priority at submission, so a later plan edit never reached queued jobs; the plan's
priority is now read at every scheduling pass (scheduler/services/batch/scheduling.py).

Revision ID: 0009_job_priority
Revises: 0008_checkpoints
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_job_priority"
down_revision = "0008_checkpoints"
branch_labels = None
depends_on = None

# The owner's part of a stored priority: it was within -100..100, so it is what is left after the
# nearest multiple of 1,000 (SQLite and PostgreSQL both round half away from zero).
OWNERS_PART = "priority - 1000 * CAST(ROUND(priority / 1000.0) AS INTEGER)"


def upgrade() -> None:
    op.execute(sa.text(f"UPDATE jobs SET priority = {OWNERS_PART} WHERE priority NOT BETWEEN -100 AND 100"))


def downgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE jobs SET priority = priority + 1000 * "
            "(SELECT plans.priority FROM tenants JOIN plans ON plans.name = tenants.plan_name "
            "WHERE tenants.id = jobs.tenant_id)"
        )
    )
