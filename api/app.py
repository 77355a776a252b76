"""The FastAPI application: routes, problem details, body limits, metrics."""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Mapping

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import dashboard, problems
from api.metrics import LATENCY, REQUESTS
from api.routers import admin, admin_tenants, catalogue, health, jobs, keys, models, trials, usage
from scheduler.errors import PROBLEM_TYPES
from scheduler.settings import Settings, get_settings

log = logging.getLogger("ipucloud.api")

MULTIPART_ALLOWANCE = 64 * 1024


class BodyLimit:
    """Refuse bodies over the limit before reading them (Content-Length) or while reading them.

    ``overrides`` gives routes (method, path) a limit of their own and what to say when it is passed: a
    model upload may be gigabytes, and its route streams it to disk and enforces its own limit on the
    file part.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, overrides: Mapping[tuple[str, str], tuple[int, str]] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.overrides = dict(overrides or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, detail = self.overrides.get(
            (scope.get("method", ""), scope.get("path", "")),
            (self.max_bytes, f"The request body is larger than {self.max_bytes} bytes."),
        )
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await self._refuse(scope, receive, send, detail)
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(scope, receive, send, detail)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, detail: str) -> None:
        resp = problems.problem(413, detail, slug="payload-too-large")
        await resp(scope, receive, send)


class _TooLarge(Exception):
    pass


class Observe:
    """Latency and count per route for /metrics, and `nosniff` on every response.

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware costs each request an extra task and
    a stream copy, a measurable share of the submit path's time."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-content-type-options" for k, _ in headers):
                    headers.append((b"x-content-type-options", b"nosniff"))
                    message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            LATENCY.labels(scope["method"], path).observe(time.perf_counter() - start)
            REQUESTS.labels(scope["method"], path, str(status)).inc()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="ipucloud",
        version="0.1.0",
        summary="An IPU developer cloud: Virtual-IPU partitions, fair scheduling, emulated IPUs, metering.",
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    problems.install(app)

    app.add_middleware(Observe)
    # The multipart envelope around a model file adds its boundaries and headers: a little more room.
    upload_limit = (
        settings.model_upload_max_bytes + MULTIPART_ALLOWANCE,
        f"The model file is larger than {settings.model_upload_max_bytes:,} bytes. Strip its weights first: "
        "`ipucloud models push` and the SDK send only the graph.",
    )
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        overrides={("POST", "/api/v1/models"): upload_limit, ("POST", "/models/upload"): upload_limit},
    )

    for module in (jobs, catalogue, models, usage, keys, trials, admin, admin_tenants, health):
        app.include_router(module.router)

    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")

    @app.get("/problems/{slug}", include_in_schema=False)
    def problem_type(slug: str) -> HTMLResponse:
        if slug not in PROBLEM_TYPES:
            return HTMLResponse("<h1>Unknown problem type</h1>", status_code=404)
        title, text = PROBLEM_TYPES[slug]
        return HTMLResponse(
            f"<!doctype html><title>{html.escape(title)}</title><h1>{html.escape(title)}</h1>"
            f"<p>{html.escape(text)}</p><p><a href='/docs'>API reference</a></p>"
        )

    return app
