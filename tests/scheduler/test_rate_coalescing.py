"""The per-key rate limit's hits that arrive together share one Redis round trip (api/ratelimit.py,
`_Coalescing`) and the limit stays exact: as many allowed as separate increments would allow, across
two API processes' limiters sharing one counter."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from limits.aio.storage import RedisStorage
from limits.aio.strategies import FixedWindowRateLimiter

from api.ratelimit import _Coalescing, _item

REDIS = os.environ.get("IPUCLOUD_TEST_REDIS_URL")
pytestmark = pytest.mark.skipif(not REDIS, reason="needs IPUCLOUD_TEST_REDIS_URL")


class _Counted(RedisStorage):
    """Redis storage counting its increments (round trips)."""

    calls = 0

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        type(self).calls += 1
        return await super().incr(key, expiry, amount)


def test_hits_arriving_together_share_round_trips_and_the_limit_is_exact() -> None:
    async def main() -> list[bool]:
        # Two limiters, as two API processes have, on one counter.
        a = _Coalescing(FixedWindowRateLimiter(_Counted("async+" + str(REDIS), implementation="redispy")))
        b = _Coalescing(FixedWindowRateLimiter(_Counted("async+" + str(REDIS), implementation="redispy")))
        item = _item("50/minute")
        identity = f"key:test-{uuid.uuid4().hex}"
        hits = [(a if n % 2 else b).hit(item, identity) for n in range(120)]
        return await asyncio.gather(*hits)

    _Counted.calls = 0
    allowed = asyncio.run(main())
    assert sum(allowed) == 50
    # In arrival order per process: none allowed after one refused.
    for side in (allowed[0::2], allowed[1::2]):
        assert side == sorted(side, reverse=True)
    assert _Counted.calls < 20, _Counted.calls


def test_a_failed_round_trip_fails_each_of_its_hits_and_the_next_goes_out() -> None:
    class Failing(RedisStorage):
        fail = True

        async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
            await asyncio.sleep(0.01)
            if type(self).fail:
                type(self).fail = False
                raise ConnectionError("redis went away")
            return await super().incr(key, expiry, amount)

    async def main() -> tuple[list[bool | BaseException], bool]:
        c = _Coalescing(FixedWindowRateLimiter(Failing("async+" + str(REDIS), implementation="redispy")))
        item = _item("5/minute")
        identity = f"key:test-{uuid.uuid4().hex}"
        first = await asyncio.gather(*(c.hit(item, identity) for _ in range(3)), return_exceptions=True)
        return first, await c.hit(item, identity)

    first, later = asyncio.run(main())
    assert all(isinstance(r, ConnectionError) for r in first)
    assert later is True
