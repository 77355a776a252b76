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
from celery.exceptions import Reject

from scheduler import routing
from scheduler.broker import TASK_NAME, make_celery
from scheduler.bus import redis_from_url, reset_redis
from scheduler.db import reset_database
from scheduler.settings import get_settings

log = logging.getLogger("ipucloud.worker")

app = make_celery()

_registration: routing.Registration | None = None


def stopping_flag(main_pid: int) -> Path:
    """A file the main worker process creates on shutdown; pool children poll it (they get no signal)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"ipucloud-worker-{main_pid}.stopping"


@signals.worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    # Connections opened before the fork belong to the parent; every pool child opens its own.
    reset_database()
    reset_redis()


@signals.worker_ready.connect
def _warn_fault_injection(**_: Any) -> None:
    from workers import faults

    faults.warn_if_enabled()


@signals.worker_shutting_down.connect
def _announce_shutdown(**_: Any) -> None:
    stopping_flag(os.getpid()).touch()
    log.info("worker shutting down: running attempts finish or are handed back within the grace period")


@signals.worker_ready.connect
def _clear_flag(**_: Any) -> None:
    stopping_flag(os.getpid()).unlink(missing_ok=True)


@signals.worker_shutdown.connect
def _remove_flag(**_: Any) -> None:
    # The pool has finished by now; the flag would otherwise outlive the worker in TMPDIR.
    stopping_flag(os.getpid()).unlink(missing_ok=True)


@signals.worker_ready.connect
def _register_queues(sender: Any = None, **_: Any) -> None:
    # Only once its consumers run may the dispatcher count on this worker (scheduler/routing.py).
    global _registration
    settings = get_settings()
    queues = sorted(sender.app.amqp.queues.consume_from)
    timeout = min(5.0, settings.routing_ttl_s / 3)
    client = redis_from_url(settings.broker_url, socket_timeout=timeout, socket_connect_timeout=timeout)
    _registration = routing.Registration(lambda: client, sender.hostname, queues, settings.routing_ttl_s)
    _registration.start()
    log.info("%s serves queues %s", sender.hostname, ", ".join(queues))
    idle = [q for q in queues if not routing.is_routable(q)]
    if idle:
        log.warning("no attempt is ever published to %s (see IPUCLOUD_WORKER_QUEUES)", ", ".join(idle))


@signals.worker_shutting_down.connect
def _withdraw_queues(**_: Any) -> None:
    if _registration is not None:
        _registration.stop()


@signals.worker_shutdown.connect
def _wait_for_withdrawal(**_: Any) -> None:
    if _registration is not None:
        _registration.join(timeout=5.0)


@app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_attempt(self: Any, attempt_id: int, epoch: int) -> str:
    from workers import runner

    if runner.terminated():
        # This pool process was sent SIGTERM and has handed back what it ran: it goes now, and
        # Celery requeues this message for another process (reject_on_worker_lost). Rejecting it
        # instead would hand it straight back to this same process, over and over.
        os._exit(runner.TERMINATED_EXIT_CODE)
    if runner.refusing_work():
        # The worker is shutting down: back on the queue for a worker that is staying.
        raise Reject("this worker is shutting down", requeue=True)
    return runner.run(attempt_id=attempt_id, epoch=epoch, worker=self.request.hostname or "worker")
