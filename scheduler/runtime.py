"""One runtime object per process: the settings and everything built from them.

The API (its lifespan, `app.state.runtime`), the scheduler loop (`ipucloud scheduler`) and the host
agent (`workers/app.py`) each build a `Runtime` from their settings at start-up and close it at
shutdown. It holds the clock (cluster time against the wall clock, `scheduler/clock.py`) and what
used to be module-level singletons: the database, the Redis clients, the
Celery app and router for dispatching placements as their transaction commits, the cache of the
fleet's largest partitions, and the allocators the admin partition verbs place with (`allocators`).
Code that has the runtime passes what it needs explicitly; tests build a runtime of their own
instead of resetting private module attributes.

One process-wide default remains, `current()`: service code deep inside a transaction publishes
hints after commit (`scheduler.bus.publish_after_commit`, `scheduler.dispatch_now`), and Celery's
task entry points and signal handlers are module-level functions the worker calls with no
application object of ours. Threading a runtime through every service function for a best-effort
hint would change dozens of signatures for nothing, so those reach the runtime the process
installed at start-up (`install`). A process that installed none (a one-off CLI command, a script)
gets one built lazily from the environment's settings, as the former singletons were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from scheduler.clock import Clock
from scheduler.db import Database
from scheduler.settings import Settings, get_settings

if TYPE_CHECKING:
    from celery import Celery

    from scheduler.routing import Router
    from scheduler.services.capacity.fleet import Allocators


class CapacityCache:
    """The largest partition each machine type can form (`fleet.largest_by_type`), kept for a few
    seconds: admission asks on every submission, and units are added or retired rarely."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: tuple[float, dict[str, int]] | None = None

    def get(self, max_age_s: float) -> dict[str, int] | None:
        with self._lock:
            if self._value is None or time.monotonic() - self._value[0] >= max_age_s:
                return None
            return dict(self._value[1])

    def put(self, largest: dict[str, int]) -> None:
        with self._lock:
            self._value = (time.monotonic(), dict(largest))

    def forget(self) -> None:
        """After units were added or retired: the next admission reads the fleet again."""
        with self._lock:
            self._value = None


@dataclass(eq=False)
class Runtime:
    settings: Settings
    db: Database
    capacity: CapacityCache = field(default_factory=CapacityCache)
    # Cluster time against the wall clock (`scheduler/clock.py`), from `settings.time_scale`.
    clock: Clock = field(init=False)
    # What the layers above the scheduler build per process and hang here, keyed by its class (the
    # API's submission batcher, the host agent), which this module may not import.
    extras: dict[type, object] = field(default_factory=dict)
    # Built on first use: a process that never publishes never opens a connection (the clients
    # connect lazily anyway; the Celery app is not free to make).
    _redis: Redis | None = None
    _async_redis: AsyncRedis | None = None
    _dispatch: tuple[Celery, Router] | None = None
    _allocators: Allocators | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.clock = Clock.of(self.settings)

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, idle_tx_timeout_s: float | None = None
    ) -> Runtime:
        """`idle_tx_timeout_s`: the scheduler's long passes need more than the API's default."""
        s = settings or get_settings()
        timeout = s.db_idle_tx_timeout_s if idle_tx_timeout_s is None else idle_tx_timeout_s
        return cls(settings=s, db=Database(s.db_url, idle_tx_timeout_s=timeout))

    @property
    def redis(self) -> Redis:
        with self._lock:
            if self._redis is None:
                self._redis = Redis.from_url(
                    self.settings.broker_url,
                    socket_timeout=5,
                    socket_connect_timeout=5,
                    health_check_interval=30,
                )
            return self._redis

    def redis_client(self) -> Callable[[], Redis]:
        """The client as a callable, for what takes one (routing, the agent's listeners)."""
        return lambda: self.redis

    @property
    def async_redis(self) -> AsyncRedis:
        """For the API's event streams (the API runs one event loop per process)."""
        with self._lock:
            if self._async_redis is None:
                self._async_redis = AsyncRedis.from_url(self.settings.broker_url, socket_connect_timeout=5)
            return self._async_redis

    def dispatch(self) -> tuple[Celery, Router]:
        """The Celery app and router that publish placements made outside the scheduler's loop."""
        with self._lock:
            if self._dispatch is None:
                from scheduler.broker import make_celery
                from scheduler.routing import Router

                self._dispatch = (make_celery(self.settings), Router(self.redis_client()))
            return self._dispatch

    @property
    def allocators(self) -> Allocators:
        """The admin partition verbs' allocators (`fleet.Allocators`), made on first use."""
        with self._lock:
            if self._allocators is None:
                from scheduler.services.capacity.fleet import Allocators

                self._allocators = Allocators(self.clock)
            return self._allocators

    def close(self) -> None:
        self.db.dispose()
        with self._lock:
            if self._redis is not None:
                self._redis.close()
            self._redis = None
            self._async_redis = None
            self._dispatch = None


_current: Runtime | None = None
_current_lock = threading.Lock()


def install(runtime: Runtime | None) -> None:
    """Make `runtime` the process's default (at start-up; None at shutdown)."""
    global _current
    with _current_lock:
        _current = runtime


def current() -> Runtime:
    """The runtime this process installed; see the module's docstring for who may use it."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Runtime.from_settings()
        return _current


def close_current() -> None:
    """Close and forget the default runtime (a test's end, a process's shutdown)."""
    global _current
    with _current_lock:
        rt, _current = _current, None
    if rt is not None:
        rt.close()
