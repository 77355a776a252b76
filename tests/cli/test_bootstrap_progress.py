"""#32 item 18: `bin/ipucloud up` from a fresh clone was silent for the 20 s (or minutes, on a loaded
machine) of its first install. `bin/bootstrap` runs for real here, in a copy of the project without a
`.venv`, and must say what it does as it does it: numbered steps, and each package it fetches."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    # A real install takes minutes and touches no database: once, in bin/test's embedded pass, is enough.
    pytest.mark.skipif(
        bool(os.environ.get("IPUCLOUD_TEST_DATABASE_URL")),
        reason="the install touches no database; it runs in the embedded pass",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PROJECT = (
    "pyproject.toml",
    "constraints.txt",
    "README.md",
    "bin",
    "api",
    "scheduler",
    "vipu",
    "workers",
    "ipucloud",
)


def test_a_first_install_shows_its_steps_and_each_package_as_it_goes(tmp_path: Path) -> None:
    clone = tmp_path / "ipucloud"
    clone.mkdir()
    for name in PROJECT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, clone / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, clone / name)
    proc = subprocess.Popen(
        [str(clone / "bin" / "bootstrap")],
        cwd=clone,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    started = time.monotonic()
    seen: list[tuple[float, str]] = []
    for line in proc.stderr:
        seen.append((time.monotonic() - started, line.rstrip("\n")))
    assert proc.wait(timeout=900) == 0, "\n".join(text for _, text in seen)
    lines = [text for _, text in seen]
    assert lines[0].startswith("Installing ipucloud into .venv")
    steps = [int(m.group(1)) for text in lines if (m := re.match(r"\[(\d)/4\] ", text))]
    assert steps == [1, 2, 3, 4], lines
    fetched = [
        m.groups() for text in lines if (m := re.match(r" {6}(\d+) of at most (\d+): ([\w.-]+)$", text))
    ]
    assert len(fetched) >= 10 and [int(n) for n, _, _ in fetched] == list(range(1, len(fetched) + 1))
    names = {name.lower() for _, _, name in fetched}
    assert {"fastapi", "sqlalchemy", "alembic"} <= names, names
    assert lines[-1].strip() == "done"
    # Never long without a word (pip installing the wheels, step 4, is its longest quiet stretch).
    times = [0.0] + [t for t, _ in seen]
    assert max(b - a for a, b in itertools.pairwise(times)) < max(30.0, times[-1] * 0.6), seen
    # Done once: a second run says nothing and installs nothing.
    again = subprocess.run(
        [str(clone / "bin" / "bootstrap")], cwd=clone, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and again.stderr == ""
