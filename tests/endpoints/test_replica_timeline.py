"""A replica's device runs on the requests' timeline, not on when its process got round to them: what
each request is charged (Server-Timing's queue + batch + host + ipu) is what ``ServePlan.under_load``
predicts for the same arrival times, even when the serving process stalls. Real Redis, the real
serving host; only the API is left out (envelopes are queued as its ENQUEUE script queues them)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from scheduler import inference
from scheduler.clock import Clock
from scheduler.inference import Answer, Envelope, Route
from vipu import emulator
from vipu.emulator.serving import batch_under_load, cut_batch
from workers.serving import ServingHost, next_batch

TIME_SCALE = 0.1
"""Slow enough that a step of the device is tens of wall milliseconds, as in the benchmark."""


def _plan(batch: int = 4) -> emulator.ServePlan:
    spec = emulator.WorkloadSpec(model="resnet50", task="infer", precision="fp16")
    return emulator.serve_plan(spec, machine="m2000", ipus=1, max_batch_size=batch)


def _arrivals(plan: emulator.ServePlan, n: int, load: float, seed: int) -> list[float]:
    """Poisson arrivals (emulated seconds) at ``load`` of the replica's saturation: bursts and gaps."""
    rng = random.Random(seed)
    rate = load * plan.throughput(plan.max_batch_size)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


@pytest.mark.parametrize("max_wait_ms", [0.0, 1.0])
def test_charged_latencies_are_the_plans_under_load_though_the_replica_process_stalls(
    runtime: Any, max_wait_ms: float
) -> None:
    plan = _plan()
    endpoint = f"ep_timeline{int(max_wait_ms * 10)}"
    r = runtime.redis
    r.delete(inference.queue_key(endpoint), inference.inflight_key(endpoint, 31), inference.reply_key("wt"))
    inference.publish_route(
        r,
        Route(endpoint, "t_timeline", "m", "ready", plan.signature.to_dict(), plan.max_batch_size,
              max_wait_ms, 10_000, 60.0),
    )  # fmt: skip
    host = ServingHost(runtime.settings.broker_url)
    host.start()
    try:
        host.add(attempt_id=31, endpoint_id=endpoint, plan=plan, cluster_clock=Clock(TIME_SCALE),
                 ready_at=time.time())  # fmt: skip
        deadline = time.time() + 10
        while r.zscore(inference.ready_key(endpoint), "31") is None:
            assert time.time() < deadline, "the replica never became ready"
            time.sleep(0.01)
        time.sleep(1.2)  # the batching settings come with the route, read every second

        arrivals = _arrivals(plan, 80, 0.6, seed=int(max_wait_ms * 10) + 3)
        t0_us = int((time.time() + 0.2) * 1e6)
        stamps = [t0_us + round(a / TIME_SCALE * 1e6) for a in arrivals]
        # Queued up front, in order, each stamped with its arrival: the replica must not take a request
        # before its time comes on the device's timeline, whatever the queue already holds.
        envs = [Envelope(f"q{i}", "wt", 1, int(time.time() * 1000) + 60_000, s) for i, s in enumerate(stamps)]
        r.lpush(inference.queue_key(endpoint), *[e.encode() for e in envs])
        # Then the serving process stalls for 15 steps of the device in the middle of the load; the
        # requests that arrive meanwhile must be charged what the chip would have given them, not the
        # stall.
        mid = stamps[len(stamps) // 3] / 1e6
        time.sleep(max(0.0, mid - time.time()))
        assert host._loop is not None
        host._loop.call_soon_threadsafe(time.sleep, 15 * plan.step_s(1) / TIME_SCALE)

        got: dict[str, Answer] = {}
        deadline = time.time() + 30
        while len(got) < len(envs):
            left = deadline - time.time()
            assert left > 0, f"{len(envs) - len(got)} requests were never answered"
            popped = r.brpop([inference.reply_key("wt")], timeout=max(1, int(left)))
            if popped:
                a = Answer.decode(popped[1])
                got[a.rid] = a
    finally:
        host.close()

    times = [(s - stamps[0]) / 1e6 * TIME_SCALE for s in stamps]
    predicted = plan.under_load(times, max_wait_ms=max_wait_ms)
    charged = [got[f"q{i}"].latency_ms for i in range(len(envs))]
    assert charged == pytest.approx([p * 1000 for p in predicted], rel=1e-4, abs=1e-3)
    assert all(got[f"q{i}"].status == 200 for i in range(len(envs)))
    # The load did batch (the comparison above is not of lone requests only).
    assert max(a.batch for a in got.values()) > 1


def test_the_replicas_policy_is_the_one_under_load_replays() -> None:
    """``next_batch``, applied batch after batch with every arrival known, gives ``batch_under_load``'s
    latencies, batching window or not, full batches or not. Both call ``cut_batch`` (the policy is
    written once); this checks what each wraps around it: the envelopes' stamps read as the replica
    reads them, the device's free time carried from batch to batch as the replay carries it."""
    plan = _plan(batch=8)
    rng = random.Random(7)
    for max_wait_ms in (0.0, 0.5, 3.0):
        for max_rows in (1, 3, 8):
            arrivals = sorted(rng.uniform(0, 0.05) for _ in range(200))
            pending = [Envelope(f"r{i}", "w", 1, 0, round(a * 1e6)) for i, a in enumerate(arrivals)]
            got: dict[str, float] = {}
            device_free = float("-inf")
            while pending:
                cut = next_batch(pending, device_free, max_rows, max_wait_ms / 1000.0)
                t = plan.times(cut.rows)
                for env in pending[: cut.n]:
                    got[env.rid] = cut.start - env.enqueued_us / 1e6 + t.latency_s
                del pending[: cut.n]
                device_free = cut.start + t.step_s
            lat = [got[f"r{i}"] for i in range(len(arrivals))]
            exp = batch_under_load(
                plan,
                [round(a * 1e6) / 1e6 for a in arrivals],
                max_batch_size=max_rows,
                max_wait_ms=max_wait_ms,
            )
            assert lat == pytest.approx(exp, abs=1e-9), (max_wait_ms, max_rows)


def test_a_request_that_does_not_fit_closes_the_batch_at_its_arrival() -> None:
    """``cut_batch`` on requests of several rows, from an offset as the replay calls it: the batch takes
    what fits, and the first request that does not fit closes it (the batcher knows it is complete
    when that request arrives, not at the end of the window)."""
    arrivals = [0.0, 0.010, 0.011, 0.012, 0.013]
    rows = [9, 2, 3, 2, 1]
    cut = cut_batch(arrivals, 0.0105, 8, 0.005, rows=rows, first=1)
    # From 0.0105 (the device free, after the request at 0.010): 2 + 3 rows, then 2 more do fit (7),
    # then 1 more (8, full) at 0.013.
    assert (cut.n, cut.rows, cut.closed) == (4, 8, True)
    assert cut.fill_from == 0.0105 and cut.start == 0.013
    cut = cut_batch(arrivals, 0.0105, 6, 0.005, rows=rows, first=1)
    # 2 + 3 = 5 rows; the next request's 2 do not fit: closed at its arrival, 0.012.
    assert (cut.n, cut.rows, cut.closed, cut.start) == (2, 5, True, 0.012)
    cut = cut_batch(arrivals, 0.0, 16, 0.0, rows=rows)
    # No window: what had arrived when the device was free (at the first arrival), open.
    assert (cut.n, cut.rows, cut.closed, cut.start, cut.known) == (1, 9, False, 0.0, 0.0)
