"""Redis as an event bus: wake the scheduler on submit/finish, wake log followers on new lines.

Only hints travel here; losing one costs a tick of latency, never a job (the database is the truth).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis
from sqlalchemy import event
from sqlalchemy.orm import Session

from scheduler import runtime

log = logging.getLogger(__name__)

WAKE_CHANNEL = "ipucloud:wake"
# "<agent name> <attempt id>": the control plane ended an attempt that agent drives (a cancel, a
# preemption, a failed machine). Every agent listens and keeps what names it; one that misses a
# message finds out at its next look at the database.
STOP_CHANNEL = "ipucloud:agents:stop"
# "<agent name> <attempt id> <warning s> [<why>]": the attempt is preempted; it checkpoints within
# that many cluster seconds and ends itself, else the scheduler stops it
# (scheduler.services.batch.checkpoints).
# `why` (the rest of the line) is what its owner is told, e.g. "preempted for your job job_...".
PREEMPT_CHANNEL = "ipucloud:agents:preempt"


def job_channel(job_id: str) -> str:
    return f"ipucloud:job:{job_id}"


def scoped(channel: str, client: object) -> str:
    """`channel` as it is named on `client`'s database.

    Redis pub/sub ignores the database number: a message published while connected to database 2
    reaches subscribers connected to database 5. Two clouds sharing one Redis server on different
    databases (CI's test workers, or a staging and a production cloud) would then hear each other's
    stop and preemption notices, which name agents and attempt ids both clouds have ("w1@vm 1"),
    and an agent would stop driving an attempt its own cloud never ended. So every channel carries
    the database number of the connection it is used on.
    """
    pool = getattr(client, "connection_pool", None)
    db = pool.connection_kwargs.get("db", 0) if pool is not None else 0
    return f"{channel}@{db}"


def redis_from_url(url: str, **kwargs: object) -> redis.Redis:
    return redis.Redis.from_url(url, **kwargs)


def publish(channel: str, message: str, client: redis.Redis | None = None) -> None:
    """Publish a hint on `client`, by default the process's runtime's (scheduler/runtime.py)."""
    try:
        client = client or runtime.current().redis
        client.publish(scoped(channel, client), message)
    except redis.RedisError as exc:
        log.warning("could not publish %s on %s: %s", message, channel, exc)


def wake_scheduler(reason: str, client: redis.Redis | None = None) -> None:
    publish(WAKE_CHANNEL, reason, client)


_AFTER_COMMIT = "ipucloud.after_commit"


def publish_after_commit(session: Session, channel: str, message: str) -> None:
    """Publish once the session's transaction has committed (and never if it rolls back): a hint
    about a change must not reach anyone before the change itself is durable."""
    pending = session.info.setdefault(_AFTER_COMMIT, [])
    if not pending:
        event.listen(session, "after_commit", _flush_after_commit, once=True)
        event.listen(session, "after_rollback", _drop_after_commit, once=True)
    pending.append((channel, message))


def _flush_after_commit(session: Session) -> None:
    for channel, message in session.info.pop(_AFTER_COMMIT, []):
        publish(channel, message)


def _drop_after_commit(session: Session) -> None:
    session.info.pop(_AFTER_COMMIT, None)


class CoalescingWaker:
    """Wakes the scheduler from a thread of its own: a hot path asks for a wake-up without waiting
    for Redis. A wake-up after a quiet spell is published at once; under load, one per `interval_s`
    covers every request that asked in between (a scheduler pass takes longer than that anyway).

    No wake-up asked for is dropped: one asked for while the previous is published, or during the
    interval after it, is published when the interval ends. The thread survives whatever publishing
    raises (a closed connection raises more than RedisError): if it died, every later wake-up of the
    process would be lost, each costing a submission a scheduler tick. `close` publishes what is
    still asked for, then ends the thread."""

    def __init__(
        self, reason: str, client: Callable[[], redis.Redis] | None = None, interval_s: float = 0.01
    ) -> None:
        self.reason = reason
        self.client = client
        self.interval_s = interval_s
        self._asked = False
        self._wanted = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"wake-{reason}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._asked = True
        self._wanted.set()

    def close(self, timeout: float = 5.0) -> None:
        self._closing.set()
        self._wanted.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            # Cleared before publishing: a wake() from here on is after this publication's start
            # and sets both again, so the next round publishes it.
            if self._asked:
                self._asked = False
                try:
                    wake_scheduler(self.reason, self.client() if self.client is not None else None)
                except Exception as exc:
                    log.warning("could not wake the scheduler (%s): %s", self.reason, exc)
            if self._closing.is_set():
                return
            self._closing.wait(self.interval_s)
