"""How a request in the API waits for its answer (api/inference.py): woken one turn of the loop after
the reply reader reads it, and never losing an answer that comes just after the time it waited."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from api.inference import Gateway, _wait
from scheduler.inference import Answer, Route


def _route() -> Route:
    return Route("ep_wait", "t_wait", "m", "ready", {"inputs": [], "outputs": []}, 8, 0.0, 100, 1.0)


def _gateway() -> Gateway:
    # No command reaches Redis in these tests: the client connects on its first command.
    runtime: Any = SimpleNamespace(settings=SimpleNamespace(broker_url="redis://127.0.0.1:1/0"))
    return Gateway(runtime, asyncio.get_running_loop())


def test_a_request_runs_again_one_turn_of_the_loop_after_its_answer_is_read() -> None:
    """The reader sets the answer, then yields once before writing its next pop to Redis; the request
    must have run (and written its HTTP answer) by then. Waiting through ``wait_for`` around a
    ``shield`` took three turns, so the reader's write went first."""

    async def main() -> None:
        g = _gateway()
        fut = g.loop.create_future()
        g.waiting["r1"] = fut
        task = asyncio.create_task(_wait(g, _route(), "r1", fut, 10.0, cold_start=False))
        await asyncio.sleep(0)
        g.waiting.pop("r1").set_result(Answer("r1", 200, 7, 1, 0.0, 0.0, 0.0, 0.0))
        await asyncio.sleep(0)
        assert task.done()
        assert task.result().replica == 7

    asyncio.run(main())


def test_an_answer_read_after_the_cold_start_ran_out_reaches_its_request() -> None:
    """The cold start ran out, a replica is ready by then, and the answer is read after the wait timed
    out: it lands in the future the timeout put in its place, and the request answers with it."""

    async def main() -> None:
        g = _gateway()
        unavailable: list[str] = []

        async def ready(endpoint_id: str) -> int:
            return 1

        async def count(endpoint_id: str) -> None:
            unavailable.append(endpoint_id)

        g.ready_replicas = ready  # type: ignore[method-assign]
        g.unavailable = count  # type: ignore[method-assign]
        fut = g.loop.create_future()
        g.waiting["r2"] = fut
        task = asyncio.create_task(_wait(g, _route(), "r2", fut, 0.05, cold_start=True))
        await asyncio.sleep(0.2)
        assert not task.done()
        late = g.waiting.pop("r2")
        assert late is not fut
        late.set_result(Answer("r2", 200, 9, 1, 0.0, 0.0, 0.0, 0.0))
        got = await asyncio.wait_for(task, 5)
        assert got.replica == 9
        assert unavailable == []

    asyncio.run(main())
