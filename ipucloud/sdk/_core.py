"""What the sync and async clients share: request descriptions, the retry policy, the SSE decoder.

Each API operation is described once as a `Call` (method, path, body, how to read the answer);
`Client` and `AsyncClient` only differ in how they send it.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
import orjson
from pydantic import BaseModel

from ipucloud.sdk.errors import ApiError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

RETRY_STATUSES = frozenset({429, 503})
# Errors that happen before the request left this machine: retrying can never run it twice.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] | None = None
    authenticated: bool = True
    files: Any = None
    """Multipart file fields (``httpx``'s ``files``), with ``data`` as the text fields."""
    data: Mapping[str, str] | None = None

    @property
    def retry_safe_on_transport_error(self) -> bool:
        """Whether a request that may have reached the server can be sent again."""
        return self.method in IDEMPOTENT_METHODS or bool(self.headers and "Idempotency-Key" in self.headers)

    def clean_params(self) -> dict[str, Any] | None:
        if not self.params:
            return None
        return {k: v for k, v in self.params.items() if v is not None}


def model(cls: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        return cls.model_validate(orjson.loads(response.content))

    return parse


def raw_json(response: httpx.Response) -> Any:
    return orjson.loads(response.content)


def text(response: httpx.Response) -> str:
    return response.text


@dataclass(frozen=True)
class RetryPolicy:
    """Back off exponentially (with jitter) on 429 and 503, honouring `Retry-After` when sent."""

    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0
    jitter: float = 0.25
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        if response is not None:
            told = retry_after(response)
            if told is not None:
                return min(told, self.max_retry_after_s)
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return base * (1 + random.uniform(-self.jitter, self.jitter))


def retry_after(response: httpx.Response) -> float | None:
    """`Retry-After` as seconds: either a number or an HTTP date."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def raise_for_problem(response: httpx.Response) -> None:
    if response.is_error:
        raise ApiError.from_response(response)


@dataclass
class SSEDecoder:
    """Turn the lines of a `text/event-stream` into (event, id, data) triples (WHATWG rules)."""

    event: str = ""
    data: list[str] = field(default_factory=list)
    last_id: str | None = None

    def feed(self, line: str) -> tuple[str, str | None, str] | None:
        if line == "":
            if not self.data:
                self.event = ""
                return None
            out = (self.event or "message", self.last_id, "\n".join(self.data))
            self.event, self.data = "", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None
