"""`ipucloud up` at idle holds no more than its components need (issue 35).

The server processes load neither the client SDK nor numpy (only an inference request needs numpy,
and loads it then), the V-IPU endpoint does not load the API's routes and dashboard, and the
supervisor, which lives as long as the cloud, does not hold the ORM and migrations it used to
prepare the data directory; the API serves the V-IPU endpoint and the worker delivers webhooks, two
processes fewer. The last test starts the real `ipucloud up` and bounds its memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What each process of `ipucloud up` imports to serve, and what it must not hold at idle.
CASES = {
    "api": ("import api.main", ["numpy", "ipucloud.sdk", "onnx"]),
    "vipu-server": ("import api.vipu_server", ["numpy", "ipucloud.sdk", "api.app", "api.dashboard"]),
    "scheduler": ("import scheduler.loop", ["numpy", "ipucloud.sdk", "onnx"]),
    "worker": ("import workers.agent", ["numpy", "ipucloud.sdk", "onnx"]),
    "supervisor": ("import ipucloud.supervisor", ["sqlalchemy", "alembic", "numpy", "ipucloud.sdk"]),
    # `python -m ipucloud worker` (as `up` starts each component): the command line without the client.
    "cli": (
        "import sys; sys.argv = ['ipucloud', 'worker', '--help']\n"
        "from ipucloud.cli import build\nbuild(servers_only=True)",
        ["numpy", "ipucloud.sdk", "httpx"],
    ),
}


def loaded(code: str, names: list[str]) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps([n for n in {names!r} if n in sys.modules]))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "IPUCLOUD_MODE": "embedded", "HOME": "/tmp"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("process", sorted(CASES))
def test_a_process_of_up_does_not_load_what_it_does_not_serve_with(process: str) -> None:
    code, forbidden = CASES[process]
    assert loaded(code, forbidden) == []


@pytest.mark.slow
@pytest.mark.e2e
def test_up_at_idle_stays_within_its_memory_bound() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.idle_memory import measure

    rows = measure(settle=3)
    names = [name for _, name, _, _, _ in rows]
    # The supervisor, the API (serving the V-IPU endpoint too), the scheduler and the worker (which
    # delivers webhooks too): each Python process costs about 35 MiB before it does anything.
    assert sum("ipucloud" in n for n in names) == 4, names
    assert any("api --with-vipu" in n for n in names) and any("worker --with-notifier" in n for n in names), (
        names
    )
    pss = sum(r[3] for r in rows) / 2**20
    # 610 MiB before issue 35's changes, 496 with six Python processes, about 323 with four
    # (docs/performance.md): issue 35's bound, with room for other Python versions and libraries.
    assert pss < 400, rows
