"""The scheduler rests after a pass that read a queue, and only then (issue 35, start latency).

An iteration whose pass found nothing queued is followed at once by the next wake-up's; one that read
a queue is followed by a rest as long as it took (at most a tick), so a stream of wake-ups cannot keep
the scheduler reading the queue back to back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from scheduler.loop import SchedulerLoop
from scheduler.settings import get_settings
from tests.scheduler.test_lifecycle import FakeCelery

ITERATION_S = 0.1


class QuietRedis:
    """A bus with no messages (`_wait` is replaced: a wake-up is always waiting)."""

    class PubSub:
        def subscribe(self, channel: str) -> None:
            pass

    connection_pool = None

    def pubsub(self, **kwargs: Any) -> PubSub:
        return self.PubSub()


def iterations_in(db: Any, monkeypatch: pytest.MonkeyPatch, *, read_queue: bool, seconds: float) -> int:
    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    done: list[float] = []

    def iterate() -> None:
        loop.more = False
        loop.read_queue = read_queue
        time.sleep(ITERATION_S)  # a slow iteration, as on a busy machine
        done.append(time.monotonic())

    monkeypatch.setattr(loop, "iterate", iterate)
    monkeypatch.setattr(loop, "_wait", lambda pubsub: True)  # a wake-up is always waiting
    monkeypatch.setattr(loop, "step_down", lambda: None)
    monkeypatch.setattr(loop, "redis_client", lambda: QuietRedis())
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    time.sleep(seconds)
    loop.stop_event.set()
    thread.join(5)
    return len(done)


def test_an_iteration_that_read_no_queue_is_not_rested_after(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 s of back-to-back 0.1 s iterations: about 10 without rests, about 5 with.
    idle = iterations_in(db, monkeypatch, read_queue=False, seconds=1.0)
    busy = iterations_in(db, monkeypatch, read_queue=True, seconds=1.0)
    assert idle >= 8, f"{idle} idle iterations in 1 s: rested after passes that read no queue"
    assert busy <= 6, f"{busy} iterations in 1 s that read the queue: not rested after"
