"""What the two fast paths in front of FastAPI share (`FastInfer` in api/inference.py, `FastSubmit` in
api/fast_submit.py): reading a request's body from ASGI, and the keys' secret without pydantic's lookup."""

from __future__ import annotations

from typing import Any

from scheduler.runtime import Runtime


class KeySecret:
    """The secret keys are checked with, kept per settings object: `Settings.secret()` reads a pydantic
    private attribute (a `__getattr__` call each time), on every request of a fast path."""

    def __init__(self) -> None:
        self._of: tuple[Any, bytes] | None = None

    def __call__(self, runtime: Runtime) -> bytes:
        settings = runtime.settings
        if self._of is None or self._of[0] is not settings:
            self._of = (settings, settings.secret())
        return self._of[1]


async def read_body(receive: Any) -> bytes | None:
    """The whole body, or None when the client went away before sending it."""
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks) if len(chunks) != 1 else chunks[0]
