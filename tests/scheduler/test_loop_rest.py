"""The scheduler's rest after an iteration (issue 35, start latency).

A submission's wake-up after an iteration whose pass found nothing queued is served at once; after
one that read a queue, and after a finish's wake-up, the scheduler rests as long as the iteration
took (at most a tick), so a stream of wake-ups cannot keep it iterating back to back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from scheduler import bus
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


def iterations_in(
    db: Any, monkeypatch: pytest.MonkeyPatch, *, read_queue: bool, submitted: bool, seconds: float
) -> int:
    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    done: list[float] = []

    def iterate() -> None:
        loop.more = False
        loop.read_queue = read_queue
        time.sleep(ITERATION_S)  # a slow iteration, as on a busy machine
        done.append(time.monotonic())

    monkeypatch.setattr(loop, "iterate", iterate)

    def wait(pubsub: Any) -> bool:  # a wake-up is always waiting
        loop.submitted = submitted
        return True

    monkeypatch.setattr(loop, "_wait", wait)
    monkeypatch.setattr(loop, "step_down", lambda: None)
    monkeypatch.setattr(loop, "redis_client", lambda: QuietRedis())
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    time.sleep(seconds)
    loop.stop_event.set()
    thread.join(5)
    return len(done)


def test_a_submission_after_an_iteration_that_read_no_queue_is_not_rested_for(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 s of back-to-back 0.1 s iterations: about 10 without rests, about 5 with.
    idle = iterations_in(db, monkeypatch, read_queue=False, submitted=True, seconds=1.0)
    busy = iterations_in(db, monkeypatch, read_queue=True, submitted=True, seconds=1.0)
    finishes = iterations_in(db, monkeypatch, read_queue=False, submitted=False, seconds=1.0)
    assert idle >= 8, f"{idle} iterations in 1 s: submissions waited out rests after idle iterations"
    assert busy <= 6, f"{busy} iterations in 1 s that read the queue: not rested after"
    assert finishes <= 6, f"{finishes} iterations in 1 s woken by finishes alone: not rested after"


def test_the_wait_tells_a_submissions_wake_up_from_a_finishs(db: Any, runtime: Any) -> None:
    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    client = runtime.redis
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(bus.scoped(bus.WAKE_CHANNEL, client))
    try:
        for reasons, expected in ((["finish"], False), (["finish", "submit", "finish"], True)):
            loop.submitted = False
            for reason in reasons:
                bus.wake_scheduler(reason, client)
            assert loop._wait(pubsub)
            assert loop.submitted is expected, reasons
    finally:
        pubsub.close()


def test_a_scheduler_process_freezes_its_heap_after_its_first_iteration(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ipucloud scheduler` sets `freeze_heap`: what its first iteration built is never walked by a
    full collection again (those took 270-630 ms of a core beside the endpoints' replicas)."""
    import gc

    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery(), freeze_heap=True)  # type: ignore[arg-type]
    built: list[list[int]] = []
    frozen_at_iteration: list[int] = []

    def iterate() -> None:
        frozen_at_iteration.append(gc.get_freeze_count())
        if not built:
            built.append([1, 2, 3])  # what a first pass builds to keep
        loop.more = False
        if len(frozen_at_iteration) >= 2:
            loop.stop_event.set()

    monkeypatch.setattr(loop, "iterate", iterate)
    monkeypatch.setattr(loop, "_wait", lambda pubsub: True)
    monkeypatch.setattr(loop, "step_down", lambda: None)
    monkeypatch.setattr(loop, "redis_client", lambda: QuietRedis())
    gc.unfreeze()
    try:
        loop.run()
        assert frozen_at_iteration[0] == 0
        assert frozen_at_iteration[1] > 0, "the heap was not frozen after the first iteration"
        assert not any(o is built[0] for o in gc.get_objects()), "a full collection would still walk it"
        assert not loop.freeze_heap, "frozen once, not after every iteration"
    finally:
        gc.unfreeze()


def _recording_loop(db: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[SchedulerLoop, list[str]]:
    """A leading loop whose steps only record their order."""
    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    steps: list[str] = []
    real_lead = loop.lead

    def lead() -> bool:
        steps.append("lead")
        return real_lead()

    monkeypatch.setattr(loop, "lead", lead)
    for name in (
        "reconcile",
        "prune_checkpoints",
        "sweep_sessions",
        "serve_endpoints",
        "resolve_dependencies",
    ):
        monkeypatch.setattr(loop, name, lambda name=name: steps.append(name))
    monkeypatch.setattr(loop, "schedule_pass", lambda: steps.append("pass") or 0)
    monkeypatch.setattr(loop, "dispatch", lambda: steps.append("dispatch") or 0)
    return loop, steps


def test_a_submissions_wake_up_places_and_dispatches_before_the_repairs(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, steps = _recording_loop(db, monkeypatch)
    loop.submitted = False
    loop.iterate()
    assert steps.index("reconcile") < steps.index("pass")
    steps.clear()
    loop.last_reconcile = float("-inf")  # due again
    loop.submitted = True
    loop.iterate()
    assert steps.index("dispatch") < steps.index("reconcile"), steps
    assert steps.count("reconcile") == 1


def test_an_iteration_leads_again_only_once_a_quarter_of_the_lease_has_passed(
    db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, steps = _recording_loop(db, monkeypatch)
    loop.iterate()
    loop.iterate()
    assert steps.count("lead") == 1 and steps.count("pass") == 2, steps
    loop.led_at -= loop.settings.leader_lease_s / 4
    loop.iterate()
    assert steps.count("lead") == 2, steps
    # A replica that lost its lease leads (or stands by) at its next iteration.
    loop.fence_token = None
    loop.iterate()
    assert steps.count("lead") == 3, steps
