"""`ipucloud notifier`: the process that delivers webhooks (workers/notifier.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from ipucloud.cli.server import _configure_logging, _preflight, _settings_or_exit


def notifier(
    concurrency: Annotated[
        int | None,
        typer.Option(help="Deliveries sent at once (default IPUCLOUD_NOTIFIER_CONCURRENCY).", min=1, max=256),
    ] = None,
    hostname: Annotated[
        str | None, typer.Option(help="Celery node name (default notifier@<host>); unique per replica.")
    ] = None,
) -> None:
    """Deliver webhooks: events from the outbox, signed, retried with backoff for about three days."""
    settings = _settings_or_exit()
    _configure_logging(settings)
    _preflight(settings)
    from workers.notifier import QUEUE
    from workers.notifier import app as celery_app

    celery_app.worker_main(
        [
            "worker",
            "--queues",
            QUEUE,
            "--concurrency",
            str(concurrency or settings.notifier_concurrency),
            # Threads: a delivery mostly waits on its receiver.
            "--pool",
            "threads",
            "--loglevel",
            settings.log_level,
            "--without-gossip",
            "--without-mingle",
            "--hostname",
            hostname or "notifier@%h",
        ]
    )


def register(app: typer.Typer) -> None:
    app.command()(notifier)
