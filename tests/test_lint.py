"""The code stays `ruff check` and `ruff format` clean and keeps its layers (docs/architecture.md), so a slip
fails the suite, not a review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, f"ruff check found problems:\n{out.stdout}{out.stderr}"


def test_the_layers_hold() -> None:
    """The import contracts in pyproject.toml (`[tool.importlinter]`): vipu imports none of the cloud,
    the scheduler neither the API nor the agents, nothing but the face imports the API."""
    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, f"an import crosses a layer:\n{out.stdout[-4000:]}{out.stderr}"


def test_ruff_format_is_clean() -> None:
    """One layout for the whole tree, so diffs show changes and not reflowed lines."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, f"ruff format would change:\n{out.stdout}{out.stderr}"


# slow: mypy checks the whole tree from nothing (no cache), a minute of one core; started late, it
# was the last test of its worker.
@pytest.mark.slow
def test_mypy_is_clean() -> None:
    """Types are checked (`[tool.mypy]` in pyproject.toml), so a wrong shape fails here, not in production."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "api", "scheduler", "vipu", "workers", "ipucloud"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, f"mypy found problems:\n{out.stdout[-6000:]}{out.stderr}"


def test_the_serial_mark_is_in_the_test_files_bin_test_greps() -> None:
    """bin/test's serial phase collects only the test files that spell out `mark.serial`, so a serial
    mark applied anywhere else (a conftest hook, a helper module) would leave its tests unrun there."""
    elsewhere = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if not path.name.startswith("test_")
        and any(s in path.read_text() for s in ("mark.serial", 'add_marker("serial"', "add_marker('serial'"))
    ]
    assert not elsewhere, f"mark tests serial in their own test file (bin/test greps for it): {elsewhere}"
