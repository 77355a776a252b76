"""The Celery worker: `celery -A workers.app worker` or `ipucloud worker`.

The task is thin: it hands the attempt to the runner, which takes the lease and does the work
through scheduler/ functions. Its return value is never read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from celery import signals

from scheduler.broker import TASK_NAME, make_celery
from scheduler.bus import reset_redis
from scheduler.db import reset_database

log = logging.getLogger("ipucloud.worker")

app = make_celery()


def stopping_flag(main_pid: int) -> Path:
    """A file the main worker process creates on shutdown; pool children poll it (they get no signal)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"ipucloud-worker-{main_pid}.stopping"


@signals.worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    # Connections opened before the fork belong to the parent; every pool child opens its own.
    reset_database()
    reset_redis()


@signals.worker_shutting_down.connect
def _announce_shutdown(**_: Any) -> None:
    stopping_flag(os.getpid()).touch()
    log.info("worker shutting down: running attempts finish or are handed back within the grace period")


@signals.worker_ready.connect
def _clear_flag(**_: Any) -> None:
    stopping_flag(os.getpid()).unlink(missing_ok=True)


@app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_attempt(self: Any, attempt_id: int, epoch: int) -> str:
    from workers.runner import run

    return run(attempt_id=attempt_id, epoch=epoch, worker=self.request.hostname or "worker")
