"""RFC 9457 problem details for every error the API returns, including FastAPI's own."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler.errors import PROBLEM_TYPES, DomainError

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
    body.update({k: v for k, v in extra.items() if v is not None})
    return Response(
        orjson.dumps(body, default=str), status_code=status, media_type=PROBLEM_JSON, headers=headers
    )


def _errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        out.append({"field": ".".join(loc), "message": err.get("msg", "invalid"), "type": err.get("type")})
    return out


def install(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain(request: Request, exc: DomainError) -> Response:
        headers = {}
        if exc.status == 429 and "retry_after" in exc.extra:
            headers["Retry-After"] = str(exc.extra["retry_after"])
        return problem(
            exc.status, exc.detail, slug=exc.slug, instance=request.url.path, headers=headers, **exc.extra
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
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"No route {request.url.path}."
        return problem(
            exc.status_code, detail, instance=request.url.path, headers=getattr(exc, "headers", None)
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
