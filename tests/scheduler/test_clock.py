"""The cloud's clock (scheduler/clock.py): cluster time against the wall clock, owned by the runtime
and handed to the API's routes (`ClockDep`), the scheduler's loop and the host agent."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.deps import ClockDep
from scheduler.clock import UNSCALED, Clock
from scheduler.loop import SchedulerLoop
from scheduler.runtime import Runtime
from scheduler.settings import Settings

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("scale", [1.0, 60.0, 1000.0, 0.01, 3.0])
def test_conversions_are_exactly_the_arithmetic_they_replace(scale: float) -> None:
    """Figures shown must not move by a rounding: each conversion is the expression it replaced."""
    clock = Clock(scale)
    for cluster_s in (0.0, 1.0, 59.5, 3600.0, 86400.0, 1e-6):
        assert clock.to_wall(cluster_s) == cluster_s / scale
        assert clock.wall_delta(cluster_s) == timedelta(seconds=cluster_s / scale)
        assert clock.wall_after(START, cluster_s) == START + timedelta(seconds=cluster_s / scale)
    for wall_s in (0.0, 0.25, 1.0, 7200.5):
        now = START + timedelta(seconds=wall_s)
        assert clock.to_cluster(wall_s) == wall_s * scale
        assert clock.cluster_since(START, now) == (now - START).total_seconds() * scale


def test_a_clock_is_immutable_names_its_figures_and_refuses_a_scale_of_zero() -> None:
    clock = Clock(60.0)
    assert (clock.name, clock.wall_name) == ("cluster time", "wall clock")
    with pytest.raises(dataclasses.FrozenInstanceError):
        clock.scale = 1.0  # type: ignore[misc]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            Clock(bad)
    assert Clock(1.0) == UNSCALED
    assert clock.wall_now().tzinfo is not None


def test_the_runtime_owns_the_clock_its_settings_describe(db: Any) -> None:
    settings = Settings(time_scale=60.0)
    rt = Runtime.from_settings(settings)
    try:
        assert rt.clock == Clock(60.0) == Clock.of(settings)
        # The loop and the agent are handed the runtime's (`ipucloud scheduler`, workers/app.py);
        # built without one, they take the one their settings describe.
        assert SchedulerLoop(settings=settings, db=rt.db, clock=rt.clock).cluster_clock is rt.clock
        assert SchedulerLoop(settings=settings, db=rt.db).cluster_clock == rt.clock
        # The admin partition verbs place with the same time hints as the scheduler's pass.
        assert rt.allocators.sync("default").clock is rt.clock
    finally:
        rt.close()


def test_routes_are_handed_the_clock_of_the_app_s_runtime(runtime: Runtime, db: Any) -> None:
    """`ClockDep` is the app's runtime's clock, not the environment's settings (IPUCLOUD_TIME_SCALE
    is unset here: 1), so an app embedded with a runtime of its own converts on that one."""
    fast = Runtime(settings=runtime.settings.model_copy(update={"time_scale": 250.0}), db=runtime.db)
    app = create_app(runtime=fast)

    @app.get("/_test/clock")
    def clock_route(clock: ClockDep) -> dict[str, Any]:
        return {"scale": clock.scale, "name": clock.name, "same": clock is fast.clock}

    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/_test/clock").json() == {"scale": 250.0, "name": "cluster time", "same": True}
    assert Settings().time_scale == 1.0
