"""The request path's Redis protocol on a real Redis: each script's promise on its own."""

from __future__ import annotations

import time
from typing import Any

import pytest

from scheduler import inference
from scheduler.inference import Answer, Envelope

EP = "ep_proto"


def _env(i: int, waiter: str = "w1") -> Envelope:
    return Envelope(f"r{i}", waiter, 1, int((time.time() + 60) * 1000), int(time.time() * 1e6))


def _route(r: Any) -> None:
    r.set(inference.route_key(EP), "{}")  # only its presence matters to the scripts


def test_enqueue_takes_what_fits_and_counts_the_rest(runtime: Any, db: Any) -> None:
    r = runtime.redis
    s = inference.Scripts(r)
    _route(r)
    keys, args = inference.enqueue_args(EP, [_env(i).encode() for i in range(5)], 3, time.time())
    took, ready = s.enqueue(keys=keys, args=args)
    assert (took, ready) == (3, 0)
    assert r.llen(inference.queue_key(EP)) == 3
    w = inference.windows(r, [EP])[EP]
    assert (w.requests, w.rejected_429, w.cold_starts, w.queued) == (3, 2, 3, 3)


def test_an_answer_after_fail_over_is_never_sent(runtime: Any, db: Any) -> None:
    r = runtime.redis
    s = inference.Scripts(r)
    _route(r)
    keys, args = inference.enqueue_args(EP, [_env(i).encode() for i in range(4)], 100, time.time())
    s.enqueue(keys=keys, args=args)
    inflight = inference.inflight_key(EP, 5)
    taken = s.take_more(keys=[inference.queue_key(EP), inflight], args=[3])
    assert [Envelope.decode(x).rid for x in taken] == ["r0", "r1", "r2"]  # oldest first
    # The replica answers one; then it is lost and the rest fail over; its late answers send nothing.
    first = Envelope.decode(taken[0])
    keys, args = inference.answer_args(EP, 5, [(first, Answer("r0", 200, 5, 1, 0, 0, 1, 1))])
    assert s.answer(keys=keys, args=args) == 1
    r.sadd(inference.replicas_key(EP), 5)  # as the replica lists itself before it takes anything
    assert inference.reap_inflight(r, EP, live_attempt_ids=[5], grace_s=0) == 0  # still running
    assert inference.reap_inflight(r, EP, live_attempt_ids=[], grace_s=0) == 0  # found gone: doomed
    assert inference.reap_inflight(r, EP, live_attempt_ids=[], grace_s=0) == 2
    late = [(Envelope.decode(x), Answer(Envelope.decode(x).rid, 200, 5, 1, 0, 0, 1, 1)) for x in taken]
    keys, args = inference.answer_args(EP, 5, late)
    assert s.answer(keys=keys, args=args) == 0
    replies = [Answer.decode(x) for x in r.lrange(inference.reply_key("w1"), 0, -1)]
    assert sorted((a.rid, a.status) for a in replies) == [("r0", 200), ("r1", 503), ("r2", 503)]
    assert r.llen(inference.queue_key(EP)) == 1  # r3 still waits for a replica


def test_a_stopped_endpoint_answers_its_queue_and_queues_nothing_more(runtime: Any, db: Any) -> None:
    r = runtime.redis
    s = inference.Scripts(r)
    _route(r)
    keys, args = inference.enqueue_args(EP, [_env(i, "w2").encode() for i in range(3)], 100, time.time())
    assert s.enqueue(keys=keys, args=args) == [3, 0]
    inference.remove_route(r, EP)
    replies = sorted(Answer.decode(x).status for x in r.lrange(inference.reply_key("w2"), 0, -1))
    assert replies == [inference.GONE] * 3
    keys, args = inference.enqueue_args(EP, [_env(9, "w2").encode()], 100, time.time())
    assert s.enqueue(keys=keys, args=args) == [-1, 0]
    assert r.llen(inference.queue_key(EP)) == 0


def test_a_drained_replicas_requests_go_back_in_turn_or_are_answered_once_the_endpoint_stopped(
    runtime: Any, db: Any
) -> None:
    r = runtime.redis
    s = inference.Scripts(r)
    _route(r)
    queue, inflight = inference.queue_key(EP), inference.inflight_key(EP, 6)
    keys, args = inference.enqueue_args(EP, [_env(i, "w3").encode() for i in range(4)], 100, time.time())
    s.enqueue(keys=keys, args=args)
    s.take_more(keys=[queue, inflight], args=[2])
    # While the endpoint runs, what the replica did not start goes back ahead of what still waits.
    keys, args = inference.give_back_args(EP, 6)
    assert s.give_back(keys=keys, args=args) == [2, 0]
    assert r.llen(inflight) == 0
    taken = s.take_more(keys=[queue, inflight], args=[4])
    assert [Envelope.decode(x).rid for x in taken] == ["r0", "r1", "r2", "r3"]
    # Stopped meanwhile (its queue answered): handed back, they are answered as the queue was, once.
    inference.remove_route(r, EP)
    assert s.give_back(keys=keys, args=args) == [0, 4]
    assert s.give_back(keys=keys, args=args) == [0, 0]
    replies = [Answer.decode(x) for x in r.lrange(inference.reply_key("w3"), 0, -1)]
    assert sorted((a.rid, a.status) for a in replies) == [(f"r{i}", inference.GONE) for i in range(4)]
    assert r.llen(queue) == 0 and r.llen(inflight) == 0


