"""The committed OpenAPI spec is the one the app serves, and it documents problems and the key."""

from __future__ import annotations

import json
from typing import Any

from scripts.export_openapi import SPEC_FILE, render, spec


def test_committed_spec_matches_the_app() -> None:
    current = render(spec())
    committed = SPEC_FILE.read_text() if SPEC_FILE.exists() else ""
    assert committed == current, (
        "docs/openapi.json is stale: regenerate it with `.venv/bin/python -m scripts.export_openapi` "
        "and commit it with your route change"
    )


def test_spec_documents_problems_and_bearer_keys(client: Any) -> None:
    served = client.get("/openapi.json").json()
    assert served == json.loads(render(spec()))
    assert served["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "ipuc_...",
        "description": "An API key: `Authorization: Bearer ipuc_...`.",
    }
    assert "HTTPValidationError" not in served["components"]["schemas"]
    for path, item in served["paths"].items():
        for method, op in item.items():
            responses = op["responses"]
            assert "application/problem+json" in responses["default"]["content"], (method, path)
            if "422" in responses:
                assert list(responses["422"]["content"]) == ["application/problem+json"], (method, path)
            if path.startswith("/api/v1/") and path != "/api/v1/trials":
                assert op["security"] == [{"ApiKey": []}], (method, path)
                assert "Retry-After" in responses["429"]["headers"], (method, path)
