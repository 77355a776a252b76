"""Tenant names unique whatever their case: a unique index on lower(name) (issue 32 item 8).

Tenants already named alike but for case keep the oldest name as it is; each later one gets `-2`,
`-3` ... appended (cut to fit 100 characters), so the index can be built. Tenant names are ASCII
(api/schemas/common.py's TenantName), so SQLite's `lower` and PostgreSQL's agree.

Revision ID: 0015_hardening
Revises: 0014_arrays
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_hardening"
down_revision = "0014_arrays"
branch_labels = None
depends_on = None


def rename_duplicates(conn: sa.engine.Connection) -> list[tuple[str, str]]:
    """Give each tenant named like an older one but for case a free name; (id, new name) of each."""
    rows = conn.execute(sa.text("SELECT id, name FROM tenants ORDER BY created_at, id")).all()
    taken = {name.lower() for _, name in rows}
    seen: set[str] = set()
    renamed: list[tuple[str, str]] = []
    for tenant_id, name in rows:
        if name.lower() not in seen:
            seen.add(name.lower())
            continue
        n = 2
        while True:
            suffix = f"-{n}"
            candidate = name[: 100 - len(suffix)] + suffix
            if candidate.lower() not in taken:
                break
            n += 1
        taken.add(candidate.lower())
        seen.add(candidate.lower())
        conn.execute(
            sa.text("UPDATE tenants SET name = :name WHERE id = :id"), {"name": candidate, "id": tenant_id}
        )
        renamed.append((tenant_id, candidate))
    return renamed


def upgrade() -> None:
    rename_duplicates(op.get_bind())
    op.create_index("uq_tenants_name_lower", "tenants", [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    op.drop_index("uq_tenants_name_lower", table_name="tenants")