def test_arrivals_are_counted_by_the_second_as_they_are_offered(runtime: Any, db: Any) -> None:
    """The autoscaler sizes a step in the load from the last seconds' arrivals (accepted or refused),
    not from the minute's answers: a step is seen whole within RECENT_S seconds."""
    r = runtime.redis
    s = inference.Scripts(r)
    _route(r)
    now = float(int(time.time()))
    # 10 a second for a minute before, then 500 a second for the last three seconds; the queue holds
    # 1,200, so some of the last are refused 429 and still counted as offered.
    for sec in range(60, 3, -1):
        keys, args = inference.enqueue_args(EP, [_env(i).encode() for i in range(10)], 1200, now - sec + 0.5)
        s.enqueue(keys=keys, args=args)
    r.delete(inference.queue_key(EP))
    for sec in (3, 2, 1):
        keys, args = inference.enqueue_args(EP, [_env(i).encode() for i in range(500)], 1200, now - sec + 0.5)
        s.enqueue(keys=keys, args=args)
    w = inference.windows(r, [EP], now=now + 0.5)[EP]
    assert w.arrival_rps == pytest.approx(500.0)
    assert w.rejected_429 == 300 and w.queued == 1200
    # What arrives in the second under way is not counted until it is whole.
    keys, args = inference.enqueue_args(EP, [_env(i).encode() for i in range(50)], 10**6, now + 0.2)
    s.enqueue(keys=keys, args=args)
    assert inference.windows(r, [EP], now=now + 0.5)[EP].arrival_rps == pytest.approx(500.0)
    assert inference.windows(r, [EP], now=now + 1.5)[EP].arrival_rps == pytest.approx((500 + 500 + 50) / 3)


def test_counters_mix_integer_and_float_fields_and_give_percentiles(runtime: Any, db: Any) -> None:
    r = runtime.redis
    counts = inference.Counts()
    now = time.time()
    counts.add_batch(EP, 4, now)
    counts.add_batch(EP, 2, now)
    # Two writes: the first of whole numbers, the second not; each adds to what the first wrote.
    for queue in (0.0, 0.5):
        pipe = r.pipeline()
        for ms in [1.0] * 50 + [2.0] * 40 + [10.0] * 10:
            counts.add_answer(EP, Answer("x", 200, 1, 1, queue, 0.0, ms / 2, ms / 2), now)
        counts.write(pipe)
        pipe.execute()
    w = inference.windows(r, [EP], now=now + 0.01)[EP]
    assert w.answered == 200
    assert w.mean_batch == pytest.approx(3.0)
    assert w.queue_delay_ms == pytest.approx(0.25)
    assert w.p50_ms == pytest.approx(1.5, rel=0.05)
    assert w.p90_ms == pytest.approx(2.5, rel=0.05)
    assert w.p99_ms == pytest.approx(10.5, rel=0.05)


def test_the_recent_queue_delay_is_that_of_the_last_seconds_answers_only() -> None:
    """A backlog answered a minute ago weighs on the window's mean, not on its recent figure."""
    counts = inference.Counts()
    now = 1_000_000.0
    for i in range(100):  # the backlog, answered 40 s ago after waiting 2 s
        counts.add_answer(EP, Answer(f"old{i}", 200, 1, 1, 2000.0, 0.0, 4.0, 4.0), now - 40 + i / 100)
    for i in range(10):  # the last seconds: 3 ms
        counts.add_answer(EP, Answer(f"new{i}", 200, 1, 1, 3.0, 0.0, 4.0, 4.0), now - 3 + i / 10)
    hashes = [{k: str(v) for k, v in f.items()} for f in counts.fields.values()]
    recent = range(int(now) - inference.RECENT_DELAY_S, int(now))
    w = inference.summarise(hashes, 60.0, 0, 1, 0.0, recent)
    assert w.queue_delay_ms > 1000 and w.answered == 110
    assert w.recent_queue_delay_ms == pytest.approx(3.0)
    # None answered in the recent seconds: no recent figure (the autoscaler then reads the minute's).
    assert inference.summarise(hashes, 60.0, 0, 1, 0.0, range(0, 5)).recent_queue_delay_ms is None
