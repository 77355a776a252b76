"""ASGI middleware the API and the V-IPU endpoint share (kept apart from `api.app`, which loads every
route and the dashboard: the V-IPU endpoint's process needs none of them)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote_plus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import problems
from scheduler.text import has_hidden


class BodyLimit:
    """Refuse bodies over the limit with a 413: before reading them (Content-Length), or as soon as
    a body sent without one (chunked) passes the limit.

    ``overrides`` gives routes (method, path) a limit of their own and what to say when it is passed: a
    model upload may be gigabytes, and its route streams it to disk and enforces its own limit on the
    file part.

    When a chunked body passes the limit the 413 is sent from here at once, and the app is told the
    client went away: FastAPI turns any error while it reads a body into a 400 ("error parsing the
    body"), so an error raised into it would not reach the client as a 413. Whatever the app then
    tries to send is dropped."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        overrides: Mapping[tuple[str, str], tuple[int, str]] | None = None,
        suffixes: Mapping[tuple[str, str], tuple[int, str]] | None = None,
    ) -> None:
        """``suffixes``: limits of routes whose path ends so (a v2 infer under any endpoint's URL)."""
        self.app = app
        self.max_bytes = max_bytes
        self.overrides = dict(overrides or {})
        self.suffixes = dict(suffixes or {})

    def _limit(self, method: str, path: str) -> tuple[int, str]:
        found = self.overrides.get((method, path))
        if found is not None:
            return found
        for (m, suffix), value in self.suffixes.items():
            if m == method and path.endswith(suffix):
                return value
        return self.max_bytes, f"The request body is larger than {self.max_bytes} bytes."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, detail = self._limit(scope.get("method", ""), scope.get("path", ""))
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
        refused = False
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def limited() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    if not started:
                        await self._refuse(scope, receive, send, detail)
                    refused = True
                    return {"type": "http.disconnect"}
            return message

        try:
            await self.app(scope, limited, guarded_send)
        except Exception:
            if not refused:
                raise
            # The app failed on the body it was denied; the client already has its 413.

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, detail: str) -> None:
        resp = problems.problem(413, detail, slug="payload-too-large")
        await resp(scope, receive, send)


class RefuseControlCharacters:
    """A URL whose path or query holds a control or invisible character (`scheduler/text.py`: C0 and
    C1 controls, bidirectional overrides, line separators, zero-width characters) gets a 400 before any
    route reads it.

    No identifier, cursor or parameter of this API has one; PostgreSQL refuses a NUL in any text it is
    given (an error that would surface as a 500 from whichever query met it); and a number parser that
    trims Unicode blanks would read `\u20286` as 6."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            query = unquote_plus(scope.get("query_string", b"").decode("latin-1"))
            if has_hidden(scope.get("path", "")) or has_hidden(query):
                resp = problems.problem(
                    400, "The URL holds a control or invisible character; no path or parameter here has one."
                )
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)
