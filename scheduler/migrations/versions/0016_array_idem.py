"""An array's Idempotency-Key is unique per tenant, as a single job's is: two concurrent first
submissions of one array with one key cannot both be admitted (docs/sweeps.md).

Arrays stored before this with a key used twice by one tenant keep the oldest its key; the later
ones lose theirs (a replay of that key answers with the oldest), so the index can be built.

Revision ID: 0016_array_idem
Revises: 0015_hardening
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_array_idem"
down_revision = "0015_hardening"
branch_labels = None
depends_on = None


def clear_duplicate_keys(conn: sa.engine.Connection) -> list[str]:
    """Drop the key of every array that repeats an older array's (tenant, key); their ids."""
    rows = conn.execute(
        sa.text(
            "SELECT id, tenant_id, idempotency_key FROM arrays WHERE idempotency_key IS NOT NULL "
            "ORDER BY created_at, id"
        )
    ).all()
    seen: set[tuple[str, str]] = set()
    cleared: list[str] = []
    for array_id, tenant_id, key in rows:
        if (tenant_id, key) in seen:
            cleared.append(array_id)
        seen.add((tenant_id, key))
    for array_id in cleared:
        conn.execute(sa.text("UPDATE arrays SET idempotency_key = NULL WHERE id = :id"), {"id": array_id})
    return cleared


def upgrade() -> None:
    clear_duplicate_keys(op.get_bind())
    op.create_index(
        "uq_arrays_tenant_idempotency_key", "arrays", ["tenant_id", "idempotency_key"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_arrays_tenant_idempotency_key", table_name="arrays")
