"""Write the API's OpenAPI spec to docs/openapi.json (`--check`: exit 1 if the file is stale).

    .venv/bin/python -m scripts.export_openapi          # regenerate after changing a route
    .venv/bin/python -m scripts.export_openapi --check  # what tests/tenancy/test_openapi.py asserts

The spec comes from the app itself (no server, database or secret needed), so it cannot describe
anything the app does not serve.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SPEC_FILE = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def spec() -> dict[str, Any]:
    from api.app import create_app
    from scheduler.settings import Settings

    return create_app(Settings()).openapi()


def render(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render(spec())
    if "--check" in argv:
        if not SPEC_FILE.exists() or SPEC_FILE.read_text() != text:
            print(f"{SPEC_FILE} is stale: run `.venv/bin/python -m scripts.export_openapi`", file=sys.stderr)
            return 1
        return 0
    SPEC_FILE.write_text(text)
    print(f"wrote {SPEC_FILE} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
