"""The migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from scheduler.migrate import head_revision, is_up_to_date
from scheduler.models import Base


def test_models_match_migrations(db: Any) -> None:
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


def test_database_is_at_head(db: Any) -> None:
    assert head_revision()
    assert is_up_to_date(db.engine)
