"""Leader election among scheduler replicas, and fencing of the leader's writes.

The lease is one row. Taking it over bumps the epoch by compare-and-set; every write transaction
of the leader starts with `fence()`, an UPDATE that matches only while this replica still holds
the lease at its epoch. On PostgreSQL that UPDATE also locks the row until commit, so a takeover
waits for the old leader's transaction and then sees it renewed (or not): two leaders can never
both commit. On SQLite the write lock taken at BEGIN does the same.

Expiry is judged on the database's clock (services.clock), so replicas on hosts whose clocks
disagree still agree on when a lease ran out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

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
    if row.holder == holder and row.expires_at > now:
        renewed = session.execute(
            update(LeaderLease)
            .where(LeaderLease.name == name, LeaderLease.holder == holder, LeaderLease.epoch == row.epoch)
            .values(expires_at=expires)
        ).rowcount
        return Fence(name, holder, row.epoch) if renewed == 1 else None
    if row.expires_at > now:
        return None
    # Read before the UPDATE: the ORM writes the new epoch back into `row` when it matches.
    seen, epoch = row.epoch, row.epoch + 1
    taken = session.execute(
        update(LeaderLease)
        .where(LeaderLease.name == name, LeaderLease.epoch == seen, LeaderLease.expires_at <= now)
        .values(holder=holder, epoch=epoch, expires_at=expires)
    ).rowcount
    return Fence(name, holder, epoch) if taken == 1 else None


def fence(*, session: Session, fence: Fence, ttl_s: float) -> None:
    """Renew the lease inside the caller's transaction, or raise NotLeader."""
    now = db_now(session)
    renewed = session.execute(
        update(LeaderLease)
        .where(
            LeaderLease.name == fence.name,
            LeaderLease.holder == fence.holder,
            LeaderLease.epoch == fence.epoch,
            LeaderLease.expires_at > now,
        )
        .values(expires_at=now + timedelta(seconds=ttl_s))
    ).rowcount
    if renewed != 1:
        raise NotLeader(f"{fence.holder} no longer holds the {fence.name} lease at epoch {fence.epoch}")


def renew_held(*, session: Session, fence: Fence, ttl_s: float) -> None:
    """Renew the lease again at the end of a transaction that `fence()`d it at its start.

    That transaction holds the lease row's lock (SQLite: the write lock) since its fence, so nobody
    can have taken the lease over since: it is renewed from now, without asking whether it expired
    meanwhile. Without it, a pass that took longer than the lease (placing thousands of jobs) would
    leave its replica's lease expired at its own commit, and the next transaction would find it
    gone and start a new term, rebuilding everything, over and over.
    """
    now = db_now(session)
    session.execute(
        update(LeaderLease)
        .where(
            LeaderLease.name == fence.name,
            LeaderLease.holder == fence.holder,
            LeaderLease.epoch == fence.epoch,
        )
        .values(expires_at=now + timedelta(seconds=ttl_s))
    )


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
