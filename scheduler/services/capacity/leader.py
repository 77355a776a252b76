"""Leader election among scheduler replicas, and fencing of the leader's writes.

The lease is one row. Taking it over bumps the epoch by compare-and-set; every write transaction
of the leader starts with `fence()`, an UPDATE that matches only while this replica still holds
the lease at its epoch. On PostgreSQL that UPDATE also locks the row until commit, so a takeover
waits for the old leader's transaction and then sees it renewed (or not): two leaders can never
both commit. On SQLite the write lock taken at BEGIN does the same.

Expiry only lets another replica take over; it does not by itself end a term. A leader whose
lease ran out while nobody took it (a pass longer than the lease, a pause) renews it at the same
epoch: every write is fenced by the epoch, and a takeover is a compare-and-set on it, so the old
leader's next fence fails the moment another replica leads. Ending the term on expiry alone made a
pass over tens of thousands of jobs, longer than the lease, start a new term (and rebuild the
allocator from every partition) at its own next transaction, over and over.

Expiry is judged on the database's clock (services.clock), so replicas on hosts whose clocks
disagree still agree on when a lease ran out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.db import changed
from scheduler.models import LeaderLease
from scheduler.services.clock import db_now

SCHEDULER_LEASE = "scheduler"


class NotLeader(Exception):
    """This replica lost the lease; whatever it was about to write is rolled back."""


@dataclass(frozen=True)
class Fence:
    name: str
    holder: str
    epoch: int


def try_acquire(*, session: Session, holder: str, ttl_s: float, name: str = SCHEDULER_LEASE) -> Fence | None:
    """Become leader if the lease is free or expired (or already ours). Returns our fence or None."""
    now = db_now(session)
    expires = now + timedelta(seconds=ttl_s)
    row = session.execute(
        select(LeaderLease).where(LeaderLease.name == name).execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if row is None:
        try:
            with session.begin_nested():
                session.execute(
                    insert(LeaderLease).values(name=name, holder=holder, epoch=1, expires_at=expires)
                )
        except IntegrityError:
            return None
        return Fence(name, holder, 1)
    if row.holder == holder:
        # Ours still (the holder is this process): renewed at the same epoch even if it ran out
        # meanwhile, since nobody took it over (a takeover replaces the holder and bumps the epoch).
        renewed = changed(
            session,
            update(LeaderLease)
            .where(LeaderLease.name == name, LeaderLease.holder == holder, LeaderLease.epoch == row.epoch)
            .values(expires_at=expires),
        )
        return Fence(name, holder, row.epoch) if renewed == 1 else None
    if row.expires_at > now:
        return None
    # Read before the UPDATE: the ORM writes the new epoch back into `row` when it matches.
    seen, epoch = row.epoch, row.epoch + 1
    taken = changed(
        session,
        update(LeaderLease)
        .where(LeaderLease.name == name, LeaderLease.epoch == seen, LeaderLease.expires_at <= now)
        .values(holder=holder, epoch=epoch, expires_at=expires),
    )
    return Fence(name, holder, epoch) if taken == 1 else None


def fence(*, session: Session, fence: Fence, ttl_s: float) -> None:
    """Renew the lease inside the caller's transaction, or raise NotLeader if another replica has
    taken it over (its epoch moved on)."""
    now = db_now(session)
    renewed = changed(
        session,
        update(LeaderLease)
        .where(
            LeaderLease.name == fence.name,
            LeaderLease.holder == fence.holder,
            LeaderLease.epoch == fence.epoch,
        )
        .values(expires_at=now + timedelta(seconds=ttl_s)),
    )
    if renewed != 1:
        raise NotLeader(f"{fence.holder} no longer holds the {fence.name} lease at epoch {fence.epoch}")


def release(*, session: Session, fence: Fence) -> None:
    """Step down at once (graceful shutdown) so the next replica need not wait out the lease."""
    session.execute(
        update(LeaderLease)
        .where(
            LeaderLease.name == fence.name,
            LeaderLease.holder == fence.holder,
            LeaderLease.epoch == fence.epoch,
        )
        .values(expires_at=db_now(session))
    )


def current(*, session: Session, name: str = SCHEDULER_LEASE) -> LeaderLease | None:
    return session.get(LeaderLease, name)
