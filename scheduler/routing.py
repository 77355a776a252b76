"""Worker routing: which Celery queue an attempt is published to.

A site runs workers next to its racks and tells them which work is theirs with Celery queues:

- `ipucloud`: the default queue; a worker on it runs anything.
- `m2000`, `bow`, `c2` (every type of `vipu.machine_types`): attempts on a partition of that type.
- `pod0003`, `srv0004`: attempts on a partition in that POD or IPU server (its unit id).

The dispatcher publishes each attempt to the most specific queue some live worker consumes: the
partition's pods in order, then its machine type, then `ipucloud`. To know which queues are
served, every worker registers its queues in Redis with an expiry and refreshes them every third
of `IPUCLOUD_ROUTING_TTL_S`; a worker host that dies or is cut off stops refreshing, its
registration lapses, and the next (re)publish of an attempt goes to a queue that is served now.
Both sides read the expiry on Redis's own clock (`TIME` inside a script), so skewed host clocks
cannot keep a dead worker's queues alive or drop a live one's.

A registered worker may still not take its messages: all its slots are busy, or its connection to
Redis is half-open after a network fault (kombu drops such a connection only after about a minute).
So each republish of an attempt nobody took widens the choice by one served level (pod, then machine
type, then default): locality is a preference held for one `IPUCLOUD_OUTBOX_RETRY_S`, never a
place where an attempt can wait forever.

Why registration rather than a static list of site queues in a setting: a static list cannot tell
that a site's only worker host is down, so its attempts would wait on that site's queue until a
human edits the setting. The price of registration is one small sorted set in Redis and a routing
view that lags a host's death by at most the TTL; the outbox reconciler republishes what was sent
into that window (after `IPUCLOUD_OUTBOX_RETRY_S`), so nothing stays on a queue nobody serves.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from vipu.topology import MachineType

if TYPE_CHECKING:
    import redis

log = logging.getLogger("ipucloud.routing")

# Settings validate queue names with this module, so it stays free of Celery: this is the same name
# as `scheduler.broker.DEFAULT_QUEUE` (a test holds them equal).
DEFAULT_QUEUE = "ipucloud"
MACHINE_QUEUES = tuple(t.value for t in MachineType)
ROUTING_KEY = "ipucloud:routing:queues"
_POD_QUEUE = re.compile(r"(pod|srv)\d{4}")
_SEP = "|"

# Registration and lookup both read Redis's clock, so the hosts' clocks never matter.
_REGISTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expires = now + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], expires, ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return #ARGV - 1
"""
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""


def is_routable(queue: str) -> bool:
    """Whether the dispatcher ever publishes to `queue` (a worker on any other queue idles)."""
    return queue == DEFAULT_QUEUE or queue in MACHINE_QUEUES or _POD_QUEUE.fullmatch(queue) is not None


def parse_queues(text: str) -> list[str]:
    """`IPUCLOUD_WORKER_QUEUES` as a list; raises ValueError naming a queue no attempt is sent to."""
    queues = [q.strip() for q in text.split(",") if q.strip()]
    if not queues:
        raise ValueError("names no queue; use e.g. `ipucloud` or `m2000,pod0003`")
    bad = [q for q in queues if not is_routable(q)]
    if bad:
        raise ValueError(
            f"names {', '.join(repr(q) for q in bad)}, which the dispatcher never publishes to; "
            f"use {DEFAULT_QUEUE!r}, a machine type ({', '.join(MACHINE_QUEUES)}), a pod (pod0003) or a "
            "server (srv0004)"
        )
    return list(dict.fromkeys(queues))


def candidates(machine_type: str, ipu_ids: Iterable[str]) -> list[str]:
    """Queues that may carry an attempt on this partition, most specific first."""
    # An IPU id starts with its unit's id (pod0003-m07-i2, srv0004-i13).
    units = sorted({ipu.split("-", 1)[0] for ipu in ipu_ids})
    return [*units, machine_type, DEFAULT_QUEUE]


def choose(options: Sequence[str], served: frozenset[str], widen: int = 0) -> str:
    """The most specific served option, or `widen` levels less specific (capped at the broadest).

    When none is served, the default queue: the attempt waits there and the reconciler republishes
    it, choosing again, until a worker for it registers."""
    live = [q for q in options if q in served]
    if not live:
        return DEFAULT_QUEUE
    return live[min(max(widen, 0), len(live) - 1)]


def register(client: redis.Redis, node: str, queues: Sequence[str], ttl_s: float) -> None:
    client.eval(_REGISTER, 1, ROUTING_KEY, repr(float(ttl_s)), *(f"{q}{_SEP}{node}" for q in queues))


def deregister(client: redis.Redis, node: str, queues: Sequence[str]) -> None:
    if queues:
        client.zrem(ROUTING_KEY, *(f"{q}{_SEP}{node}" for q in queues))


def live_registrations(client: redis.Redis) -> dict[str, set[str]]:
    """Queue -> the worker nodes that consume it and refreshed their registration in time."""
    served: dict[str, set[str]] = {}
    for raw in client.eval(_LIVE, 1, ROUTING_KEY):  # type: ignore[union-attr]
        member = raw.decode() if isinstance(raw, bytes) else str(raw)
        queue, _, node = member.partition(_SEP)
        served.setdefault(queue, set()).add(node)
    return served


class Router:
    """The dispatcher's view of served queues, read from Redis at most every `cache_s`."""

    def __init__(self, client: Callable[[], redis.Redis], cache_s: float = 1.0) -> None:
        self._client = client
        self.cache_s = cache_s
        self._served: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._warned: set[str] = set()

    def served(self) -> frozenset[str]:
        now = time.monotonic()
        if now - self._read_at >= self.cache_s:
            try:
                self._served = frozenset(live_registrations(self._client()))
            except RedisError as exc:
                # Publishing needs Redis too, so a stale view costs nothing that is not retried.
                log.warning("cannot read worker registrations (%s); routing on the last view", exc)
            self._read_at = now
        return self._served

    def invalidate(self) -> None:
        self._read_at = float("-inf")

    def queue_for(self, machine_type: str, ipu_ids: Iterable[str], widen: int = 0) -> str:
        """Where to publish an attempt; `widen` is how often it was published before, untaken."""
        options = candidates(machine_type, ipu_ids)
        served = self.served()
        queue = choose(options, served, widen)
        if queue not in served:
            key = ",".join(options)
            if key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "no live worker serves any of %s; publishing to %s until one registers", key, queue
                )
        else:
            self._warned.discard(",".join(options))
        return queue


class Registration:
    """A worker's registration of the queues it consumes, refreshed by a daemon thread."""

    def __init__(
        self, client: Callable[[], redis.Redis], node: str, queues: Sequence[str], ttl_s: float
    ) -> None:
        self._client = client
        self.node = node
        self.queues = list(queues)
        self.ttl_s = ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ipucloud-routing", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                register(self._client(), self.node, self.queues, self.ttl_s)
                if failing:
                    log.info("routing registration of %s restored", self.node)
                failing = False
            except RedisError as exc:
                # The registration then lapses, which is right: a worker that cannot reach Redis
                # cannot take messages from its queues either.
                if not failing:
                    log.warning("cannot refresh the routing registration of %s: %s", self.node, exc)
                failing = True
            self._stop.wait(self.ttl_s / 3)
        try:
            deregister(self._client(), self.node, self.queues)
        except RedisError as exc:
            log.warning("could not withdraw the routing registration of %s: %s", self.node, exc)

    def stop(self) -> None:
        """Withdraw (from the refresh thread, since this may run in a signal handler), so a worker
        shutting down is sent nothing new."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)
