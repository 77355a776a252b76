"""The host agent as a Celery worker: `ipucloud worker` (or `celery -A workers.app worker -P threads`).

Celery carries dispatch only. The worker runs the threads pool, and its one task hands "attempt N
is ready" to the process's host agent (workers/agent.py) and returns once the agent has taken the
attempt durably, so the broker never holds a message for longer than a take. Everything after that
(the run, its heartbeats, its end) is the agent's, in its own loop. The task's return value is
never read.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import signals
from celery.exceptions import Reject

from scheduler import routing
from scheduler.broker import TASK_NAME, make_celery
from scheduler.bus import redis_from_url
from scheduler.db import get_database
from scheduler.settings import get_settings
from workers.agent import Agent

log = logging.getLogger("ipucloud.worker")

app = make_celery()

_registration: routing.Registration | None = None
_agent: Agent | None = None
_agent_lock = threading.Lock()


def current_agent() -> Agent:
    """This process's host agent (started with the worker; made here if a task comes first)."""
    global _agent
    with _agent_lock:
        if _agent is None:
            settings = get_settings()
            node = getattr(app.conf, "ipucloud_node", None) or "agent"
            _agent = Agent(
                settings=settings,
                db=get_database(settings),
                name=node,
                queues=[q.strip() for q in settings.worker_queues.split(",") if q.strip()],
            )
            _agent.start()
        return _agent


@signals.celeryd_init.connect
def _name_the_agent(sender: str | None = None, **_: Any) -> None:
    # The Celery node name (`-n`, unique per worker) is the agent's name and its lease's key.
    app.conf.ipucloud_node = sender


@signals.worker_init.connect
def _start_agent(**_: Any) -> None:
    from workers import faults

    faults.warn_if_enabled()
    current_agent()


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
def _begin_shutdown(**_: Any) -> None:
    if _registration is not None:
        _registration.stop()
    if _agent is not None:
        _agent.stop()


@signals.worker_shutdown.connect
def _finish_shutdown(**_: Any) -> None:
    if _registration is not None:
        _registration.join(timeout=5.0)
    if _agent is not None:
        settings = get_settings()
        _agent.stop()
        if not _agent.join(settings.worker_grace_s + settings.lease_s):
            log.warning("agent did not wind down in time; its lease will lapse")


@app.task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True)
def run_attempt(self: Any, attempt_id: int, epoch: int) -> str:
    agent = current_agent()
    outcome = agent.take(attempt_id, epoch)
    if outcome == "stopping":
        # Back on the queue for an agent that is staying.
        raise Reject("this host agent is shutting down", requeue=True)
    return outcome
