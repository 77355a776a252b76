"""The model servers of a host agent: every serving replica it holds, on one asyncio loop of its own.

A replica pulls envelopes from its endpoint's queue into its in-flight list (BLMOVE: a request is
always in exactly one place) only when its device can start on them, so a backlog waits in the
endpoint's queue, where every ready replica takes from (one scaled up under it takes its share at
once); it forms a batch, and answers it when the emulated IPU would have: the
plan's latency for that batch size, divided by the time scale. The device is pipelined as the plan
says: the next batch may start ``step_s`` after this one while this one's answers are still on their
way, so a replica at saturation serves ``batch / step_s`` requests a second.

Times reported with each answer (``scheduler.inference.Answer``) are emulated: the queue is the time
the request waited while the replica's device was busy, the batch time the time it waited for the
batch to fill (at most ``max_wait_ms``), then the host transfer and the device time from the plan.
The hop from the API to the replica is the platform's, not the chip's, and is left out of both.

The device runs on a timeline of its own, driven by when requests were enqueued (the API's stamp),
not by when this process got round to them: a batch starts at the later of the device's free time
and its first request's arrival, takes only what was enqueued by then (and in the batching window),
exactly as ``ServePlan.under_load`` replays it, so a stall of this process or of the API is charged to
no request. Answers are still sent when that timeline says (at once if the process is behind).

Counters are gathered in memory and written a few times a second; replicas renew their place in the
endpoint's ``ready`` set every second. The host agent starts, drains and drops replicas from its own
thread through the thread-safe methods of ``ServingHost``.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import heapq
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis as AsyncRedis

from scheduler import inference
from scheduler.clock import Clock
from scheduler.inference import Answer, Envelope
from vipu.emulator.serving import Cut, ServePlan, cut_batch

log = logging.getLogger(__name__)

FLUSH_S = 0.25
HEARTBEAT_S = 1.0
ROUTE_REFRESH_S = 1.0
_PULL_TIMEOUT_S = 1.0
_PULL_MAX = 256
"""Envelopes one pull moves at most (a replica far behind catches up in several)."""
SETTLE_S = 0.02
"""See ``Replica.settle_s``: an API process stamps a request a loop turn and a Redis round trip before
it is in the queue; on a loaded host that is milliseconds."""


@dataclass(eq=False)
class Replica:
    attempt_id: int
    endpoint_id: str
    plan: ServePlan
    cluster_clock: Clock
    """The clock its attempt was taken at: the plan's times are cluster seconds, waited on the wall clock."""
    ready_at: float
    """Wall-clock time at which its executable is loaded and it starts taking requests."""
    max_batch_size: int = 1
    max_wait_ms: float = 0.0
    draining: bool = False
    task: asyncio.Task[None] | None = None
    answering: set[asyncio.Task[None]] = field(default_factory=set)
    carry: list[Envelope] = field(default_factory=list)
    """Taken (in its in-flight list), not started: oldest enqueued first."""
    device_free: float = -math.inf
    """When its emulated device can start the next batch, on the device's timeline (wall-clock seconds
    as envelopes are stamped, never when Python got round to a batch)."""
    pulled_through: float = -math.inf
    """Every request enqueued by then is in ``carry`` or was started (as far as the last pull saw)."""
    due: list[tuple[float, int, list[tuple[Envelope, Answer | None]]]] = field(default_factory=list)
    seq: int = 0
    sender: asyncio.Task[None] | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    batches: int = 0
    answered: int = 0
    _times: dict[int, Any] = field(default_factory=dict)
    _settle_s: float | None = None

    def times(self, batch: int) -> Any:
        t = self._times.get(batch)
        if t is None:
            t = self._times[batch] = self.plan.times(batch)
        return t

    @property
    def settle_s(self) -> float:
        """Wall time allowed for a request stamped by the API to reach the queue before a batch that it
        could join is closed without it. Never more than half the plan's shortest latency, so that the
        batch is still decided before its answers are due."""
        if self._settle_s is None:
            self._settle_s = min(SETTLE_S, self.cluster_clock.to_wall(0.5 * self.times(1).latency_s))
        return self._settle_s

    def keep(self, envelopes: list[Envelope]) -> None:
        for env in envelopes:
            bisect.insort_right(self.carry, env, key=lambda e: e.enqueued_us)


