"""The `ipucloud` command: servers (`up`, `api`, `vipu-server`, `scheduler`, `worker`, `migrate`), tools
(`estimate`, `simulate`, `gc-info`, `gc-monitor`) and the client commands that mirror the HTTP API."""

from __future__ import annotations

import typer

from ipucloud.cli import client, gctools, server, tools
from ipucloud.cli.notifier import register as register_notifier

app = typer.Typer(
    name="ipucloud",
    help="An IPU developer cloud: Virtual-IPU partitions, fair scheduling, emulated IPUs, exact metering.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
server.register(app)
tools.register(app)
client.register(app)
gctools.register(app)
register_notifier(app)


def main() -> None:
    app()
