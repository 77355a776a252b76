"""The model servers of a host agent: every serving replica it holds, on one asyncio loop of its own.

A replica pulls envelopes from its endpoint's queue into its in-flight list (BLMOVE: a request is
always in exactly one place), forms a batch, and answers it when the emulated IPU would have: the
plan's latency for that batch size, divided by the time scale. The device is pipelined as the plan
says: the next batch may start ``step_s`` after this one while this one's answers are still on their
way, so a replica at saturation serves ``batch / step_s`` requests a second.

Times reported with each answer (``scheduler.inference.Answer``) are emulated: the queue is the time
the request waited while the replica's device was busy, the batch time the time it waited for the
batch to fill (at most ``max_wait_ms``), then the host transfer and the device time from the plan.
The hop from the API to the replica is the platform's, not the chip's, and is left out of both.

Counters are gathered in memory and written a few times a second; replicas renew their place in the
endpoint's ``ready`` set every second. The host agent starts, drains and drops replicas from its own
thread through the thread-safe methods of ``ServingHost``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis as AsyncRedis

from scheduler import inference
from scheduler.inference import Answer, Envelope
from vipu.emulator.serving import ServePlan

log = logging.getLogger(__name__)

FLUSH_S = 0.25
HEARTBEAT_S = 1.0
ROUTE_REFRESH_S = 1.0
_PULL_TIMEOUT_S = 1.0


@dataclass(eq=False)
class Replica:
    attempt_id: int
    endpoint_id: str
    plan: ServePlan
    time_scale: float
    ready_at: float
    """Wall-clock time at which its executable is loaded and it starts taking requests."""
    max_batch_size: int = 1
    max_wait_ms: float = 0.0
    draining: bool = False
    task: asyncio.Task[None] | None = None
    answering: set[asyncio.Task[None]] = field(default_factory=set)
    carry: list[tuple[Envelope, float]] = field(default_factory=list)
    batches: int = 0
    answered: int = 0
    _times: dict[int, Any] = field(default_factory=dict)

    def times(self, batch: int) -> Any:
        t = self._times.get(batch)
        if t is None:
            t = self._times[batch] = self.plan.times(batch)
        return t


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
        time_scale: float,
        ready_at: float,
    ) -> None:
        replica = Replica(attempt_id, endpoint_id, plan, time_scale, ready_at, plan.max_batch_size)
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
        loop = asyncio.new_event_loop()
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
        r, scripts = self._redis, self._scripts
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
        device_free = self.clock()
        while not rep.draining:
            try:
                if not rep.carry:
                    raw = await r.blmove(queue, inflight, _PULL_TIMEOUT_S, "RIGHT", "LEFT")  # type: ignore[arg-type]
                    if raw is None:
                        continue
                    rep.carry.append((Envelope.decode(raw), self.clock()))
                now = self.clock()
                if device_free > now:
                    await asyncio.sleep(device_free - now)
                batch, rows = await self._fill(rep, scripts, queue, inflight)
                if not batch:
                    continue
                start = self.clock()
                self._start_batch(rep, batch, rows, start, device_free)
                device_free = start + rep.times(rows).step_s / rep.time_scale
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("serving: replica %d: %s; carrying on", rep.attempt_id, exc)
                await asyncio.sleep(0.1)
        # Draining: what it took but did not start goes back through _forget (still in its list).
        rep.carry.clear()

    async def _fill(
        self, rep: Replica, scripts: inference.Scripts, queue: str, inflight: str
    ) -> tuple[list[tuple[Envelope, float, float]], int]:
        """Take requests until the batch is full or ``max_wait_ms`` after the device was free; drop
        those nobody waits for any more. Returns [(envelope, seen at, fill began)] and its rows."""
        fill_from = self.clock()
        deadline = fill_from + rep.max_wait_ms / 1000.0 / rep.time_scale
        max_rows = rep.max_batch_size
        batch: list[tuple[Envelope, float, float]] = []
        rows = 0
        expired: list[Envelope] = []

        def admit(env: Envelope, seen: float) -> bool:
            nonlocal rows
            if env.deadline_ms < self.clock() * 1000.0:
                expired.append(env)
                return True
            if batch and rows + env.rows > max_rows:
                return False
            batch.append((env, seen, fill_from))
            rows += env.rows
            return True

        carry, rep.carry = rep.carry, []
        for i, (env, seen) in enumerate(carry):
            if not admit(env, seen):
                rep.carry = carry[i:]
                break
        while rows < max_rows and not rep.carry:
            raws = await scripts.take_more(keys=[queue, inflight], args=[max_rows - rows])
            now = self.clock()
            for j, raw in enumerate(raws):
                env = Envelope.decode(raw)
                if not admit(env, now):
                    rep.carry = [(Envelope.decode(x), now) for x in raws[j:]]
                    break
            if rows >= max_rows or rep.carry or rep.draining:
                break
            left = deadline - self.clock()
            if raws or left < 0.001:
                if left < 0.001:
                    break
                continue
            raw = await self._redis.blmove(queue, inflight, min(left, _PULL_TIMEOUT_S), "RIGHT", "LEFT")  # type: ignore[union-attr,arg-type]
            if raw is not None:
                admit(Envelope.decode(raw), self.clock())
        if expired:
            keys, args = inference.answer_args(rep.endpoint_id, rep.attempt_id, [(e, None) for e in expired])
            await scripts.answer(keys=keys, args=args)
        return batch, rows

    def _start_batch(
        self,
        rep: Replica,
        batch: list[tuple[Envelope, float, float]],
        rows: int,
        start: float,
        device_free: float,
    ) -> None:
        times = rep.times(rows)
        scale_ms = rep.time_scale * 1000.0
        host_ms = (times.host_call_s + times.host_s) * 1000.0
        ipu_ms = times.device_s * 1000.0
        answers: list[tuple[Envelope, Answer | None]] = []
        for env, _seen, fill_from in batch:
            enqueued = env.enqueued_us / 1e6
            # Waiting while the device was busy is queueing; waiting after, for the batch to fill,
            # is batching; the hop from the API is neither.
            queue_ms = max(0.0, min(start, device_free) - enqueued) * scale_ms
            batch_ms = 0.0
            if rep.max_wait_ms > 0:
                batch_ms = min(max(0.0, start - max(enqueued, fill_from)) * scale_ms, rep.max_wait_ms)
            answers.append(
                (env, Answer(env.rid, 200, rep.attempt_id, rows, queue_ms, batch_ms, host_ms, ipu_ms))
            )
        rep.batches += 1
        self.counts.add_batch(rep.endpoint_id, rows, start)
        due = start + times.latency_s / rep.time_scale
        task = asyncio.get_running_loop().create_task(self._answer(rep, answers, due))
        rep.answering.add(task)
        task.add_done_callback(rep.answering.discard)

    async def _answer(self, rep: Replica, answers: list[tuple[Envelope, Answer | None]], due: float) -> None:
        wait = due - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
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
        rep.answered += len(answers)
        for _, a in answers:
            if a is not None:
                self.counts.add_answer(rep.endpoint_id, a, now)
