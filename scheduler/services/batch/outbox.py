"""The dispatch outbox: attempts placed and committed, waiting to be published to their host agents.

The scheduler writes an outbox row in the transaction that places an attempt (so a placement is
never lost between the database and the broker); dispatch reads the rows not yet published, sends
them, and marks what was sent. A second publish is harmless: an agent takes an attempt by a
compare-and-set (docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select, update
from sqlalchemy.orm import Session

from scheduler.models import Attempt, OutboxMessage, Partition


def unpublished(*, session: Session, limit: int) -> Sequence[Row[Any]]:
    """Oldest first: `(id, queue, payload, publish_count, machine_type, ipu_ids)` of rows neither
    published nor acknowledged; the partition's type and IPUs say which queue serves it."""
    return session.execute(
        select(
            OutboxMessage.id,
            OutboxMessage.queue,
            OutboxMessage.payload,
            OutboxMessage.publish_count,
            Partition.machine_type,
            Partition.ipu_ids,
        )
        .join(Attempt, Attempt.id == OutboxMessage.attempt_id)
        .join(Partition, Partition.pk == Attempt.partition_pk)
        .where(OutboxMessage.published_at.is_(None), OutboxMessage.acked_at.is_(None))
        .order_by(OutboxMessage.id)
        .limit(limit)
    ).all()


def mark_published(*, session: Session, sent: Mapping[str, Sequence[int]], now: datetime) -> None:
    """Record the queue each row was sent to and when (the reconciler judges "published too long
    ago" from `now`, which the caller reads from the database's clock)."""
    for queue, ids in sent.items():
        session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id.in_(ids))
            .values(queue=queue, published_at=now, publish_count=OutboxMessage.publish_count + 1)
        )