class ServingHost:
    """The replicas of one host agent. ``start()``, then ``add``/``drain``/``drop`` from any thread."""

    def __init__(self, redis_url: str, *, clock: Callable[[], float] = time.time) -> None:
        self.redis_url = redis_url
        self.clock = clock
        self.replicas: dict[int, Replica] = {}
        self.counts = inference.Counts()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._redis: AsyncRedis | None = None
        self._scripts: inference.Scripts | None = None
        self._closing = False
        self._keeper: asyncio.Task[None] | None = None

    # Life (any thread) ----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        # Everything the host agent's process has built by its first replica (Celery, SQLAlchemy, the
        # catalogue, the plan) lives as long as the process; left to the collector, each full
        # collection walked all of it while every replica's loop stood still: 160-480 ms pauses (on a
        # loaded 2-core machine), the whole of the endpoint's p99 at 16 connections in
        # benchmarks/endpoints.py. api/main.py freezes the API's objects for the same reason.
        gc.freeze()
        self._thread = threading.Thread(target=self._run, name="serving", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def close(self, timeout: float = 5.0) -> None:
        """Drain every replica (answer what is in flight, give back what is not), then stop."""
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        try:
            fut.result(timeout)
        except Exception as exc:
            log.warning("serving: closing took too long (%s); what is in flight is left to fail-over", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)

    def add(
        self,
        *,
        attempt_id: int,
        endpoint_id: str,
        plan: ServePlan,
        cluster_clock: Clock,
        ready_at: float,
    ) -> None:
        replica = Replica(attempt_id, endpoint_id, plan, cluster_clock, ready_at, plan.max_batch_size)
        self._call(self._add, replica)

    def drain(self, attempt_id: int) -> Future[None] | None:
        """Stop taking requests for this replica, answer those it holds, give back what it had not
        started; the returned future resolves once it is gone."""
        return self._call(self._drain, attempt_id)

    def drop(self, attempt_id: int) -> None:
        """Stop at once without answering (its lease is gone: whatever it holds is failed over)."""
        self._call(self._drop, attempt_id)

    def drop_all(self) -> None:
        for attempt_id in list(self.replicas):
            self.drop(attempt_id)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Future[Any] | None:
        if self._loop is None:
            return None
        return asyncio.run_coroutine_threadsafe(fn(*args), self._loop)

    # The loop -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        # uvloop where it is installed (uvicorn[standard] brings it, and the API's processes run on it):
        # the loop's own machinery (polling, handles, transport writes) in C. In asyncio's Python it was
        # the largest part of this thread's py-spy samples at one connection (docs/performance.md).
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvicorn[standard] is a dependency
            loop = asyncio.new_event_loop()
        else:
            loop = uvloop.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._redis = AsyncRedis.from_url(self.redis_url, socket_connect_timeout=5)
        self._scripts = inference.Scripts(self._redis)
        self._keeper = loop.create_task(self._housekeeping())
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _add(self, replica: Replica) -> None:
        old = self.replicas.get(replica.attempt_id)
        if old is not None:
            return
        self.replicas[replica.attempt_id] = replica
        try:
            assert self._redis is not None
            # Listed before it takes anything, so that the control plane can find what it holds if it is lost.
            await self._redis.sadd(inference.replicas_key(replica.endpoint_id), replica.attempt_id)  # type: ignore[misc]
        except Exception as exc:
            log.warning(
                "serving: replica %d could not be listed (%s); it serves anyway", replica.attempt_id, exc
            )
        replica.task = asyncio.get_running_loop().create_task(self._serve(replica))

    async def _drain(self, attempt_id: int) -> None:
        replica = self.replicas.get(attempt_id)
        if replica is None:
            return
        replica.draining = True
        if replica.task is not None:
            try:
                await replica.task
            except Exception:
                log.exception("serving: replica %d failed while draining", attempt_id)
        await self._forget(replica)

    async def _drop(self, attempt_id: int) -> None:
        replica = self.replicas.pop(attempt_id, None)
        if replica is None:
            return
        replica.draining = True
        for t in [replica.task, *replica.answering]:
            if t is not None:
                t.cancel()
        try:
            assert self._redis is not None
            await self._redis.zrem(inference.ready_key(replica.endpoint_id), attempt_id)
        except Exception as exc:
            log.debug("serving: could not unlist replica %d: %s", attempt_id, exc)

    async def _forget(self, replica: Replica) -> None:
        """After a drain: its answers sent, its unstarted requests back at the head of the queue (or
        answered 404 if the endpoint has stopped)."""
        assert self._redis is not None and self._scripts is not None
        if replica.answering:
            await asyncio.gather(*replica.answering, return_exceptions=True)
        r = self._redis
        try:
            await r.zrem(inference.ready_key(replica.endpoint_id), replica.attempt_id)
            # Back to the queue in their turn while the endpoint runs; answered 404 at once if it has
            # stopped meanwhile (its queue was cleared and no replica will read it again).
            keys, args = inference.give_back_args(replica.endpoint_id, replica.attempt_id)
            _, gone = await self._scripts.give_back(keys=keys, args=args)
            if gone:
                log.info("serving: replica %d's endpoint %s has stopped: %d unstarted requests answered",
                         replica.attempt_id, replica.endpoint_id, gone)  # fmt: skip
            await r.srem(inference.replicas_key(replica.endpoint_id), replica.attempt_id)  # type: ignore[misc]
        except Exception as exc:
            log.warning("serving: replica %d could not give back its requests: %s", replica.attempt_id, exc)
        self.replicas.pop(replica.attempt_id, None)
        log.info("serving: replica %d of %s drained after %d batches, %d answers",
                 replica.attempt_id, replica.endpoint_id, replica.batches, replica.answered)  # fmt: skip

    async def _close(self) -> None:
        self._closing = True
        await asyncio.gather(*(self._drain(a) for a in list(self.replicas)), return_exceptions=True)
        if self._keeper is not None:
            self._keeper.cancel()
        await self._flush()
        if self._redis is not None:
            await self._redis.aclose()

    async def _housekeeping(self) -> None:
        """Heartbeats into ``ready``, batching settings from the route, counters out."""
        next_beat = next_route = 0.0
        while True:
            try:
                now = self.clock()
                if now >= next_beat:
                    next_beat = now + HEARTBEAT_S
                    await self._heartbeat(now)
                if now >= next_route:
                    next_route = now + ROUTE_REFRESH_S
                    await self._refresh_routes()
                await self._flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("serving: housekeeping failed (%s); trying again", exc)
            await asyncio.sleep(FLUSH_S)

    async def _heartbeat(self, now: float) -> None:
        assert self._redis is not None
        pipe = self._redis.pipeline(transaction=False)
        any_ = False
        for rep in self.replicas.values():
            if rep.draining or now < rep.ready_at:
                continue
            pipe.zadd(
                inference.ready_key(rep.endpoint_id), {str(rep.attempt_id): now + inference.READY_TTL_S}
            )
            any_ = True
        if any_:
            await pipe.execute()

    async def _refresh_routes(self) -> None:
        assert self._redis is not None
        endpoint_ids = sorted({r.endpoint_id for r in self.replicas.values()})
        if not endpoint_ids:
            return
        raws = await self._redis.mget([inference.route_key(e) for e in endpoint_ids])
        routes = {e: inference.Route.from_json(raw) for e, raw in zip(endpoint_ids, raws, strict=True) if raw}
        for rep in self.replicas.values():
            route = routes.get(rep.endpoint_id)
            if route is not None:
                # A PATCH of the batching applies from the next batch; never above what was compiled.
                rep.max_batch_size = max(1, min(route.max_batch_size, rep.plan.max_batch_size))
                rep.max_wait_ms = max(0.0, route.max_wait_ms)

    async def _flush(self) -> None:
        if not self.counts:
            return
        assert self._redis is not None
        pipe = self._redis.pipeline(transaction=False)
        fields = self.counts.write(pipe)
        try:
            await pipe.execute()
        except BaseException:
            self.counts.restore(fields)
            raise

    # A replica ---------------------------------------------------------------------------------------------

    async def _serve(self, rep: Replica) -> None:
        assert self._redis is not None and self._scripts is not None
        r = self._redis
        queue = inference.queue_key(rep.endpoint_id)
        inflight = inference.inflight_key(rep.endpoint_id, rep.attempt_id)
        wait = rep.ready_at - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
        # Listed as serving the moment it takes its first request, not at the next heartbeat.
        try:
            await r.zadd(
                inference.ready_key(rep.endpoint_id),
                {str(rep.attempt_id): self.clock() + inference.READY_TTL_S},
            )
        except Exception as exc:
            log.warning("serving: replica %d could not list itself as ready: %s", rep.attempt_id, exc)
        # What it held before a restart of this loop (never: a new attempt has a new list) is given
        # back by the control plane's reap; it starts empty.
        rep.device_free = self.clock()
        while not rep.draining:
            try:
                if not rep.carry:
                    # Nothing is taken before the device can start on it: the endpoint's backlog stays in
                    # its queue, where every ready replica (one just loaded included) takes from, instead
                    # of being booked onto this replica's future timeline as fast as Python can take it.
                    ahead = rep.device_free - rep.settle_s - self.clock()
                    if ahead > 0:
                        await asyncio.sleep(min(ahead, _PULL_TIMEOUT_S))
                        continue
                    # With the move, in the same round trip (Redis runs a blocked client's next commands
                    # the moment the blocking one is served): the server's time, then whether anything
                    # is left. An empty queue then means every request enqueued by that time is taken,
                    # which is what a TAKE_MORE would have found out in a round trip of its own before
                    # the batch could start (at one request in flight, one of four on its path).
                    pipe = r.pipeline(transaction=False)
                    pipe.blmove(queue, inflight, _PULL_TIMEOUT_S, "RIGHT", "LEFT")  # type: ignore[arg-type]
                    pipe.time()
                    pipe.llen(queue)
                    raw, (sec, usec), left = await pipe.execute()
                    if raw is None:
                        continue
                    rep.keep([Envelope.decode(raw)])
                    if left == 0:
                        rep.pulled_through = max(rep.pulled_through, sec + usec / 1e6 - rep.settle_s)
                taken = await self._take_batch(rep, queue, inflight)
                if taken is not None:
                    self._start_batch(rep, *taken)
                    if rep.due and rep.due[0][0] <= self.clock():
                        # Its answers are due now: the sender goes first (one turn of the loop), so
                        # that they reach Redis before this loop's next move does; at one request in
                        # flight that write, and Redis waking for it, were ahead of every answer.
                        await asyncio.sleep(0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("serving: replica %d: %s; carrying on", rep.attempt_id, exc)
                await asyncio.sleep(0.1)
        # Draining: what it took but did not start goes back through _forget (still in its list).
        rep.carry.clear()

    async def _take_batch(self, rep: Replica, queue: str, inflight: str) -> tuple[list[Envelope], Cut] | None:
        """The device's next batch, once it is settled: everything enqueued before the batch closes (on
        the emulated timeline, ``next_batch``) has had ``settle_s`` of wall time to reach the queue and
        has been pulled. Only waits for the wall clock to reach that point; a replica that is behind
        (its process or the API stalled) takes its batches at once, with the times they would have had."""
        assert self._redis is not None
        # A drain still starts the batch under way (what it holds when its device is free), as a
        # scale-down finishes what it started; only the loop in _serve stops taking more.
        while rep.carry:
            wait_s = rep.cluster_clock.to_wall(rep.max_wait_ms / 1000.0)
            cut = next_batch(rep.carry, rep.device_free, rep.max_batch_size, wait_s)
            if cut.closed or rep.pulled_through >= cut.known:
                batch = rep.carry[: cut.n]
                if self._expire(rep, batch):
                    continue
                del rep.carry[: cut.n]
                return batch, cut
            now = self.clock()
            if rep.pulled_through < cut.fill_from:
                # The device is busy until fill_from: nothing to decide before then.
                left = cut.fill_from + rep.settle_s - now
                if left > 0:
                    await asyncio.sleep(left)
                    continue
                await self._pull(rep, queue, inflight)
                continue
            # In the batching window: an arrival may fill the batch before it closes.
            left = cut.known + rep.settle_s - now
            if left < 0.001:
                if left > 0:
                    await asyncio.sleep(left)
                await self._pull(rep, queue, inflight)
                continue
            raw = await self._redis.blmove(queue, inflight, min(left, _PULL_TIMEOUT_S), "RIGHT", "LEFT")  # type: ignore[arg-type]
            if raw is not None:
                rep.keep([Envelope.decode(raw)])
                await self._pull(rep, queue, inflight)
        return None

    async def _pull(self, rep: Replica, queue: str, inflight: str) -> None:
        """Move into the in-flight list what has been enqueued by now, as much as the device can start
        by now (one batch when it is busy; more when it is behind), and note how far the pull saw."""
        assert self._scripts is not None
        now = self.clock()
        max_rows = rep.max_batch_size
        step = rep.cluster_clock.to_wall(rep.times(max_rows).step_s)
        # The device cannot start on anything before the oldest request it holds has come.
        busy_from = max(rep.device_free, rep.carry[0].enqueued_us / 1e6) if rep.carry else rep.device_free
        batches = 1 + int(max(0.0, now - busy_from) / step) if step > 0 else _PULL_MAX
        held = sum(e.rows for e in rep.carry)
        budget = max(0, min(max_rows * batches, _PULL_MAX) - held)
        if budget == 0:
            # Holding enough for the batches it can start by now: whatever else waits is later.
            rep.pulled_through = max(rep.pulled_through, rep.carry[-1].enqueued_us / 1e6)
            return
        raws = await self._scripts.take_more(keys=[queue, inflight], args=[budget, budget, int(now * 1e6)])
        envs = [Envelope.decode(x) for x in raws]
        rep.keep(envs)
        seen = now - rep.settle_s
        if envs and sum(e.rows for e in envs) >= budget:
            # Stopped at the budget, not at the queue's end: only what is older than the last taken is known.
            seen = min(seen, envs[-1].enqueued_us / 1e6)
        rep.pulled_through = max(rep.pulled_through, seen)

    def _expire(self, rep: Replica, batch: list[Envelope]) -> bool:
        """Drop from ``carry`` the requests of ``batch`` nobody waits for any more (their API process
        has answered 504); True if there were any."""
        now_ms = self.clock() * 1000.0
        expired = [e for e in batch if e.deadline_ms < now_ms]
        if not expired:
            return False
        gone = {id(e) for e in expired}
        rep.carry = [e for e in rep.carry if id(e) not in gone]
        self._schedule(rep, self.clock(), [(e, None) for e in expired])
        return True

    def _start_batch(self, rep: Replica, batch: list[Envelope], cut: Cut) -> None:
        times = rep.times(cut.rows)
        cluster_ms = rep.cluster_clock.to_cluster(1000.0)  # cluster milliseconds in a wall second
        host_ms = (times.host_call_s + times.host_s) * 1000.0
        ipu_ms = times.device_s * 1000.0
        answers: list[tuple[Envelope, Answer | None]] = []
        for env in batch:
            enqueued = env.enqueued_us / 1e6
            # Waiting while the device was busy is queueing; waiting after, for the batch to fill,
            # is batching; the hop from the API is neither. Both on the device's timeline: a stall
            # of this process or of the API is charged to no one.
            queue_ms = max(0.0, cut.fill_from - enqueued) * cluster_ms
            batch_ms = max(0.0, cut.start - max(enqueued, cut.fill_from)) * cluster_ms
            answers.append(
                (env, Answer(env.rid, 200, rep.attempt_id, cut.rows, queue_ms, batch_ms, host_ms, ipu_ms))
            )
        rep.batches += 1
        self.counts.add_batch(rep.endpoint_id, cut.rows, self.clock())
        rep.device_free = cut.start + rep.cluster_clock.to_wall(times.step_s)
        self._schedule(rep, cut.start + rep.cluster_clock.to_wall(times.latency_s), answers)

    def _schedule(self, rep: Replica, due: float, answers: list[tuple[Envelope, Answer | None]]) -> None:
        """Answer at ``due`` (wall clock); answers due together go in one script call."""
        if not answers:
            return
        rep.seq += 1
        heapq.heappush(rep.due, (due, rep.seq, answers))
        if rep.sender is None or rep.sender.done():
            task = asyncio.get_running_loop().create_task(self._send(rep))
            rep.sender = task
            rep.answering.add(task)
            task.add_done_callback(rep.answering.discard)
        else:
            rep.wake.set()

    async def _send(self, rep: Replica) -> None:
        while rep.due:
            wait = rep.due[0][0] - self.clock()
            if wait > 0:
                rep.wake.clear()
                try:
                    await asyncio.wait_for(rep.wake.wait(), wait)
                except TimeoutError:
                    pass
                continue
            now = self.clock()
            answers: list[tuple[Envelope, Answer | None]] = []
            while rep.due and rep.due[0][0] <= now:
                answers += heapq.heappop(rep.due)[2]
            await self._answer(rep, answers)

    async def _answer(self, rep: Replica, answers: list[tuple[Envelope, Answer | None]]) -> None:
        assert self._scripts is not None
        keys, args = inference.answer_args(rep.endpoint_id, rep.attempt_id, answers)
        for attempt in range(3):
            try:
                await self._scripts.answer(keys=keys, args=args)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == 2:
                    log.warning("serving: replica %d could not answer %d requests: %s",
                                rep.attempt_id, len(answers), exc)  # fmt: skip
                    return
                await asyncio.sleep(0.05 * (attempt + 1))
        now = self.clock()
        for _, a in answers:
            if a is not None:
                rep.answered += 1
                self.counts.add_answer(rep.endpoint_id, a, now)


def next_batch(pending: list[Envelope], device_free: float, max_rows: int, wait_s: float) -> Cut:
    """The replica's next batch on ``pending`` (sorted by enqueue time, not empty), on the device's
    timeline in wall-clock seconds as envelopes are stamped: ``vipu.emulator.serving.cut_batch``, the
    policy ``ServePlan.under_load`` replays, so the two cannot drift apart."""
    return cut_batch(
        [e.enqueued_us / 1e6 for e in pending], device_free, max_rows, wait_s, rows=[e.rows for e in pending]
    )
