"""Redis as an event bus: wake the scheduler on submit/finish, wake log followers on new lines.

Only hints travel here; losing one costs a tick of latency, never a job (the database is the truth).
"""

from __future__ import annotations

import logging
import threading
import time

import redis
import redis.asyncio as aioredis
from sqlalchemy import event
from sqlalchemy.orm import Session

from scheduler.settings import Settings, get_settings

log = logging.getLogger(__name__)

WAKE_CHANNEL = "ipucloud:wake"
# "<agent name> <attempt id>": the control plane ended an attempt that agent drives (a cancel, a
# preemption, a failed machine). Every agent listens and keeps what names it; one that misses a
# message finds out at its next look at the database.
STOP_CHANNEL = "ipucloud:agents:stop"
# "<agent name> <attempt id> <warning s>": the attempt is preempted; it checkpoints within that many
# cluster seconds and ends itself, else the scheduler stops it (scheduler.services.checkpoints).
PREEMPT_CHANNEL = "ipucloud:agents:preempt"


def job_channel(job_id: str) -> str:
    return f"ipucloud:job:{job_id}"


def redis_from_url(url: str, **kwargs: object) -> redis.Redis:
    return redis.Redis.from_url(url, **kwargs)


_client: redis.Redis | None = None
_lock = threading.Lock()


def get_redis(settings: Settings | None = None) -> redis.Redis:
    global _client
    with _lock:
        if _client is None:
            s = settings or get_settings()
            _client = redis_from_url(
                s.broker_url, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30
            )
        return _client


_async_client: aioredis.Redis | None = None


def get_async_redis(settings: Settings | None = None) -> aioredis.Redis:
    """For the API's event streams (one per event loop; the API runs one loop per process)."""
    global _async_client
    with _lock:
        if _async_client is None:
            s = settings or get_settings()
            _async_client = aioredis.Redis.from_url(s.broker_url, socket_connect_timeout=5)
        return _async_client


def reset_redis() -> None:
    global _client, _async_client
    with _lock:
        if _client is not None:
            _client.close()
        _client = None
        _async_client = None


def publish(channel: str, message: str) -> None:
    try:
        get_redis().publish(channel, message)
    except redis.RedisError as exc:
        log.warning("could not publish %s on %s: %s", message, channel, exc)


def wake_scheduler(reason: str) -> None:
    publish(WAKE_CHANNEL, reason)


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
    covers every request that asked in between (a scheduler pass takes longer than that anyway)."""

    def __init__(self, reason: str, interval_s: float = 0.01) -> None:
        self.reason = reason
        self.interval_s = interval_s
        self._wanted = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"wake-{reason}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            wake_scheduler(self.reason)
            time.sleep(self.interval_s)
