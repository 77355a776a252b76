"""Print the README's settings table from the Settings model, or rewrite it in place (`--write`).

The README is checked against this output by tests/test_docs.py, so the table cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scheduler.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- settings:start -->", "<!-- settings:end -->"


def table() -> str:
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "(none)" if default is None or hasattr(default, "get_secret_value") else f"`{default}`"
        rows.append(f"| `IPUCLOUD_{name.upper()}` | {shown} | {field.description or ''} |")
    return "\n".join(rows)


def render(readme: str) -> str:
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    if "--write" in sys.argv:
        README.write_text(render(README.read_text()))
    else:
        print(table())
