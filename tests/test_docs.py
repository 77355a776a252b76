"""The README stays true: its settings table is the Settings model, and its quick start is two commands."""

from __future__ import annotations

import re
from pathlib import Path

from scripts.settings_table import README, render

ROOT = Path(__file__).resolve().parent.parent


def test_settings_table_matches_the_code() -> None:
    text = README.read_text()
    stale = "README settings table is stale: run `python scripts/settings_table.py --write`"
    assert render(text) == text, stale


def test_quick_start_is_two_commands_that_exist() -> None:
    text = README.read_text()
    block = text.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["bin/ipucloud up", "bin/test"]
    for cmd in commands:
        path = ROOT / cmd.split()[0]
        assert path.exists() and path.stat().st_mode & 0o111, f"{cmd} is not an executable file"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^bin/test\b", ci, re.M), ".ci/run must call the README's test command"
