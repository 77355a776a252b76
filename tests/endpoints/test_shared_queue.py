"""An endpoint's backlog waits in its one queue, where every ready replica takes from: a replica that
comes up under a backlog (a scale-up) takes its share of what queued before it was ready. Until
2026-12-07 a replica took everything queued at once into its own in-flight list (a batch of one is full
as soon as it is taken, so nothing held it back) and booked it onto its device's future timeline, so a
scaled-up endpoint's backlog drained at the first replica's pace while the new ones idled.

Real Redis, two serving hosts in processes of their own (as two host agents run them); envelopes are
queued as the API's ENQUEUE queues them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from scheduler import inference
from scheduler.clock import Clock
from scheduler.inference import Answer, Envelope, Route
from vipu import emulator

ENDPOINT = "ep_shared1"
ROOT = Path(__file__).resolve().parents[2]
STEP_WALL_S = 0.005
"""A replica's device step in wall seconds: 200 requests/s a replica."""

_HOST = """
import signal, sys, threading, time
from scheduler.clock import Clock
from vipu import emulator
from workers.serving import ServingHost

url, endpoint = sys.argv[1], sys.argv[2]
attempt, scale, ready_at = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
spec = emulator.WorkloadSpec(model="lstm", task="infer", precision="fp16")
plan = emulator.serve_plan(spec, machine="m2000", ipus=1, max_batch_size=1)
host = ServingHost(url)
host.start()
host.add(attempt_id=attempt, endpoint_id=endpoint, plan=plan, cluster_clock=Clock(scale), ready_at=ready_at)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("started", flush=True)
stop.wait()
host.close()
"""


def _plan() -> emulator.ServePlan:
    spec = emulator.WorkloadSpec(model="lstm", task="infer", precision="fp16")
    return emulator.serve_plan(spec, machine="m2000", ipus=1, max_batch_size=1)


def _host(url: str, attempt: int, scale: float, ready_at: float) -> subprocess.Popen[bytes]:
    """A serving host process with one replica, loaded (taking requests) from ``ready_at`` (wall clock)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", _HOST, url, ENDPOINT, str(attempt), repr(scale), repr(ready_at)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out.decode(errors="replace")


def test_a_backlog_queued_under_one_replica_is_served_by_a_second_once_it_is_ready(runtime: Any) -> None:
    plan = _plan()
    scale = plan.step_s(1) / STEP_WALL_S
    r = runtime.redis
    url = runtime.settings.broker_url
    for k in (inference.queue_key(ENDPOINT), inference.reply_key("wsteal"), inference.ready_key(ENDPOINT)):
        r.delete(k)
    inference.publish_route(
        r, Route(ENDPOINT, "t_shared", "m", "ready", plan.signature.to_dict(), 1, 0.0, 100_000, 60.0)
    )
    # The second replica is ready (loaded) 0.4 s after the backlog is queued, at a time fixed up front
    # so that the processes' start-up on a loaded machine does not move it.
    second_ready = time.time() + 6.0
    first = _host(url, 41, scale, 0.0)
    second = _host(url, 42, scale, second_ready)
    logs: list[str] = []
    try:
        for proc in (first, second):
            assert proc.stdout is not None
            line = proc.stdout.readline().decode(errors="replace")
            assert line.strip() == "started", line + proc.communicate()[0].decode(errors="replace")
        deadline = time.time() + 10
        while r.zscore(inference.ready_key(ENDPOINT), "41") is None:
            assert time.time() < deadline, "the first replica never became ready"
            time.sleep(0.02)
        assert time.time() < second_ready - 0.4, "the serving processes took too long to start"
        time.sleep(second_ready - 0.4 - time.time())

        # A load step: 600 requests at once, three seconds of one replica's work.
        n = 600
        now_us = int(time.time() * 1e6)
        deadline_ms = int(time.time() * 1000) + 60_000
        envs = [Envelope(f"s{i}", "wsteal", 1, deadline_ms, now_us + 10 * i) for i in range(n)]
        r.lpush(inference.queue_key(ENDPOINT), *[e.encode() for e in envs])

        got: list[Answer] = []
        deadline = time.time() + 40
        while len(got) < n:
            left = deadline - time.time()
            assert left > 0, f"{n - len(got)} of {n} requests were never answered"
            popped = r.brpop([inference.reply_key("wsteal")], timeout=max(1, int(left)))
            if popped:
                got.append(Answer.decode(popped[1]))
        time.sleep(0.5)  # anything answered twice would have come by now
        got += [Answer.decode(x) for x in r.lrange(inference.reply_key("wsteal"), 0, -1)]
    finally:
        logs += [_stop(first), _stop(second)]

    assert len(got) == n, f"{len(got)} answers to {n} requests\n" + "\n".join(logs)
    assert Counter(a.rid for a in got) == Counter(e.rid for e in envs)
    assert {a.status for a in got} == {200}
    by_replica = Counter(a.replica for a in got)
    # From 0.4 s on the two split what is left (about 520 of 600): the second takes a fair share of it.
    assert by_replica[42] >= n // 4, (by_replica, logs)
    # Each request is charged the chip's queue: what the device that took it had before it, so the
    # last one waited about half what it would have behind one replica (3 s of work).
    worst = max(a.queue_ms for a in got) / 1000.0 / scale
    assert worst < 0.75 * n * STEP_WALL_S, (worst, by_replica)


def test_a_lone_request_costs_the_replica_one_move_and_one_answer(runtime: Any) -> None:
    """At one request in flight the replica learns that nothing else is queued in the round trip that
    moves the request (the server's time and the queue's length come with it), so it starts the batch
    without a TAKE_MORE of its own: one round trip of four on the request's path (before: five)."""
    from workers.serving import ServingHost

    spec = emulator.WorkloadSpec(model="mcmc", task="infer", precision="fp32")
    plan = emulator.serve_plan(spec, machine="m2000", ipus=1, max_batch_size=64)
    r = runtime.redis
    endpoint = "ep_shared2"
    for k in (inference.queue_key(endpoint), inference.reply_key("wlone")):
        r.delete(k)
    inference.publish_route(
        r, Route(endpoint, "t_shared", "m", "ready", plan.signature.to_dict(), 64, 0.0, 100_000, 60.0)
    )
    host = ServingHost(runtime.settings.broker_url)
    host.start()
    takes = 0
    try:
        assert host._scripts is not None
        take_more = host._scripts.take_more

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal takes
            takes += 1
            return await take_more(*args, **kwargs)

        host._scripts.take_more = counted
        # Zero device time (a time scale of a million): each request is a batch of its own, answered at once.
        host.add(attempt_id=51, endpoint_id=endpoint, plan=plan, cluster_clock=Clock(1e6),
                 ready_at=time.time())  # fmt: skip
        deadline = time.time() + 10
        while r.zscore(inference.ready_key(endpoint), "51") is None:
            assert time.time() < deadline, "the replica never became ready"
            time.sleep(0.01)
        scripts = inference.Scripts(r)
        for i in range(20):
            env = Envelope(f"l{i}", "wlone", 1, int(time.time() * 1000) + 60_000, int(time.time() * 1e6))
            keys, args = inference.enqueue_args(endpoint, [env.encode()], 100_000, time.time())
            assert scripts.enqueue(keys=keys, args=args)[0] == 1
            popped = r.brpop([inference.reply_key("wlone")], timeout=10)
            assert popped is not None, f"request {i} was never answered"
            a = Answer.decode(popped[1])
            assert (a.rid, a.status, a.batch) == (f"l{i}", 200, 1)
    finally:
        host.close()
    assert takes == 0


