"""The `ipucloud` command: servers (`up`, `api`, `vipu-server`, `scheduler`, `worker`, `migrate`), tools
(`estimate`, `simulate`, `gc-info`, `gc-monitor`) and the client commands that mirror the HTTP API."""

from __future__ import annotations

import sys
from typing import Any

import typer

# Run as servers, these load only the server commands: the client commands bring the SDK (its
# generated models, httpx) and numpy, which no server uses, and `ipucloud up` starts six processes.
SERVER_COMMANDS = frozenset(
    {"up", "api", "vipu-server", "scheduler", "worker", "migrate", "bootstrap", "notifier"}
)

_app: typer.Typer | None = None


def build(*, servers_only: bool = False) -> typer.Typer:
    from ipucloud.cli import server
    from ipucloud.cli.notifier import register as register_notifier

    app = typer.Typer(
        name="ipucloud",
        help=(
            "An IPU developer cloud: Virtual-IPU partitions, fair scheduling, emulated IPUs, exact metering."
        ),
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    server.register(app)
    if not servers_only:
        from ipucloud.cli import client, gctools, tools

        tools.register(app)
        client.register(app)
        gctools.register(app)
    register_notifier(app)
    return app


def __getattr__(name: str) -> Any:
    # `ipucloud.cli.app`, the whole command, built on first use.
    global _app
    if name == "app":
        if _app is None:
            _app = build()
        return _app
    raise AttributeError(name)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] in SERVER_COMMANDS:
        build(servers_only=True)()
    else:
        __getattr__("app")()
