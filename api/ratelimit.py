"""Per-key and per-address rate limits (the `limits` library), shared by API processes via Redis.

If Redis cannot be reached the limiter lets requests through: rate limiting protects the
service, it must not become the reason it is down.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import cast

from limits import RateLimitItem, parse
from limits.aio.storage import MemoryStorage as AsyncMemoryStorage
from limits.aio.storage import RedisStorage as AsyncRedisStorage
from limits.aio.storage import Storage as AsyncStorage
from limits.aio.strategies import FixedWindowRateLimiter as AsyncFixedWindowRateLimiter
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter

from scheduler.errors import RateLimited
from scheduler.settings import Settings

log = logging.getLogger("ipucloud.api")


def _storage_uri(url: str) -> str:
    if url.startswith("unix://"):
        return "redis+unix://" + url[len("unix://") :]
    return url


class RateLimits:
    """The limiters of one API app (`app.state.rate_limits`, reached by `RateLimitsDep` in
    api/deps.py), on its broker, made on first use. API processes share their counts through Redis.

    The hot path (every authenticated request) counts on the event loop with an asyncio Redis
    client, so a request needs no worker thread; one limiter per event loop, as asyncio clients
    belong to the loop that made them."""

    def __init__(self, settings: Settings) -> None:
        # The broker is read on first use, as the runtime's clients read it: an app made without
        # one (a schema dump, a test) works until something is counted.
        self._settings = settings
        self._lock = threading.Lock()
        self._limiter: FixedWindowRateLimiter | None = None
        self._async: dict[int, tuple[asyncio.AbstractEventLoop, _Coalescing]] = {}

    def limiter(self) -> FixedWindowRateLimiter:
        with self._lock:
            if self._limiter is None:
                storage: Storage
                uri = _storage_uri(self._settings.broker_url)
                try:
                    # A redis:// URI gives the synchronous storage this limiter needs.
                    storage = cast(Storage, storage_from_string(uri))
                except Exception as exc:  # no Redis configured at all: limit per process
                    log.warning("rate limits kept in memory: %s", exc)
                    storage = MemoryStorage()
                self._limiter = FixedWindowRateLimiter(storage)
            return self._limiter

    def _coalescing(self) -> _Coalescing:
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._async.get(id(loop))
            if entry is None or entry[0] is not loop:
                storage: AsyncStorage
                uri = _storage_uri(self._settings.broker_url)
                try:
                    storage = AsyncRedisStorage("async+" + uri, implementation="redispy", socket_timeout=2)
                except Exception as exc:  # no Redis configured at all: limit per process
                    log.warning("rate limits kept in memory: %s", exc)
                    storage = AsyncMemoryStorage()
                entry = self._async[id(loop)] = (loop, _Coalescing(AsyncFixedWindowRateLimiter(storage)))
            return entry[1]


class _Coalescing:
    """One event loop's hits, sent to Redis at most one round trip at a time per counter.

    Under 16 clients every request's own `INCRBY` round trip (the `limits` script through redis-py's
    asyncio client) was one of the largest costs of an API process after the submit writer
    (docs/performance.md). Hits on a counter that arrive while its round trip is out wait for it and
    go together in the next, as one `INCRBY n`: Redis applies it atomically, so the counts the n hits
    see are c - n + 1 ... c, exactly what n separate increments in arrival order would have returned,
    and the limit holds across API processes as before, with no tolerance. A hit waits at most for
    the one round trip ahead of it."""

    def __init__(self, limiter: AsyncFixedWindowRateLimiter) -> None:
        self.limiter = limiter
        self._open: dict[str, _Group] = {}  # per counter: the hits waiting for the next round trip
        self._out: dict[str, asyncio.Future[int]] = {}  # per counter: its round trip under way

    async def hit(self, item: RateLimitItem, identity: str) -> bool:
        key = item.key_for(identity)
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(asyncio.get_running_loop().create_future())
            # Its own task, not the request's: a client that goes away must not strand the others.
            group.task = asyncio.ensure_future(self._send(key, item, group))
        group.size += 1
        position = group.size
        count = await asyncio.shield(group.counted)
        return count - group.size + position <= item.amount

    async def _send(self, key: str, item: RateLimitItem, group: _Group) -> None:
        ahead = self._out.get(key)
        if ahead is not None:
            await asyncio.wait([ahead])  # its outcome is its own group's
        # Closed: hits from now on wait for the next round trip.
        del self._open[key]
        self._out[key] = group.counted
        try:
            count = await self.limiter.storage.incr(key, item.get_expiry(), amount=group.size)
            group.counted.set_result(count)
        except Exception as exc:
            group.counted.set_exception(exc)
            group.counted.exception()  # retrieved: the hits waiting re-raise it themselves
        except BaseException:  # cancelled (the loop shuts down): so are the hits waiting
            group.counted.cancel()
            raise
        finally:
            if self._out.get(key) is group.counted:
                del self._out[key]


@dataclass
class _Group:
    counted: asyncio.Future[int]  # the counter's value after the group's INCRBY
    size: int = 0
    task: asyncio.Future[None] | None = None


# Parsed limits ("100/minute"): a pure memo of immutable values, bounded by the few limit strings
# the settings and routes name, so it stays a module-level cache.
_items: dict[str, RateLimitItem] = {}


def _item(limit: str) -> RateLimitItem:
    item = _items.get(limit)
    if item is None:
        item = _items[limit] = parse(limit)
    return item


def _retry_after(lim: FixedWindowRateLimiter, item: RateLimitItem, identity: str) -> int:
    try:
        reset_at = lim.get_window_stats(item, identity).reset_time
        return max(1, math.ceil(reset_at - time.time()))
    except Exception:
        return int(item.get_expiry())


def check_rate(limits: RateLimits, identity: str, limit: str) -> None:
    """Count one request of `identity`; RateLimited (429 with Retry-After) once it is over `limit`."""
    item = _item(limit)
    lim = limits.limiter()
    try:
        allowed = lim.hit(item, identity)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s); letting the request through", exc)
        return
    if not allowed:
        retry = _retry_after(lim, item, identity)
        raise RateLimited(f"Rate limit of {limit} exceeded; retry in {retry} s.", retry_after=retry)


async def check_rate_async(limits: RateLimits, identity: str, limit: str) -> None:
    """`check_rate` without leaving the event loop (hits arriving together share a round trip,
    `_Coalescing`)."""
    item = _item(limit)
    try:
        coalescing = limits._coalescing()
        allowed = await coalescing.hit(item, identity)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s); letting the request through", exc)
        return
    if not allowed:
        try:
            stats = await coalescing.limiter.get_window_stats(item, identity)
            retry = max(1, math.ceil(stats.reset_time - time.time()))
        except Exception:
            retry = int(item.get_expiry())
        raise RateLimited(f"Rate limit of {limit} exceeded; retry in {retry} s.", retry_after=retry)


def check_not_exhausted(limits: RateLimits, identity: str, limit: str) -> None:
    """RateLimited if `identity` has no requests left in its window, without counting this one.

    For budgets that only failures spend (bad API keys from one address): a client that keeps
    failing is stopped before it reaches the database, while successful requests cost nothing.
    """
    item = _item(limit)
    lim = limits.limiter()
    try:
        allowed = lim.test(item, identity)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s); letting the request through", exc)
        return
    if not allowed:
        retry = _retry_after(lim, item, identity)
        raise RateLimited(f"Too many failed attempts; retry in {retry} s.", retry_after=retry)


def count_failure(limits: RateLimits, identity: str, limit: str) -> None:
    try:
        limits.limiter().hit(_item(limit), identity)
    except Exception as exc:
        log.warning("rate limiter unavailable (%s)", exc)