def test_what_the_agent_built_before_its_first_replica_is_walked_by_no_collection(runtime: Any) -> None:
    """A host agent's process holds everything it built before serving (Celery, SQLAlchemy, the
    catalogue, the plan) for as long as it lives; a full collection walked all of it while every
    replica's loop stood still (160-480 ms on a loaded 2-core machine: the endpoint's p99 at 16
    connections in benchmarks/endpoints.py). A serving host freezes it when it starts."""
    import gc

    from workers.serving import ServingHost

    gc.unfreeze()
    built_before = [{"n": i} for i in range(1000)]
    assert any(o is built_before for o in gc.get_objects())
    host = ServingHost(runtime.settings.broker_url)
    host.start()
    try:
        assert not any(o is built_before for o in gc.get_objects()), "a full collection would walk it"
        assert gc.get_freeze_count() >= len(built_before)
    finally:
        host.close()


def test_an_answer_due_at_once_goes_out_before_the_replicas_next_move(runtime: Any) -> None:
    """At zero device time a batch's answers are due the moment it starts. The replica's loop used to
    send its next BLMOVE first (the answer's task ran a turn later), so at one request in flight that
    write, and Redis waking for it, were ahead of every answer. Now the answer goes first: the
    replica's commands alternate move, answer, move, answer."""
    from workers.serving import ServingHost

    spec = emulator.WorkloadSpec(model="mcmc", task="infer", precision="fp32")
    plan = emulator.serve_plan(spec, machine="m2000", ipus=1, max_batch_size=64)
    r = runtime.redis
    endpoint = "ep_shared3"
    for k in (inference.queue_key(endpoint), inference.reply_key("worder")):
        r.delete(k)
    inference.publish_route(
        r, Route(endpoint, "t_shared", "m", "ready", plan.signature.to_dict(), 64, 0.0, 100_000, 60.0)
    )
    host = ServingHost(runtime.settings.broker_url)
    host.start()
    events: list[str] = []
    try:
        assert host._scripts is not None and host._redis is not None
        answer, pipeline = host._scripts.answer, host._redis.pipeline

        async def answered(*args: Any, **kwargs: Any) -> Any:
            events.append("answer")
            return await answer(*args, **kwargs)

        def watched(*args: Any, **kwargs: Any) -> Any:
            pipe = pipeline(*args, **kwargs)
            blmove = pipe.blmove

            def move(*a: Any, **k: Any) -> Any:
                events.append("move")
                return blmove(*a, **k)

            pipe.blmove = move  # type: ignore[method-assign]
            return pipe

        host._scripts.answer = answered  # type: ignore[method-assign]
        host._redis.pipeline = watched  # type: ignore[method-assign]
        host.add(attempt_id=61, endpoint_id=endpoint, plan=plan, cluster_clock=Clock(1e6),
                 ready_at=time.time())  # fmt: skip
        scripts = inference.Scripts(r)
        for i in range(10):
            env = Envelope(f"o{i}", "worder", 1, int(time.time() * 1000) + 60_000, int(time.time() * 1e6))
            keys, args = inference.enqueue_args(endpoint, [env.encode()], 100_000, time.time())
            assert scripts.enqueue(keys=keys, args=args)[0] == 1
            popped = r.brpop([inference.reply_key("worder")], timeout=10)
            assert popped is not None, f"request {i} was never answered"
            assert Answer.decode(popped[1]).rid == f"o{i}"
    finally:
        host.close()
    assert events[:20] == ["move", "answer"] * 10, events
