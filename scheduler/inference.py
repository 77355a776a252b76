"""The inference request path's Redis protocol: routes, queues, in-flight lists, answers, counters.

No request touches the database. Per endpoint:

- ``ep:<id>:route``  the endpoint as the API routes to it (``Route``, JSON), written by the control
  plane after every commit that changes it; API processes cache it for ``ROUTE_CACHE_S``.
- ``ep:<id>:q``      its queue. The API pushes request envelopes on the left (``ENQUEUE``, which
  refuses past ``max_queue`` and counts in the same step); every replica of the endpoint pulls from
  the right, so one queue feeds all its replicas and a busy replica simply takes less. A replica
  takes only what its device can start by now (``workers.serving``), so a backlog waits here, for
  whichever replica is free first (one just scaled up included), and ``max_queue`` bounds it.
- ``ep:<id>:f:<attempt>``  a replica's in-flight list: an envelope moves there atomically as the
  replica takes it (BLMOVE), and leaves it only by ``ANSWER`` (which replies only for envelopes it
  removed), ``FAIL_INFLIGHT`` (503 for everything left of a replica that is gone) or ``GIVE_BACK``
  (a drained replica's unstarted requests: back to the queue, or 404 once the endpoint has stopped).
  Each removes before it replies, so no request is answered twice.
- ``ep:<id>:ready``  replicas serving now: attempt id -> the time its heartbeat runs out.
- ``ep:<id>:replicas``  every replica that ever took from the queue (the in-flight lists to look at),
  and ``ep:<id>:doomed``: those found not running, and since when (``reap_inflight``).
- ``ep:<id>:c:<bucket>``  counters of a ``BUCKET_S`` bucket (hash), written in batches by the API
  (accepted, 429, cold starts, 503) and by the replicas (answered, batches, rows, queue delay,
  latency histogram, and the queue delay second by second: ``qd:<second>``, ``qn:<second>``, for the
  autoscaler's recent figure), read by ``windows``.
- ``ep:<id>:a:<second>``  requests offered (accepted or refused 429) in one wall second, counted by
  ``ENQUEUE`` as they arrive: what the autoscaler reads to size a step in the load at once.
- ``reply:<waiter>``  one list per API process: replicas push answers there, one reader per process
  hands them to the waiting requests.

An envelope is ``"<rid> <waiter> <rows> <deadline ms> <enqueued us>"``: the answer's content is
computed by the API from the request itself (``vipu.emulator.serving.outputs_for``), so a replica
only needs to know how many rows the request adds to a batch and until when anyone waits for it.
Times in envelopes and heartbeats are wall-clock (``time.time()``), which every host of a deployment shares.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import redis

PREFIX = "ipucloud:ep:"
REPLY_PREFIX = "ipucloud:reply:"
STOPPED_KEY = "ipucloud:ep-stopped"
"""Stopped endpoints whose replicas may still hold requests: ``reap_stopped`` empties it."""
BUCKET_S = 10
COUNTER_TTL_S = 3 * 3600
REPLY_TTL_S = 300
READY_TTL_S = 5.0
"""A replica that has not renewed its place in ``ready`` for this long is not counted as serving."""
ROUTE_CACHE_S = 1.0
GONE = 404
"""The status of an answer to a request still queued when its endpoint stopped (or handed back by a
draining replica after it stopped)."""
GONE_ANSWER = f"{GONE} 0 0 0 0 0 0"
ARRIVALS_TTL_S = 120
RECENT_S = 3
"""The autoscaler's arrival rate is that of the last this many whole seconds."""
RECENT_DELAY_S = 5
"""The autoscaler's queue delay is that of the requests answered in the last this many whole seconds
(``Window.recent_queue_delay_ms``): counters are written a few times a second, in batches."""
HIST_RATIO = 1.09
"""Latency histogram bins are 9% wide: a percentile read from them is within about 4.5%."""
_LOG_RATIO = math.log(HIST_RATIO)


def route_key(endpoint_id: str) -> str:
    return f"{PREFIX}{endpoint_id}:route"


def queue_key(endpoint_id: str) -> str:
    return f"{PREFIX}{endpoint_id}:q"


def inflight_key(endpoint_id: str, attempt_id: int) -> str:
    return f"{PREFIX}{endpoint_id}:f:{attempt_id}"


def replicas_key(endpoint_id: str) -> str:
    return f"{PREFIX}{endpoint_id}:replicas"


def doomed_key(endpoint_id: str) -> str:
    return f"{PREFIX}{endpoint_id}:doomed"


