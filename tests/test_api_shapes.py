"""Every answer has a declared shape: each API and health route names its response model (or, for a
non-JSON answer, its media type), and no scheduler service returns an untyped `dict[str, Any]`
(they return TypedDict views), so the OpenAPI spec and mypy both see what is sent."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
HEALTH_PATHS = {"/healthz", "/readyz", "/metrics"}


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """The app's routes, flattened: FastAPI may hold an included router as one entry."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "effective_route_contexts"):
            for context in route.effective_route_contexts():
                if isinstance(context.original_route, APIRoute):
                    yield context.original_route
        elif hasattr(route, "routes") and not hasattr(route, "app"):
            yield from api_routes(route.routes)


def shapeless(route: APIRoute) -> str | None:
    """Why the route's answer has no declared shape, or None if it has one."""
    model = route.response_model
    if isinstance(model, type) and issubclass(model, BaseModel):
        return None
    response_class = getattr(route.response_class, "value", route.response_class)
    media_type = getattr(response_class, "media_type", None)
    if isinstance(response_class, type) and issubclass(response_class, JSONResponse):
        return f"response model {model!r} is not a pydantic model"
    if not media_type:
        return f"response class {response_class!r} names no media type and there is no response model"
    documented = route.responses.get(200, route.responses.get("200", {})).get("content", {})
    if media_type not in documented:
        return f"its {media_type} answer is not documented in `responses={{200: {{'content': ...}}}}`"
    return None


def test_every_api_and_health_route_declares_its_answer() -> None:
    from api.app import create_app
    from scheduler.settings import Settings

    app = create_app(Settings())
    checked = [r for r in api_routes(app.routes) if r.path.startswith("/api/") or r.path in HEALTH_PATHS]
    assert {r.path for r in checked} >= HEALTH_PATHS and len(checked) > 40, "the routes were not found"
    missing = {
        f"{','.join(sorted(r.methods))} {r.path}": why for r in checked if (why := shapeless(r)) is not None
    }
    assert not missing, f"routes without a declared answer (api/schemas/ has the models): {missing}"


def untyped_returns(source: str) -> list[str]:
    """The functions in `source` annotated as returning `dict[str, Any]` or `list[dict[str, Any]]`
    (alone or `| None`)."""
    untyped = {"dict[str, Any]", "list[dict[str, Any]]"}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            parts = {p.strip() for p in ast.unparse(node.returns).split("|")}
            if parts & untyped:
                found.append(f"{node.name} (line {node.lineno})")
    return found


def test_untyped_returns_are_found() -> None:
    assert untyped_returns("def f() -> dict[str, Any] | None: ...") == ["f (line 1)"]
    assert untyped_returns("def g() -> list[dict[str, Any]]: ...") == ["g (line 1)"]
    assert untyped_returns("def h() -> Mapping[str, Any]: ...\ndef i() -> View: ...") == []


def test_services_return_typed_views() -> None:
    untyped = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "scheduler" / "services").rglob("*.py"))
        if (found := untyped_returns(path.read_text()))
    }
    assert not untyped, (
        f"services returning `dict[str, Any]`: give each a TypedDict (docs/architecture.md): {untyped}"
    )
