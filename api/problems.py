"""RFC 9457 problem details for every error the API returns, including FastAPI's own."""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler.errors import PROBLEM_TYPES, DomainError
from scheduler.text import NO_HIDDEN

log = logging.getLogger("ipucloud.api")

PROBLEM_JSON = "application/problem+json"

_STATUS_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "payload-too-large",
    415: "unsupported-media-type",
    422: "invalid-request",
    429: "rate-limited",
    503: "unavailable",
}


_RESERVED = frozenset({"type", "title", "status", "detail", "instance", "slug", "headers"})


def problem(
    status: int,
    detail: str,
    *,
    slug: str | None = None,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    slug = slug or _STATUS_SLUGS.get(status, "internal-error" if status >= 500 else "bad-request")
    title = PROBLEM_TYPES.get(slug, ("Error", ""))[0]
    body: dict[str, Any] = {"type": f"/problems/{slug}", "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    # Extension members never overwrite the standard ones (RFC 9457 section 3.2).
    body.update({k: v for k, v in extra.items() if v is not None and k not in body})
    return Response(
        orjson.dumps(body, default=str), status_code=status, media_type=PROBLEM_JSON, headers=headers
    )


def _errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        out.append({"field": ".".join(loc), "message": err.get("msg", "invalid"), "type": err.get("type")})
    return out


_METHODS = ("get", "put", "post", "delete", "patch")


def allowed_methods(app: FastAPI, path: str) -> str | None:
    """Every method the resource at `path` supports, for a 405's `Allow` (RFC 9110 section 15.5.6).

    The router answers 405 from the first route whose path matched, which knows only its own
    method; the spec knows them all.
    """
    table: list[tuple[re.Pattern[str], set[str]]] | None = getattr(app.state, "allow_table", None)
    if table is None:
        table = []
        for template, item in app.openapi().get("paths", {}).items():
            methods = {m.upper() for m in item if m in _METHODS}
            if "GET" in methods:
                methods.add("HEAD")
            pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template))
            table.append((re.compile(f"^{pattern}$"), methods))
        app.state.allow_table = table
    allowed: set[str] = set()
    for regex, methods in table:
        if regex.match(path):
            allowed |= methods
    return ", ".join(sorted(allowed)) or None


def install(app: FastAPI) -> None:
    install_openapi(app)

    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError) -> Response:
        headers = {}
        if exc.status == 429 and "retry_after" in exc.extra:
            headers["Retry-After"] = str(exc.extra["retry_after"])
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="ipucloud"'
        if exc.status == 503:
            headers["Retry-After"] = "2"
        extra = {k: v for k, v in exc.extra.items() if k not in _RESERVED}
        return problem(
            exc.status, exc.detail, slug=exc.slug, instance=request.url.path, headers=headers, **extra
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        errors = _errors(exc)
        if any(e["type"] == "json_invalid" for e in errors):
            return problem(
                400,
                "The request body is not valid JSON.",
                slug="bad-request",
                instance=request.url.path,
                errors=errors,
            )
        first = errors[0] if errors else {"field": "", "message": "invalid"}
        return problem(
            422,
            f"{first['field']}: {first['message']}",
            slug="invalid-request",
            instance=request.url.path,
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else "Request failed."
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"No route {request.url.path}."
        if exc.status_code == 405:
            allowed = allowed_methods(app, request.url.path)
            if allowed:
                headers["Allow"] = allowed
                detail = f"{request.method} is not allowed here; use {allowed}."
        return problem(exc.status_code, detail, instance=request.url.path, headers=headers or None)

    @app.exception_handler(DataError)
    async def _unstorable(request: Request, exc: DataError) -> Response:
        # PostgreSQL refuses a NUL character in any text; a field without a stricter rule of its
        # own that carried one reaches it so. The transaction rolled back: nothing was changed.
        if "NUL" not in str(exc.orig):
            return await _unexpected(request, exc)
        return problem(
            422,
            "A field holds a NUL character, which nothing here accepts.",
            slug="invalid-request",
            instance=request.url.path,
        )

    @app.exception_handler(OperationalError)
    async def _db_down(request: Request, exc: OperationalError) -> Response:
        log.error("database error on %s %s: %s", request.method, request.url.path, exc.orig)
        return problem(
            503,
            "The database is unavailable; retry shortly.",
            slug="unavailable",
            instance=request.url.path,
            headers={"Retry-After": "2"},
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(
            500,
            "Something failed on our side; nothing was changed.",
            slug="internal-error",
            instance=request.url.path,
        )


# The OpenAPI spec -----------------------------------------------------------------------------------------

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "An RFC 9457 problem (`application/problem+json`): every error this API returns.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "The problem type, e.g. `/problems/quota-exceeded`."},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "What went wrong and what to do about it."},
        "instance": {"type": "string", "description": "The path of the request."},
        "errors": {
            "type": "array",
            "description": "For invalid requests: each field that is wrong and why.",
            "items": {"type": "object"},
        },
    },
    "additionalProperties": True,
}

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def _problem_response(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {PROBLEM_JSON: {"schema": _PROBLEM_REF}}}
    if headers:
        out["headers"] = headers
    return out


_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
}


