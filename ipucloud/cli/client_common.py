"""What every client command shares: connection options, exit codes, JSON and table output."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from ipucloud.exit_codes import EXIT_CODES_HELP as EXIT_CODES_HELP  # re-exported: the commands read it here
from ipucloud.exit_codes import Exit as Exit
from ipucloud.sdk import (
    ApiError,
    AuthError,
    Client,
    ConfigurationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    QuotaError,
    RateLimitError,
    ServerError,
    ServiceUnreachable,
)

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url", help="Cloud URL (default: IPUCLOUD_URL, then `ipucloud login`'s).", show_default=False
    ),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key", help="API key (default: IPUCLOUD_API_KEY, then `ipucloud login`'s).", show_default=False
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (stable, for scripts).")]


def console(stderr: bool = False) -> Console:
    """A console on the current stdout/stderr; when piped, wide enough that ids never wrap."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else max(160, shutil.get_terminal_size((160, 24)).columns)
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def fail(
    message: str, code: Exit, *, problem: dict[str, Any] | None = None, as_json: bool = False
) -> NoReturn:
    if as_json and problem is not None:
        typer.echo(json.dumps(problem, indent=2, default=str), err=True)
    else:
        console(stderr=True).print(f"[red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(int(code))


def exit_code_for(exc: Exception) -> Exit:
    if isinstance(exc, QuotaError | ConflictError):
        return Exit.CONFLICT
    if isinstance(exc, AuthError):
        return Exit.AUTH
    if isinstance(exc, NotFoundError):
        return Exit.NOT_FOUND
    if isinstance(exc, InvalidRequestError):
        return Exit.USAGE
    if isinstance(exc, RateLimitError | ServerError | ServiceUnreachable):
        return Exit.UNAVAILABLE
    if isinstance(exc, ConfigurationError):
        return Exit.AUTH if "key" in str(exc).lower() else Exit.USAGE
    return Exit.UNAVAILABLE


@contextmanager
def errors(as_json: bool = False) -> Iterator[None]:
    """Turn SDK errors into one line on stderr (or the problem body with --json) and an exit code."""
    try:
        yield
    except ApiError as exc:
        detail = exc.detail or exc.title
        fields = exc.extra.get("errors")
        if isinstance(fields, list) and len(fields) > 1:
            detail += "".join(
                f"\n  {e.get('field')}: {e.get('message')}" for e in fields if isinstance(e, dict)
            )
        fail(f"{detail} ({exc.status} {exc.slug})", exit_code_for(exc), problem=exc.body, as_json=as_json)
    except ServiceUnreachable as exc:
        fail(
            f"{exc} — is the cloud running? (`ipucloud up`, or set --url / IPUCLOUD_URL)",
            Exit.UNAVAILABLE,
            problem={"type": "unreachable", "title": "Server unreachable", "detail": str(exc)},
            as_json=as_json,
        )
    except ConfigurationError as exc:
        fail(
            str(exc),
            exit_code_for(exc),
            problem={"type": "configuration", "detail": str(exc)},
            as_json=as_json,
        )


@contextmanager
def connect(url: str | None, key: str | None, as_json: bool = False) -> Iterator[Client]:
    with errors(as_json):
        client = Client(url, key)
        try:
            yield client
        finally:
            client.close()


def dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    typer.echo(json.dumps(dump(value), indent=2, default=str))


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold", show_edge=False, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("-" if v is None or v == "" else str(v) for v in r))
    return t


def show(renderable: Any) -> None:
    console().print(renderable)


def kv_table(rows: Sequence[tuple[str, Any]]) -> Table:
    t = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for k, v in rows:
        t.add_row(k, "-" if v is None or v == "" else str(v))
    return t


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = float(seconds)
    if s == 0:
        return "0 s"
    if s < 0.001:  # a small model's step: "0 ms" said nothing
        return f"{s * 1e6:.0f} µs"
    if s < 0.01:
        return f"{s * 1000:.2f} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def parse_ipus(value: str | None) -> int | str | None:
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if value.isascii() and value.isdigit():
        return int(value)
    fail(f"--ipus must be a power of two or `auto`, got {value!r}", Exit.USAGE)


def parse_time(value: str | None, flag: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f"{flag} must be an ISO 8601 time such as 2026-12-01T00:00:00Z, got {value!r}", Exit.USAGE)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
