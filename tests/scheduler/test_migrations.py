"""The migrations build exactly the schema the models describe, on SQLite and PostgreSQL."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from scheduler.migrate import head_revision, is_up_to_date
from scheduler.models import Base


def test_models_match_migrations(db: Any) -> None:
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


def test_database_is_at_head(db: Any) -> None:
    assert head_revision()
    assert is_up_to_date(db.engine)


def test_the_priority_migration_recovers_what_the_owner_gave(db: Any) -> None:
    """0009 turns a stored `priority + 1000 x plan priority` back into the owner's -100..100, on the
    database at hand (its rounding is the database's)."""
    expression = _migration("0009_job_priority").OWNERS_PART.replace("priority", "CAST(:p AS INTEGER)")
    # stored -> the owner's: plan priority 2 and 50, -2 and 50, 1 and -50, ...
    cases = {
        2050: 50,
        -1950: 50,
        950: -50,
        1000: 0,
        3100: 100,
        -3100: -100,
        1900: -100,
        -2000: 0,
        100_050: 50,
    }
    with db.engine.connect() as conn:
        for stored, owner in cases.items():
            assert conn.execute(text(f"SELECT {expression}"), {"p": stored}).scalar_one() == owner, stored


def _migration(name: str) -> Any:
    path = Path(__file__).resolve().parents[2] / "scheduler" / "migrations" / "versions" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"migration_{name}", path)
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    return migration


def test_the_session_migration_reads_the_session_a_stored_spec_names(db: Any) -> None:
    """0010 fills jobs.session_id from the JSON spec, in the database's own JSON dialect."""
    dialect = db.engine.dialect.name
    spec_value = "CAST(:spec AS JSON)" if dialect == "postgresql" else ":spec"
    expression = _migration("0010_job_session").SPEC_SESSION[dialect].replace("spec", spec_value)
    cases = {
        '{"name": "a", "session": "ses_0123abc"}': "ses_0123abc",
        '{"name": "a", "session": null}': None,
        '{"name": "a"}': None,
    }
    with db.engine.connect() as conn:
        for stored, session_id in cases.items():
            assert conn.execute(text(f"SELECT {expression}"), {"spec": stored}).scalar_one() == session_id
