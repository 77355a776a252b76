"""The one clock that leases are measured against: the database's.

A lease written by a worker on one host and judged expired by the scheduler on another must be
read against the same clock, or a host whose clock runs behind by more than a lease would see
every one of its attempts expire at once, and one that runs ahead would keep dead leases alive.
On PostgreSQL that clock is the server's `clock_timestamp()` (the time of the statement, not of
the transaction's start, so a transaction that waited on a lock still judges leases by now).
SQLite lives in one file on one host, so every process there already shares the host's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.models import utcnow


def db_now(session: Session) -> datetime:
    """The database's current time as an aware UTC datetime."""
    if session.get_bind().dialect.name != "postgresql":
        return utcnow()
    now = session.execute(select(func.clock_timestamp())).scalar_one()
    assert isinstance(now, datetime) and now.tzinfo is not None
    return now.astimezone(UTC)
