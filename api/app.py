"""The FastAPI application: routes, problem details, body limits, metrics."""

from __future__ import annotations

import html
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import apidocs, dashboard, problems
from api.fast_submit import FastSubmit
from api.inference import FastInfer
from api.metrics import LATENCY, REQUESTS
from api.middleware import BodyLimit, RefuseControlCharacters
from api.ratelimit import RateLimits
from api.routers import (
    admin,
    admin_tenants,
    arrays,
    catalogue,
    endpoints,
    health,
    inference,
    jobs,
    keys,
    models,
    sessions,
    trials,
    usage,
)
from api.routers.notification_settings import router as notification_settings_router
from api.routers.webhooks import router as webhooks_router
from api.views import render_submitted
from scheduler import runtime as runtime_module
from scheduler.errors import PROBLEM_TYPES
from scheduler.runtime import Runtime
from scheduler.services.batch import submitter
from scheduler.settings import Settings, get_settings

log = logging.getLogger("ipucloud.api")

MULTIPART_ALLOWANCE = 64 * 1024


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


class App(FastAPI):
    """FastAPI with the fast paths of a job's submission (``FastSubmit``) and of a v2 infer call
    (``FastInfer``) in front of all of it.

    Added with ``add_middleware``, the fast path sat inside FastAPI's own outer layers
    (``ServerErrorMiddleware``, its telemetry and body-limit layers) and behind its ``__call__``: 40% of
    an API process's busy loop at one connection was spent there before the fast path ran
    (docs/performance.md). Here uvicorn's call reaches the fast path first; every request it does not
    answer goes on to FastAPI's whole stack, middleware included, as before."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fast_infer = FastInfer(super().__call__, self)
        self.fast_submit = FastSubmit(super().__call__, self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["method"] == "POST" and scope["path"] == "/api/v1/jobs":
                await self.fast_submit(scope, receive, send)
            else:
                await self.fast_infer(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, *, runtime: Runtime | None = None) -> FastAPI:
    """The API on `settings` (by default the environment's).

    Every dependency reads the app's runtime (`app.state.runtime`, api/deps.py). The lifespan builds
    it from `settings` at start-up and closes it at shutdown, unless the caller hands one in (a test,
    an embedding process): that one is the caller's to close, and is set at once, so an app whose
    lifespan never runs (a TestClient used outside `with`) serves on it too."""
    if runtime is not None:
        settings = runtime.settings
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is not None:
            submitter.start(runtime, render_submitted)
            try:
                yield
            finally:
                submitter.stop(runtime)
            return
        built = Runtime.from_settings(settings)
        app.state.runtime = built
        # Service code publishes its after-commit hints on the process's runtime (scheduler/runtime.py).
        runtime_module.install(built)
        # The process's one submission writer (group commit, scheduler/services/batch/submitter.py).
        submitter.start(built, render_submitted)
        try:
            yield
        finally:
            submitter.stop(built)
            runtime_module.install(None)
            built.close()

    app = App(
        lifespan=lifespan,
        title="ipucloud",
        version="0.1.0",
        summary="An IPU developer cloud: Virtual-IPU partitions, fair scheduling, emulated IPUs, metering.",
        openapi_url="/openapi.json",
        docs_url=None,  # api/apidocs.py serves /docs without a CDN
        redoc_url=None,
    )
    if runtime is not None:
        app.state.runtime = runtime
    # Its own limiters, on its runtime's broker; API processes share their counts through Redis.
    app.state.rate_limits = RateLimits(settings)
    problems.install(app)

    app.add_middleware(Observe)
    app.add_middleware(RefuseControlCharacters)
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
        # A v2 request of images in JSON is megabytes; past the limit the protocol's clients read `error`.
        suffixes={
            ("POST", "/infer"): (
                settings.infer_max_body_bytes,
                f"An inference request is at most {settings.infer_max_body_bytes:,} bytes; send fewer rows "
                "per request, or the binary tensor extension.",
            )
        },
    )

    for module in (
        jobs,
        arrays,
        sessions,
        inference,
        endpoints,
        catalogue,
        models,
        usage,
        keys,
        trials,
        admin,
        admin_tenants,
        health,
    ):
        app.include_router(module.router)
    app.include_router(webhooks_router)
    app.include_router(notification_settings_router)

    app.include_router(apidocs.router)
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
