"""The systemd units for bare hosts: `systemd-analyze verify` accepts them without a warning, and
every ExecStart is a real `ipucloud` command line; the environment files set real settings, the
required ones included. About 1 s."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.routing import parse_queues
from tests.deploy.checks import (
    DEPLOY,
    check_ipucloud_command,
    read_env_file,
    required_in_production,
    setting_names,
)

UNITS = DEPLOY / "systemd"
INSTALLED_CLI = "/opt/ipucloud/venv/bin/ipucloud"


def _parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections of key -> every value (a key like EnvironmentFile may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _units() -> dict[str, dict[str, dict[str, list[str]]]]:
    return {path.name: _parse_unit(path.read_text()) for path in sorted(UNITS.glob("*.service"))}


def test_there_is_a_unit_per_component() -> None:
    assert set(_units()) == {
        "ipucloud-api.service",
        "ipucloud-vipu.service",
        "ipucloud-scheduler.service",
        "ipucloud-worker@.service",
        "ipucloud-migrate.service",
        "ipucloud-notifier.service",
    }


def test_exec_start_is_a_real_command() -> None:
    seen = set()
    for name, unit in _units().items():
        service = unit["Service"]
        (exec_start,) = service["ExecStart"]
        argv = shlex.split(exec_start)
        assert argv[0] == INSTALLED_CLI, name
        seen.add(check_ipucloud_command(argv[1:]))
        assert service["User"] == ["ipucloud"], f"{name} must not run as root"
        assert service["EnvironmentFile"][0] == "/etc/ipucloud/ipucloud.env", name
    assert seen == {"api", "vipu-server", "scheduler", "worker", "migrate", "notifier"}


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; the units are still parsed above")
    # The console script installed beside the interpreter running the tests (.venv/bin/ipucloud).
    cli = str(Path(sys.executable).with_name("ipucloud"))
    assert Path(cli).exists(), f"{cli} is missing: install the project (bin/bootstrap dev)"
    paths = []
    for src in sorted(UNITS.glob("*.service")):
        # Verify needs an executable ExecStart; the installed path is /opt, here it is the venv's.
        name = src.name.replace("@.service", "@rack3.service")
        dst = tmp_path / name
        dst.write_text(src.read_text().replace(INSTALLED_CLI, cli))
        paths.append(str(dst))
    out = subprocess.run([analyze, "verify", *paths], capture_output=True, text=True, timeout=60)
    ours = [
        line for line in (out.stdout + out.stderr).splitlines() if str(tmp_path) in line or "ipucloud" in line
    ]
    assert out.returncode == 0 and not ours, out.stdout + out.stderr


def test_environment_files_set_real_settings() -> None:
    known = setting_names()
    host = read_env_file(UNITS / "ipucloud.env.example")
    assert set(host) <= known, set(host) - known
    assert required_in_production() <= set(host)
    worker = read_env_file(UNITS / "worker.env.example")
    assert set(worker) <= known, set(worker) - known
    parse_queues(worker["IPUCLOUD_WORKER_QUEUES"])
