"""Apply and check Alembic migrations from code (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from scheduler.db import make_engine, normalise_url

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "heads") -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def head_revision() -> str:
    """The revision(s) the code needs, e.g. `0003` (or `0002a+0002b` while branches are unmerged)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return "+".join(sorted(ScriptDirectory.from_config(cfg).get_heads()))


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        heads = MigrationContext.configure(conn).get_current_heads()
    return "+".join(sorted(heads)) if heads else None


def is_up_to_date(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()
