"""bin/test's `--dist loadgroup` keeps a group's tests on one worker (tests/conftest.py names them): under
pytest 9 with pytest-xdist 3.8 it silently did not, so the two schemathesis runs went side by side and a
class's shared cloud was started once per worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PAIR = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("pair")


@pytest.mark.parametrize("n", range(4))
def test_pair(n):
    with open(os.environ["WHERE"], "a") as out:
        out.write(f"pair {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""

SHARED = """
import os
import pytest


@pytest.fixture(scope="module")
def made():
    with open(os.environ["WHERE"], "a") as out:
        out.write(f"made {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("n", range(4))
def test_shared(made, n):
    pass


@pytest.mark.parametrize("n", range(8))
def test_alone(n):
    pass
"""


def test_a_group_and_a_module_sharing_a_fixture_each_run_on_one_worker(tmp_path: Path) -> None:
    hook = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    (tmp_path / "conftest.py").write_text(hook)
    (tmp_path / "test_pair.py").write_text(PAIR)
    (tmp_path / "test_shared.py").write_text(SHARED)
    where = tmp_path / "where.txt"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "."],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "WHERE": str(where)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = where.read_text().splitlines()
    pair = {line.split()[1] for line in lines if line.startswith("pair ")}
    made = [line for line in lines if line.startswith("made ")]
    assert len(pair) == 1 and sum(line.startswith("pair ") for line in lines) == 4, lines
    assert len(made) == 1, f"the module fixture was made on more than one worker: {made}"