def document_problems(spec: dict[str, Any]) -> dict[str, Any]:
    """Make the spec say what the API does on errors: problem bodies, not FastAPI's defaults.

    Every operation gets its 422 as a problem (FastAPI documents its own validation body, which this
    API never sends), 401/403/429 where a key is needed, 429 on the rate-limited trial route, and a
    `default` problem for the rest (404, 409, 413, 503, ...).
    """
    components = spec.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path, item in spec.get("paths", {}).items():
        for method, op in item.items():
            if method not in ("get", "put", "post", "delete", "patch"):
                continue
            for param in op.get("parameters", []):
                _no_null_header(param)
                _no_control_characters(param)
            responses = op.setdefault("responses", {})
            for status, response in responses.items():
                # A route's own error model (`/readyz`'s 503) is sent as a problem, so say so.
                content = response.get("content", {})
                if status[:1] in ("4", "5") and "application/json" in content:
                    content[PROBLEM_JSON] = content.pop("application/json")
            if "422" in responses or op.get("parameters") or op.get("requestBody"):
                responses["422"] = _problem_response("Invalid request: `errors` lists each field.")
            if op.get("security"):
                responses["401"] = _problem_response(
                    "Missing, malformed, unknown, expired or revoked API key.",
                    {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
                )
                responses["403"] = _problem_response("The key may not do this (scope, role, plan).")
                responses["429"] = _problem_response("Too many requests for this key.", _RETRY_AFTER)
            elif path.startswith("/api/"):
                responses["429"] = _problem_response("Too many requests from this address.", _RETRY_AFTER)
            responses["default"] = _problem_response("Any other error, as a problem.")
    return spec


def _no_null_header(param: dict[str, Any]) -> None:
    """An optional header is absent or a string, never null: say so (a client told `null` is
    allowed sends the text "null", which the header's pattern rightly refuses)."""
    schema = param.get("schema", {})
    options = schema.get("anyOf")
    if param.get("in") != "header" or not options:
        return
    rest = [o for o in options if o.get("type") != "null"]
    if len(rest) == 1 and len(rest) < len(options):
        param["schema"] = {**{k: v for k, v in schema.items() if k != "anyOf"}, **rest[0]}


# What `api.app.RefuseControlCharacters` enforces on every path and query string, stated in the spec.
NO_CONTROL_CHARACTERS = NO_HIDDEN


def _no_control_characters(param: dict[str, Any]) -> None:
    if param.get("in") not in ("path", "query"):
        return
    schema = param.get("schema", {})
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "string" and "pattern" not in option and "enum" not in option:
            option["pattern"] = NO_CONTROL_CHARACTERS


def install_openapi(app: FastAPI) -> None:
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    summary=app.summary,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
