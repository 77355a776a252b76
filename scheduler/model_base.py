"""What every table of the database shares: the declarative base with its naming convention, the
UTC timestamp column type and the 64-bit key type. ``models.py`` and ``notify_models.py`` both build
on it, so neither needs the other to define its tables.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import BigInteger, DateTime, Integer, MetaData, Table, TypeDecorator
from sqlalchemy.orm import DeclarativeBase

# Auto-incrementing 64-bit keys: SQLite only auto-increments a column declared INTEGER.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, stored naive-UTC so SQLite compares them as text correctly."""

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use utcnow()")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    # Every model here is mapped to one Table (no joined or selectable mappings), which the batched
    # Core statements of the services use directly.
    __table__: ClassVar[Table]
