"""The submit fast path: `POST /api/v1/jobs` of one job, answered in front of FastAPI's stack.

Under 16 clients `py-spy` put a quarter of an API process's busy samples in FastAPI's layers around the
submit route (its telemetry and error layers, the middleware, routing, and solving the route's dependency
chain) against a few percent in the route's own work on the event loop (docs/performance.md). `FastSubmit`
answers a submission it is sure of itself: a key verified moments ago (`keys.cached_principal`) with the
`submit` scope and a tenant, in good standing, its use recorded recently; a JSON body within the limit
that is one valid job (no `array`, no `sweep`); no query string; at most one well-formed
`Idempotency-Key`. Everything else goes to the whole app, the buffered body handed on as it came, where
the route gives the same answers the slow way (and fills the key cache). Nothing is counted before a
request is known to stay here, so a request handed on is rate-limited once, by the route.

What the outer layers give every answer this one gives itself: `nosniff`, latency and counts in /metrics
under the route's name, and errors rendered by the app's own exception handlers (a refusal's problem, a
500 for the unexpected). The submission itself goes the route's way: the process's group-commit writer
(scheduler/services/batch/submitter.py), answered after its own job is durable."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from api.fast_path import KeySecret, read_body
from api.metrics import LATENCY, REQUESTS, post_metric
from api.ratelimit import check_rate_async
from api.views import render_submitted
from scheduler.jobspec import JobSpec
from scheduler.runtime import Runtime
from scheduler.services.batch import jobs as job_service
from scheduler.services.batch import submitter
from scheduler.services.tenancy import keys

PATH = "/api/v1/jobs"
# The route's own rule for the header (api/routers/jobs.py, IdempotencyKey).
_IDEMPOTENCY_KEY = re.compile(rb"^[\x21-\x7e]{1,255}$")


class FastSubmit:
    """Called by `api.app.App` for every `POST /api/v1/jobs` before FastAPI; `app` gets what it hands on."""

    def __init__(self, app: Any, owner: Any) -> None:
        """``app``: where requests it does not answer go; ``owner``: the app whose ``state`` serves."""
        self.app = app
        self.owner = owner
        self._secret = KeySecret()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        runtime: Runtime | None = getattr(self.owner.state, "runtime", None)
        if runtime is None or scope.get("query_string"):
            await self.app(scope, receive, send)
            return
        length = authorization = content_type = idempotency_key = None
        keys_seen = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"authorization":
                authorization = value
            elif name == b"content-type":
                content_type = value
            elif name == b"idempotency-key":
                idempotency_key = value
                keys_seen += 1
        principal = None
        if (
            length is not None
            and length.isdigit()
            and int(length) <= runtime.settings.max_body_bytes
            and content_type is not None
            and content_type.split(b";", 1)[0].strip().lower() == b"application/json"
            and authorization is not None
            and keys_seen <= 1
            and (idempotency_key is None or _IDEMPOTENCY_KEY.match(idempotency_key))
        ):
            scheme, _, key = authorization.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and key.strip():
                try:
                    principal = keys.cached_principal(secret=self._secret(runtime), key=key.strip())
                except Exception:
                    principal = None
        if (
            principal is None
            or principal.tenant_id is None
            or principal.suspended
            or ("submit" not in principal.scopes and not principal.is_admin)
            or principal.key_id in keys.stale_last_use
        ):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client went away
        spec = _one_job(body)
        if spec is None:
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            await check_rate_async(
                self.owner.state.rate_limits, f"key:{principal.key_id}", runtime.settings.rate_limit
            )
            request = job_service.SubmitRequest(
                principal.tenant_id,
                spec,
                None if idempotency_key is None else idempotency_key.decode("ascii"),
                principal.member_id,
            )
            result, answer = await asyncio.wrap_future(
                submitter.start(runtime, render_submitted).submit(request)
            )
            headers = {"Location": f"/api/v1/jobs/{result.job.id}"}
            if result.replayed:
                headers["Idempotent-Replayed"] = "true"
            response = Response(orjson.dumps(answer), 202, headers=headers, media_type="application/json")
        except Exception as exc:
            response = await self._handled(scope, exc)
        raw = response.raw_headers
        if not any(k == b"x-content-type-options" for k, _ in raw):
            raw = [*raw, (b"x-content-type-options", b"nosniff")]
        await send({"type": "http.response.start", "status": response.status_code, "headers": raw})
        await send({"type": "http.response.body", "body": response.body})
        post_metric(LATENCY, PATH).observe(time.perf_counter() - started)
        post_metric(REQUESTS, PATH, str(response.status_code)).inc()

    async def _handled(self, scope: Any, exc: Exception) -> Response:
        """The answer the app's exception handlers give `exc` (api/problems.py), found as Starlette finds
        them: by the exception's classes, most specific first."""
        handlers = self.owner.exception_handlers
        for cls in type(exc).__mro__:
            handler = handlers.get(cls)
            if handler is not None:
                response: Response = await handler(Request(scope), exc)
                return response
        raise exc


def _one_job(body: bytes) -> JobSpec | None:
    """The body as one job's spec, or None when the route should judge it (not JSON as the route reads
    it, invalid, or an array or a sweep)."""
    try:
        spec = JobSpec.model_validate(orjson.loads(body))
    except (orjson.JSONDecodeError, ValidationError, ValueError, TypeError):
        return None
    if spec.array is not None or spec.sweep is not None:
        return None
    return spec


def _replay(body: bytes, receive: Any) -> Any:
    """`receive` for the app, giving it the body already read, then whatever the client sends next."""
    sent = False

    async def replayed() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
