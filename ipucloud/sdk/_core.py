"""What the sync and async clients share: request descriptions, the retry policy, the SSE decoder.

Each API operation is described once as a `Call` (method, path, body, how to read the answer), by a
method of `ipucloud.sdk._api.Operations` marked `@operation`; `Client` and `AsyncClient` inherit those
methods and only differ in how they send a `Call` (`Sender.call`, `AsyncSender.call`).
"""

from __future__ import annotations

import email.utils
import functools
import inspect
import random
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

import httpx
import orjson
from pydantic import BaseModel

from ipucloud.sdk.errors import ApiError, ConfigurationError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
I = TypeVar("I")  # noqa: E741
M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")

RETRY_STATUSES = frozenset({429, 503})
# Errors that happen before the request left this machine: retrying can never run it twice.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


@dataclass(frozen=True)
class Call(Generic[T_co]):
    # Covariant so that a `Call[Page[Job]]` is a `Call[Paged[Job]]` to the pagination below.
    method: str
    path: str
    parse: Callable[[httpx.Response], T_co]
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] | None = None
    authenticated: bool = True
    files: Any = None
    """Multipart file fields (``httpx``'s ``files``), with ``data`` as the text fields."""
    data: Mapping[str, str] | None = None
    content: bytes | None = None
    """A raw body (an inference request's binary tensors)."""

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


def auth_headers(call: Call[Any], key: str | None) -> dict[str, str]:
    headers = dict(call.headers or {})
    if call.authenticated:
        if not key:
            raise ConfigurationError("No API key: pass key=, set IPUCLOUD_API_KEY or run `ipucloud login`.")
        headers["Authorization"] = f"Bearer {key}"
    return headers


# Sending ----------------------------------------------------------------------------------------------


class Sender(ABC):
    """A client that answers a `Call` with its result (`Client`)."""

    @abstractmethod
    def call(self, call: Call[T]) -> T:
        """Send `call` and return its answer, read as its model."""


class AsyncSender(ABC):
    """A client that answers a `Call` with an awaitable of its result (`AsyncClient`)."""

    @abstractmethod
    async def call(self, call: Call[T]) -> T:
        """Send `call` and return its answer, read as its model."""


class Paged(Protocol[T_co]):
    """Anything listed a page at a time: a `Page`, or a job's `Logs`."""

    @property
    def items(self) -> Sequence[T_co]: ...

    @property
    def next_cursor(self) -> str | None: ...


Pager = Callable[[str | None], Call[Paged[T]]]
"""The `Call` that fetches the page at a cursor (None: the first)."""


def _public_signature(build: Callable[..., Any], answer: str) -> inspect.Signature:
    # What `help()` and IDEs show for the client's method: the build's parameters without `self`,
    # returning what the call answers rather than the `Call` itself.
    sig = inspect.signature(build)
    return sig.replace(parameters=list(sig.parameters.values())[1:], return_annotation=answer)


def _answer(build: Callable[..., Any], wrapper: str) -> str:
    ret = str(inspect.signature(build).return_annotation)
    prefix = f"{wrapper}["
    return ret[len(prefix) : -1] if ret.startswith(prefix) and ret.endswith("]") else ret


def _dress(fn: Callable[..., Any], build: Callable[..., Any], signature: inspect.Signature) -> Any:
    functools.update_wrapper(fn, build)
    del fn.__wrapped__  # type: ignore[attr-defined]
    fn.__signature__ = signature  # type: ignore[attr-defined]
    return fn


def _unbound(build: Callable[..., Any], answer: str) -> Any:
    """The method as read from the class (`help(Client.submit_job)`, an IDE's hover): a function with
    the build's parameters, docstring and answer, not the descriptor object, whose help said nothing
    of either. It calls the method of the client it is given; `.build` is still the `Call`'s builder."""
    name = build.__name__

    def method(client: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(client, name)(*args, **kwargs)

    sig = inspect.signature(build)
    fn = _dress(method, build, sig.replace(return_annotation=answer))
    fn.build = build
    return fn


class operation(Generic[P, T]):
    """A method written once as "the `Call` to send": on a `Client` it returns the answer, on an
    `AsyncClient` it is a coroutine method returning the same answer.

    The build runs when the method is called (on an `AsyncClient`: when the coroutine first runs, as
    an ordinary `async def` would), so a bad argument raises where the caller looks for errors.
    """

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__
        self._signature = _public_signature(build, _answer(build, "Call"))
        self._unbound = _unbound(build, _answer(build, "Call"))

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> operation[P, T]: ...
    @overload
    def __get__(self, obj: AsyncSender, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, obj: Sender, owner: type[Any]) -> Callable[P, T]: ...
    def __get__(self, obj: Any, owner: type[Any]) -> Any:
        if obj is None:
            return self._unbound
        build = self.build
        if isinstance(obj, AsyncSender):

            async def send_async(*args: P.args, **kwargs: P.kwargs) -> T:
                return await obj.call(build(obj, *args, **kwargs))

            return _dress(send_async, build, self._signature)

        def send(*args: P.args, **kwargs: P.kwargs) -> T:
            return obj.call(build(obj, *args, **kwargs))

        return _dress(send, build, self._signature)


class paginated(Generic[P, I]):
    """An `iter_*` method written once as "the `Pager` of its list": on a `Client` it returns an
    iterator over every item, on an `AsyncClient` an async iterator; pages are fetched as needed."""

    def __init__(self, build: Callable[Concatenate[Any, P], Pager[I]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__
        item = _answer(build, "Pager")
        self._signature = _public_signature(build, f"Iterator[{item}]")
        self._async_signature = _public_signature(build, f"AsyncIterator[{item}]")
        self._unbound = _unbound(build, f"Iterator[{item}]")
        self._unbound_async = _unbound(build, f"AsyncIterator[{item}]")

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> paginated[P, I]: ...
    @overload
    def __get__(self, obj: AsyncSender, owner: type[Any]) -> Callable[P, AsyncIterator[I]]: ...
    @overload
    def __get__(self, obj: Sender, owner: type[Any]) -> Callable[P, Iterator[I]]: ...
    def __get__(self, obj: Any, owner: type[Any]) -> Any:
        if obj is None:
            return self._unbound_async if issubclass(owner, AsyncSender) else self._unbound
        build = self.build
        if isinstance(obj, AsyncSender):

            async def pages_async(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[I]:
                fetch = build(obj, *args, **kwargs)
                cursor: str | None = None
                while True:
                    page = await obj.call(fetch(cursor))
                    for item in page.items:
                        yield item
                    if not page.next_cursor:
                        return
                    cursor = page.next_cursor

            return _dress(pages_async, build, self._async_signature)

        def pages(*args: P.args, **kwargs: P.kwargs) -> Iterator[I]:
            fetch = build(obj, *args, **kwargs)
            cursor: str | None = None
            while True:
                page = obj.call(fetch(cursor))
                yield from page.items
                if not page.next_cursor:
                    return
                cursor = page.next_cursor

        return _dress(pages, build, self._signature)
