"""The runtime object (scheduler/runtime.py): built at start-up from the settings the API was given,
installed as the process's default while it serves, closed at shutdown."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app
from scheduler import runtime as runtime_module
from scheduler.runtime import CapacityCache, Runtime
from scheduler.settings import Settings
from tests.tenancy.test_trials import APPLICATION


def test_create_app_settings_reach_every_dependency(db: Any) -> None:
    """A setting given to `create_app` rules, whatever the environment says (here the per-address
    trial limit, read through `SettingsDep`)."""
    settings = Settings(trial_rate_limit="2/minute")
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        built = app.state.runtime
        assert built.settings is settings
        assert runtime_module.current() is built, "the lifespan installs it for the process's service code"
        codes = [
            client.post("/api/v1/trials", json={**APPLICATION, "email": f"u{i}@example.org"}).status_code
            for i in range(3)
        ]
        assert codes == [201, 201, 429]
        assert client.get("/readyz").status_code == 200, "the runtime's database and Redis answer"
    assert runtime_module.current() is not built, "shut down: no longer the process's default"


def test_an_app_given_a_runtime_serves_on_it_without_a_lifespan(runtime: Runtime, db: Any) -> None:
    app = create_app(runtime=runtime)
    assert app.state.runtime is runtime
    client = TestClient(app, raise_server_exceptions=False)  # outside `with`: no lifespan
    assert client.get("/readyz").status_code == 200


def test_capacity_cache_is_the_runtime_s() -> None:
    cache = CapacityCache()
    assert cache.get(5.0) is None
    cache.put({"m2000": 128})
    assert cache.get(5.0) == {"m2000": 128}
    assert cache.get(0.0) is None, "an answer is never older than the caller accepts"
    cache.forget()
    assert cache.get(5.0) is None
