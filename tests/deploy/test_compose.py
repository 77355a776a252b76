"""deploy/compose.yaml holds together: every ipucloud service runs a real command with real flags,
sets every variable a production component needs and no variable the code does not read, required
variables stop `docker compose` with a message, and the services are wired as deploy/README.md
says. No Docker engine runs here, so the file is checked, not started. Well under a second."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from scheduler.routing import parse_queues
from scheduler.settings import Settings
from tests.deploy.checks import (
    DEPLOY,
    MissingVariable,
    check_ipucloud_command,
    interpolate,
    read_env_file,
    referenced_variables,
    required_in_production,
    setting_names,
)

COMPOSE = DEPLOY / "compose.yaml"
OURS = ("migrate", "bootstrap", "api", "vipu", "scheduler", "worker", "notifier")


def _filled_example() -> dict[str, str]:
    """deploy/env.example as an admin would fill it in."""
    env = read_env_file(DEPLOY / "env.example")
    env.update(IPUCLOUD_SECRET_KEY="s" * 48, POSTGRES_PASSWORD="pw", FLOWER_BASIC_AUTH="admin:pw")
    return env


def _resolve(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_resolve(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _resolve(v, env) for k, v in node.items()}
    return node


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _resolve(yaml.safe_load(COMPOSE.read_text()), _filled_example())


def test_the_stack_has_every_service(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "flower", *OURS}
    for name, svc in compose["services"].items():
        if name not in ("migrate", "bootstrap"):
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
            assert svc.get("restart") == "unless-stopped", name


def test_every_ipucloud_service_runs_a_real_command(compose: dict[str, Any]) -> None:
    seen = set()
    for name in OURS:
        svc = compose["services"][name]
        assert svc["image"].startswith("ipucloud:") and svc["build"]["dockerfile"] == "deploy/Dockerfile"
        seen.add(check_ipucloud_command(svc["command"]))
    assert seen == {"migrate", "bootstrap", "api", "vipu-server", "scheduler", "worker", "notifier"}


def test_the_checker_rejects_what_is_not_a_command() -> None:
    for bad in (["serve"], ["worker", "--queue", "ipucloud"], ["api", "--port", "http"]):
        with pytest.raises(AssertionError, match="ipucloud"):
            check_ipucloud_command(bad)


def test_settings_are_real_and_the_required_ones_are_set(compose: dict[str, Any]) -> None:
    known, required = setting_names(), required_in_production()
    for name in OURS:
        env = compose["services"][name]["environment"]
        assert not {k for k in env if k.startswith("IPUCLOUD_")} - known, f"{name} sets unknown settings"
        assert required <= {k for k, v in env.items() if v}, f"{name} misses {required - set(env)}"
        # The values themselves pass the settings' validation (types, ranges, queue names).
        fields = {k[len("IPUCLOUD_") :].lower(): v for k, v in env.items() if k.startswith("IPUCLOUD_")}
        Settings(**fields)
    parse_queues(compose["services"]["worker"]["environment"]["IPUCLOUD_WORKER_QUEUES"])


def test_required_variables_stop_compose_with_a_message() -> None:
    text = COMPOSE.read_text()
    for missing in ("IPUCLOUD_SECRET_KEY", "POSTGRES_PASSWORD", "FLOWER_BASIC_AUTH"):
        env = {k: v for k, v in _filled_example().items() if k != missing}
        with pytest.raises(MissingVariable, match=rf"{missing}: set {missing}"):
            _resolve(yaml.safe_load(text), env)
    # An admin learns every variable from env.example.
    used: set[str] = set()
    _walk_strings(yaml.safe_load(text), lambda s: used.update(referenced_variables(s)))
    assert used <= set(read_env_file(DEPLOY / "env.example")), used - set(
        read_env_file(DEPLOY / "env.example")
    )


def _walk_strings(node: Any, visit: Any) -> None:
    if isinstance(node, str):
        visit(node)
    elif isinstance(node, list):
        for v in node:
            _walk_strings(v, visit)
    elif isinstance(node, dict):
        for v in node.values():
            _walk_strings(v, visit)


def test_services_are_wired_for_production(compose: dict[str, Any]) -> None:
    s = compose["services"]
    redis_cmd = s["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert redis_cmd[redis_cmd.index("--maxmemory-policy") + 1] == "noeviction"
    assert any("idle_in_transaction_session_timeout" in a for a in s["postgres"]["command"])
    assert s["migrate"]["restart"] == "no"
    # Jobs are told where the V-IPU endpoint is: the `vipu` service, on the port it listens on.
    assert s["worker"]["environment"]["IPUCLOUD_VIPU_API_HOST"] == "vipu"
    vipu = s["vipu"]["command"]
    assert vipu[vipu.index("--port") + 1] == "8090" and s["vipu"]["ports"] == ["8090:8090"]
    for name in ("api", "vipu", "scheduler", "worker", "bootstrap"):
        deps = s[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["postgres"]["condition"] == deps["redis"]["condition"] == "service_healthy", name
    assert s["scheduler"]["deploy"]["replicas"] == 2
    assert s["worker"]["deploy"]["replicas"] >= 1
    assert s["bootstrap"]["profiles"] == ["setup"], "bootstrap runs only when asked"
    assert "celery" in s["flower"]["command"] and "flower" in s["flower"]["command"]