def ready_key(endpoint_id: str) -> str:
    return f"{PREFIX}{endpoint_id}:ready"


def counter_key(endpoint_id: str, bucket: int) -> str:
    return f"{PREFIX}{endpoint_id}:c:{bucket}"


def arrivals_key(endpoint_id: str, second: int) -> str:
    return f"{PREFIX}{endpoint_id}:a:{second}"


def reply_key(waiter: str) -> str:
    return f"{REPLY_PREFIX}{waiter}"


def bucket_of(t: float) -> int:
    return int(t // BUCKET_S)


# Routes ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """What an API process needs to take a request for an endpoint, without the database."""

    endpoint_id: str
    tenant_id: str
    name: str
    state: str
    signature: dict[str, Any]
    """``vipu.emulator.serving.Signature.to_dict()``: the inputs and outputs of v2 model metadata."""
    max_batch_size: int
    max_wait_ms: float
    max_queue: int
    cold_start_timeout_s: float
    accepting: bool = True
    """False once the endpoint is stopping or stopped: requests get 503 at once."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Route:
        return cls(**json.loads(text))


def publish_route(r: redis.Redis, route: Route) -> None:
    """Write the endpoint's route (after the commit that changed it)."""
    r.set(route_key(route.endpoint_id), route.to_json())


def remove_route(r: redis.Redis, endpoint_id: str) -> None:
    """Forget a stopped endpoint: its route goes first (nothing more is queued), then whoever still waits
    in its queue is answered 404 at once. Its replicas answer what they hold as they drain; one lost
    instead is reaped by ``reap_stopped`` (listed in ``STOPPED_KEY`` first, so that no failure between
    here and there leaves its requests waiting out their timeout)."""
    r.sadd(STOPPED_KEY, endpoint_id)
    r.delete(route_key(endpoint_id), ready_key(endpoint_id))
    _sync_scripts(r).fail_inflight(keys=[queue_key(endpoint_id)], args=[REPLY_PREFIX, GONE_ANSWER])


def get_route(r: redis.Redis, endpoint_id: str) -> Route | None:
    raw = cast(bytes | None, r.get(route_key(endpoint_id)))
    return Route.from_json(raw) if raw else None


# Envelopes and answers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Envelope:
    rid: str
    waiter: str
    rows: int
    deadline_ms: int
    enqueued_us: int
    raw: bytes = b""

    def encode(self) -> bytes:
        return f"{self.rid} {self.waiter} {self.rows} {self.deadline_ms} {self.enqueued_us}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> Envelope:
        rid, waiter, rows, deadline, enqueued = raw.split(b" ", 4)
        return cls(rid.decode(), waiter.decode(), int(rows), int(deadline), int(enqueued), raw)


@dataclass(frozen=True, slots=True)
class Answer:
    """A request's outcome as its replica reports it; times in emulated milliseconds."""

    rid: str
    status: int
    replica: int
    batch: int
    queue_ms: float
    batch_ms: float
    host_ms: float
    ipu_ms: float

    def encode(self) -> bytes:
        return (
            f"{self.rid} {self.status} {self.replica} {self.batch} {self.queue_ms:.6g} {self.batch_ms:.6g} "
            f"{self.host_ms:.6g} {self.ipu_ms:.6g}"
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Answer:
        rid, status, replica, batch, q, b, h, i = raw.split(b" ")
        return cls(
            rid.decode(), int(status), int(replica), int(batch), float(q), float(b), float(h), float(i)
        )

    @property
    def latency_ms(self) -> float:
        return self.queue_ms + self.batch_ms + self.host_ms + self.ipu_ms


# Scripts: each step of a request's path that must be atomic is one Lua script.

# KEYS: queue, ready, counters, route, this second's arrivals. ARGV: max_queue, now (s), counter ttl,
# envelopes... Accepts as many envelopes as the queue has room for (the first ones) and counts them;
# returns {accepted, replicas serving now}, or {-1, 0} once the route is gone (the endpoint was stopped:
# an API process's cached route must not queue a request that no replica will ever take).
_ENQUEUE = f"""
if redis.call('EXISTS', KEYS[4]) == 0 then return {{-1, 0}} end
local n = #ARGV - 3
redis.call('INCRBY', KEYS[5], n)
redis.call('EXPIRE', KEYS[5], {ARRIVALS_TTL_S})
local room = tonumber(ARGV[1]) - redis.call('LLEN', KEYS[1])
local take = math.min(n, math.max(room, 0))
if take > 0 then
  redis.call('LPUSH', KEYS[1], unpack(ARGV, 4, 3 + take))
end
local ready = redis.call('ZCOUNT', KEYS[2], ARGV[2], '+inf')
if take > 0 then
  redis.call('HINCRBY', KEYS[3], 'requests', take)
  if ready == 0 then redis.call('HINCRBY', KEYS[3], 'cold_starts', take) end
end
if n > take then redis.call('HINCRBY', KEYS[3], 'rejected_429', n - take) end
redis.call('EXPIRE', KEYS[3], ARGV[3])
return {{take, ready}}
"""

# KEYS: queue, in-flight. ARGV: how many; optionally a row budget and a cutoff (enqueued, microseconds).
# Moves up to that many envelopes, oldest first, stopping once the rows taken reach the budget (the one
# that reaches it is taken: its replica's next batch starts with it) or at the first envelope enqueued
# after the cutoff (a replica's device has not come to it yet: another replica may take it first).
_TAKE_MORE = """
local budget = tonumber(ARGV[2] or '0')
local cutoff = tonumber(ARGV[3] or '-1')
local out = {}
local rows = 0
for i = 1, tonumber(ARGV[1]) do
  if budget > 0 and rows >= budget then break end
  local head = redis.call('LINDEX', KEYS[1], -1)
  if not head then break end
  local r, enq = string.match(head, '^%S+ %S+ (%d+) %S+ (%d+)')
  if cutoff >= 0 and enq and tonumber(enq) > cutoff then break end
  redis.call('RPOPLPUSH', KEYS[1], KEYS[2])
  rows = rows + (tonumber(r) or 1)
  out[#out + 1] = head
end
return out
"""

# KEYS: in-flight, reply lists... ARGV: triples (envelope, index of its reply list in KEYS or 0, answer).
# Replies only for envelopes it removed: an envelope already failed over is never answered again.
_ANSWER = f"""
local sent = 0
for i = 1, #ARGV, 3 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) == 1 then
    local k = tonumber(ARGV[i + 1])
    if k > 0 then
      redis.call('LPUSH', KEYS[k], ARGV[i + 2])
      redis.call('EXPIRE', KEYS[k], {REPLY_TTL_S})
      sent = sent + 1
    end
  end
end
return sent
"""

# KEYS: in-flight (or a queue). ARGV: reply prefix, the answer after the request id (status first).
# Answers every envelope left, then the list is gone.
_FAIL_INFLIGHT = f"""
local items = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
for _, e in ipairs(items) do
  local rid, waiter = string.match(e, '^(%S+) (%S+)')
  if rid then
    redis.call('LPUSH', ARGV[1] .. waiter, rid .. ' ' .. ARGV[2])
    redis.call('EXPIRE', ARGV[1] .. waiter, {REPLY_TTL_S})
  end
end
return #items
"""


# KEYS: in-flight, queue, route. ARGV: reply prefix, the answer after the request id (status first).
# A drained replica's requests it took but did not start: back to the queue's right end, where
# replicas take from, the oldest outermost (they keep their turn), while the endpoint has a route;
# once the route is gone the queue has been answered and no replica reads it again, so they are
# answered as it was.
# Returns {given back, answered}. Atomic with ENQUEUE and with the clearing of the queue: whichever
# comes first, every request is queued and cleared, or answered here, once.
_GIVE_BACK = f"""
if redis.call('EXISTS', KEYS[3]) == 1 then
  local n = 0
  while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do n = n + 1 end
  return {{n, 0}}
end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
for _, e in ipairs(items) do
  local rid, waiter = string.match(e, '^(%S+) (%S+)')
  if rid then
    redis.call('LPUSH', ARGV[1] .. waiter, rid .. ' ' .. ARGV[2])
    redis.call('EXPIRE', ARGV[1] .. waiter, {REPLY_TTL_S})
  end
end
return {{0, #items}}
"""


class Scripts:
    """The protocol's scripts registered on one client (sync or asyncio): ``Scripts(client)``."""

    def __init__(self, client: Any) -> None:
        self.enqueue = client.register_script(_ENQUEUE)
        self.take_more = client.register_script(_TAKE_MORE)
        self.answer = client.register_script(_ANSWER)
        self.fail_inflight = client.register_script(_FAIL_INFLIGHT)
        self.give_back = client.register_script(_GIVE_BACK)


def enqueue_args(
    endpoint_id: str, envelopes: Sequence[bytes], max_queue: int, now: float
) -> tuple[list[str], list[Any]]:
    keys = [
        queue_key(endpoint_id),
        ready_key(endpoint_id),
        counter_key(endpoint_id, bucket_of(now)),
        route_key(endpoint_id),
        arrivals_key(endpoint_id, int(now)),
    ]
    return keys, [max_queue, now, COUNTER_TTL_S, *envelopes]


def give_back_args(endpoint_id: str, attempt_id: int) -> tuple[list[str], list[Any]]:
    """Arguments of ``GIVE_BACK`` for a drained replica."""
    keys = [inflight_key(endpoint_id, attempt_id), queue_key(endpoint_id), route_key(endpoint_id)]
    return keys, [REPLY_PREFIX, GONE_ANSWER]


def answer_args(
    endpoint_id: str, attempt_id: int, answered: Sequence[tuple[Envelope, Answer | None]]
) -> tuple[list[str], list[Any]]:
    """Arguments of ``ANSWER`` for a batch: an answer None removes the envelope without a reply (its
    waiter gave up)."""
    keys = [inflight_key(endpoint_id, attempt_id)]
    index: dict[str, int] = {}
    args: list[Any] = []
    for env, answer in answered:
        k = 0
        if answer is not None:
            k = index.get(env.waiter, 0)
            if not k:
                keys.append(reply_key(env.waiter))
                k = index[env.waiter] = len(keys)
        args += [env.raw or env.encode(), k, answer.encode() if answer is not None else b""]
    return keys, args


def reap_inflight(
    r: redis.Redis,
    endpoint_id: str,
    live_attempt_ids: Iterable[int],
    *,
    grace_s: float = 2.0,
    now: float | None = None,
) -> int:
    """Answer 503 for the requests in flight on replicas of the endpoint that no longer run (an agent
    lost, a replica stopped without draining); returns how many. The control plane calls it each
    pass with the attempts it knows are running. A replica is failed over only once it has been found
    not running for ``grace_s``: one whose attempt was just ended is still answering what it holds
    (a drain), and its answers must win."""
    live = {int(a) for a in live_attempt_ids}
    now = time.time() if now is None else now
    members = {int(x) for x in cast(set[bytes], r.smembers(replicas_key(endpoint_id)))}
    doomed = {
        int(k): float(v) for k, v in cast(dict[bytes, bytes], r.hgetall(doomed_key(endpoint_id))).items()
    }
    scripts = _sync_scripts(r)
    failed = 0
    for attempt_id in sorted(members - live):
        since = doomed.get(attempt_id)
        if since is None:
            r.hset(doomed_key(endpoint_id), str(attempt_id), str(now))
            continue
        if now - since < grace_s:
            continue
        # The API process that answers each of them 503 counts it (`unavailable_503`), once.
        failed += int(
            scripts.fail_inflight(
                keys=[inflight_key(endpoint_id, attempt_id)],
                args=[REPLY_PREFIX, f"503 {attempt_id} 0 0 0 0 0"],
            )
        )
        pipe = r.pipeline()
        pipe.zrem(ready_key(endpoint_id), attempt_id)
        pipe.srem(replicas_key(endpoint_id), attempt_id)
        pipe.hdel(doomed_key(endpoint_id), str(attempt_id))
        pipe.execute()
    for attempt_id in set(doomed) & live:  # a replica taken again after a hiccup: not doomed after all
        r.hdel(doomed_key(endpoint_id), str(attempt_id))
    return failed


def reap_stopped(r: redis.Redis, *, grace_s: float = 2.0, now: float | None = None) -> int:
    """``reap_inflight`` for the endpoints stopped since their replicas last left: none of their
    replicas runs any more, so each one still listed ``grace_s`` after it was first found (a drain
    answers what it holds and unlists itself within that) was lost, and what it holds is answered 503
    at once instead of waiting out the API's timeout. Once none is listed, the endpoint's keys go.
    Returns how many requests were answered. The control plane calls it every serve pass, whether or
    not any endpoint is live: ``reap_inflight`` alone ran for live endpoints only."""
    failed = 0
    for raw in sorted(cast(set[bytes], r.smembers(STOPPED_KEY))):
        endpoint_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        failed += reap_inflight(r, endpoint_id, (), grace_s=grace_s, now=now)
        if r.scard(replicas_key(endpoint_id)) == 0:
            pipe = r.pipeline()
            pipe.delete(
                replicas_key(endpoint_id),
                doomed_key(endpoint_id),
                ready_key(endpoint_id),
                queue_key(endpoint_id),
            )
            pipe.srem(STOPPED_KEY, endpoint_id)
            pipe.execute()
    return failed


_SCRIPTS: dict[int, Scripts] = {}


def _sync_scripts(r: redis.Redis) -> Scripts:
    s = _SCRIPTS.get(id(r))
    if s is None:
        s = _SCRIPTS[id(r)] = Scripts(r)
    return s


# Counters ------------------------------------------------------------------------------------------------


def hist_bin(latency_ms: float) -> int:
    """The histogram bin of a latency: bin b holds [HIST_RATIO**b, HIST_RATIO**(b+1)) microseconds."""
    us = max(latency_ms * 1000.0, 1.0)
    return int(math.log(us) / _LOG_RATIO)


def bin_ms(b: int) -> float:
    """A bin's representative latency (its geometric middle), in milliseconds."""
    return HIST_RATIO ** (b + 0.5) / 1000.0


_FLOAT_FIELDS = frozenset({"queue_ms", "latency_ms"})


@dataclass
class Counts:
    """Counters gathered in memory and written in one pipeline: ``add`` per batch, ``flush`` a few times
    a second (a replica's or an API process's)."""

    fields: dict[tuple[str, int], dict[str, float]] = field(default_factory=lambda: defaultdict(dict))

    def incr(self, endpoint_id: str, name: str, n: float = 1, at: float | None = None) -> None:
        bucket = bucket_of(time.time() if at is None else at)
        f = self.fields[(endpoint_id, bucket)]
        f[name] = f.get(name, 0) + n

    def add_answer(self, endpoint_id: str, answer: Answer, at: float) -> None:
        f = self.fields[(endpoint_id, bucket_of(at))]
        f["answered"] = f.get("answered", 0) + 1
        f["queue_ms"] = f.get("queue_ms", 0) + answer.queue_ms + answer.batch_ms
        # The same second by second, in the bucket's own hash (no key more to write or read).
        sec = int(at)
        f[f"qd:{sec}"] = f.get(f"qd:{sec}", 0) + answer.queue_ms + answer.batch_ms
        f[f"qn:{sec}"] = f.get(f"qn:{sec}", 0) + 1
        f["latency_ms"] = f.get("latency_ms", 0) + answer.latency_ms
        h = f"h{hist_bin(answer.latency_ms)}"
        f[h] = f.get(h, 0) + 1

    def add_batch(self, endpoint_id: str, rows: int, at: float) -> None:
        f = self.fields[(endpoint_id, bucket_of(at))]
        f["batches"] = f.get("batches", 0) + 1
        f["rows"] = f.get("rows", 0) + rows

    def __bool__(self) -> bool:
        return bool(self.fields)

    def write(self, pipe: Any) -> dict[tuple[str, int], dict[str, float]]:
        """Queue the increments on a pipeline (sync or asyncio) and forget them; returns them, for
        ``restore`` when the pipeline fails (a refusal counted once must not vanish with a hiccup)."""
        fields, self.fields = self.fields, defaultdict(dict)
        for (endpoint_id, bucket), f in fields.items():
            key = counter_key(endpoint_id, bucket)
            for name, n in f.items():
                # A hash field takes integer or float increments, never both.
                if name in _FLOAT_FIELDS or name.startswith("qd:"):
                    pipe.hincrbyfloat(key, name, float(n))
                else:
                    pipe.hincrby(key, name, int(n))
            pipe.expire(key, COUNTER_TTL_S)
        return fields

    def restore(self, fields: Mapping[tuple[str, int], Mapping[str, float]]) -> None:
        """Put back increments whose write failed, added to any gathered since."""
        for k, f in fields.items():
            mine = self.fields[k]
            for name, n in f.items():
                mine[name] = mine.get(name, 0) + n


@dataclass(frozen=True, slots=True)
class Window:
    """An endpoint's requests over the last ``seconds``, and its queue and replicas now."""

    seconds: float
    requests: int
    answered: int
    rejected_429: int
    unavailable_503: int
    cold_starts: int
    rps: float
    mean_batch: float
    queue_delay_ms: float
    mean_latency_ms: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    queued: int
    ready_replicas: int
    arrival_rps: float = 0.0
    """Requests offered a second over the last ``RECENT_S`` whole seconds (accepted or refused 429),
    for the autoscaler: ``rps`` is what was answered over the whole window, which under a load step is
    the old load, or what the replicas serving manage, not what arrives."""
    recent_queue_delay_ms: float | None = None
    """The mean queue delay of the requests answered in the last ``RECENT_DELAY_S`` whole seconds (None:
    none was), for the autoscaler: the window's mean stays above target long after a backlog is gone."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(hist: Mapping[int, float], q: float) -> float | None:
    total = sum(hist.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= rank:
            return bin_ms(b)
    return bin_ms(max(hist))


def summarise(
    counters: Iterable[Mapping[bytes | str, bytes | str]],
    seconds: float,
    queued: int,
    ready: int,
    arrival_rps: float = 0.0,
    recent: range | None = None,
) -> Window:
    """The counters' ``Window``; ``recent``: the wall seconds whose per-second queue delay makes
    ``recent_queue_delay_ms``."""
    total: dict[str, float] = defaultdict(float)
    hist: dict[int, float] = defaultdict(float)
    recent_ms = recent_n = 0.0
    for c in counters:
        for k, v in c.items():
            name = k.decode() if isinstance(k, bytes) else k
            value = float(v)
            if name.startswith("h"):
                hist[int(name[1:])] += value
            elif name.startswith("q") and name[2:3] == ":":
                if recent is not None and int(name[3:]) in recent:
                    if name[1] == "d":
                        recent_ms += value
                    else:
                        recent_n += value
            else:
                total[name] += value
    answered = int(total["answered"])
    return Window(
        seconds=seconds,
        requests=int(total["requests"]),
        answered=answered,
        rejected_429=int(total["rejected_429"]),
        unavailable_503=int(total["unavailable_503"]),
        cold_starts=int(total["cold_starts"]),
        rps=answered / seconds if seconds > 0 else 0.0,
        mean_batch=total["rows"] / total["batches"] if total["batches"] else 0.0,
        queue_delay_ms=total["queue_ms"] / answered if answered else 0.0,
        mean_latency_ms=total["latency_ms"] / answered if answered else 0.0,
        p50_ms=percentile(hist, 0.50),
        p90_ms=percentile(hist, 0.90),
        p99_ms=percentile(hist, 0.99),
        queued=queued,
        ready_replicas=ready,
        arrival_rps=arrival_rps,
        recent_queue_delay_ms=recent_ms / recent_n if recent_n else None,
    )


def windows(
    r: redis.Redis, endpoint_ids: Sequence[str], seconds: float = 60.0, now: float | None = None
) -> dict[str, Window]:
    """Each endpoint's ``Window`` over the last ``seconds`` (whole ``BUCKET_S`` buckets, the current one
    partly), with its queue length and serving replicas now; one round trip for all of them."""
    now = time.time() if now is None else now
    last = bucket_of(now)
    first = bucket_of(now - seconds) + 1
    span = max(now - first * BUCKET_S, 1e-9)
    this_second = int(now)
    recent = range(this_second - RECENT_DELAY_S, this_second)
    pipe = r.pipeline(transaction=False)
    for eid in endpoint_ids:
        for b in range(first, last + 1):
            pipe.hgetall(counter_key(eid, b))
        pipe.llen(queue_key(eid))
        pipe.zcount(ready_key(eid), now, "+inf")
        pipe.mget([arrivals_key(eid, sec) for sec in range(this_second - RECENT_S, this_second)])
    out = pipe.execute()
    n = last - first + 1
    result: dict[str, Window] = {}
    for i, eid in enumerate(endpoint_ids):
        chunk = out[i * (n + 3) : (i + 1) * (n + 3)]
        arriving = sum(int(x) for x in chunk[n + 2] if x is not None) / RECENT_S
        result[eid] = summarise(chunk[:n], span, int(chunk[n]), int(chunk[n + 1]), arriving, recent)
    return result


def series(
    r: redis.Redis, endpoint_id: str, seconds: float = 3600.0, now: float | None = None
) -> list[tuple[int, Window]]:
    """The endpoint's counters bucket by bucket over the last ``seconds`` (start of bucket, its Window)."""
    now = time.time() if now is None else now
    last = bucket_of(now)
    first = bucket_of(now - seconds) + 1
    pipe = r.pipeline(transaction=False)
    for b in range(first, last + 1):
        pipe.hgetall(counter_key(endpoint_id, b))
    out = pipe.execute()
    return [
        (b * BUCKET_S, summarise([c], float(min(BUCKET_S, max(now - b * BUCKET_S, 1e-9))), 0, 0))
        for b, c in zip(range(first, last + 1), out, strict=True)
        if c
    ]
