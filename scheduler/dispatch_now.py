"""Publishing a placement from the process that made it, as its transaction commits.

The scheduler's dispatcher publishes outbox rows on its next iteration (scheduler/loop.py); a job in a
session is placed by its own submission (scheduler/services/sessions/jobs.py) and must not wait for that,
so its row is written already marked published and sent here once the submission commits. If the
broker refuses, nothing is lost: the reconciler republishes a row no agent took within
`IPUCLOUD_OUTBOX_RETRY_S` (scheduler/services/capacity/reconciler.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import event
from sqlalchemy.orm import Session

from scheduler import runtime
from scheduler.broker import TASK_NAME

log = logging.getLogger(__name__)

_PENDING = "ipucloud.dispatch_now"


def queue_for(machine_type: str, ipu_ids: Sequence[str]) -> str:
    """The most specific queue a live host agent serves for these IPUs (as the dispatcher picks)."""
    return runtime.current().dispatch()[1].queue_for(machine_type, ipu_ids)


def publish_after_commit(session: Session, deliveries: Sequence[tuple[int, int, str]]) -> None:
    """Send `(attempt id, epoch, queue)` to the host agents once the session's transaction commits."""
    if not deliveries:
        return
    pending = session.info.setdefault(_PENDING, [])
    if not pending:
        event.listen(session, "after_commit", _send, once=True)
        event.listen(session, "after_rollback", _drop, once=True)
    pending.extend(deliveries)


def _send(session: Session) -> None:
    deliveries = session.info.pop(_PENDING, [])
    if not deliveries:
        return
    celery, _ = runtime.current().dispatch()
    try:
        with celery.producer_or_acquire() as producer:
            for attempt_id, epoch, queue in deliveries:
                celery.send_task(TASK_NAME, args=[attempt_id, epoch], queue=queue, producer=producer)
    except Exception as exc:  # the reconciler republishes what no agent took
        log.warning(
            "publishing %d placements at once failed (the outbox retries them): %s", len(deliveries), exc
        )


def _drop(session: Session) -> None:
    session.info.pop(_PENDING, None)
