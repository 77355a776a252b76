"""The host agent as a Celery worker: `ipucloud worker` (or `celery -A workers.app worker -P threads`).

Celery carries dispatch only. The worker runs the threads pool, and its one task hands "attempt N
is ready" to the process's host agent (workers/agent.py) and returns once the agent has taken the
attempt durably, so the broker never holds a message for longer than a take. Everything after that
(the run, its heartbeats, its end) is the agent's, in its own loop. The task's return value is
never read.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

from celery import signals
from celery.exceptions import Reject

from scheduler import routing, runtime
from scheduler.broker import TASK_NAME, make_celery
from scheduler.bus import redis_from_url
from scheduler.runtime import Runtime
from scheduler.settings import get_settings
from workers.agent import Agent

log = logging.getLogger("ipucloud.worker")

app = make_celery()


@dataclass
class WorkerState:
    """This worker process's runtime, host agent and queue registration: the agent's counterpart of
    the API's `app.state`. Celery calls the signal handlers and the task below as plain module
    functions, so they reach it through the process's runtime (`scheduler.runtime.current()`,
    installed when the worker starts), where it hangs under this class."""

    runtime: Runtime
    agent: Agent | None = None
    registration: routing.Registration | None = None


_state_lock = threading.Lock()


def worker_state() -> WorkerState:
    rt = runtime.current()
    with _state_lock:
        state = rt.extras.get(WorkerState)
        if not isinstance(state, WorkerState):
            state = rt.extras[WorkerState] = WorkerState(rt)
        return state


def current_agent() -> Agent:
    """This process's host agent (started with the worker; made here if a task comes first)."""
    state = worker_state()
    with _state_lock:
        if state.agent is None:
            settings = state.runtime.settings
            node = getattr(app.conf, "ipucloud_node", None) or "agent"
            state.agent = Agent(
                settings=settings,
                db=state.runtime.db,
                name=node,
                queues=[q.strip() for q in settings.worker_queues.split(",") if q.strip()],
                redis_client=state.runtime.redis_client(),
                cluster_clock=state.runtime.clock,
                on_name_taken=_exit_name_taken,
            )
            state.agent.start()
        return state.agent


EXIT_NAME_TAKEN = 3


def _exit_name_taken(message: str) -> None:
    """Another live worker holds this agent's name: say so where the operator looks, and exit (the
    agent never registered, so nothing runs here)."""
    print(f"ipucloud worker: {message}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(EXIT_NAME_TAKEN)


@signals.celeryd_init.connect
def _name_the_agent(sender: str | None = None, **_: Any) -> None:
    # The Celery node name (`-n`, unique per worker) is the agent's name and its lease's key.
    app.conf.ipucloud_node = sender


@signals.worker_init.connect
def _start_agent(**_: Any) -> None:
    from workers import faults

    # The worker's runtime, built once from its settings before any task runs.
    runtime.install(runtime.Runtime.from_settings(get_settings()))
    faults.warn_if_enabled()
    current_agent()


@signals.worker_ready.connect
def _register_queues(sender: Any = None, **_: Any) -> None:
    # Only once its consumers run may the dispatcher count on this worker (scheduler/routing.py).
    state = worker_state()
    settings = state.runtime.settings
    queues = sorted(sender.app.amqp.queues.consume_from)
    timeout = min(5.0, settings.routing_ttl_s / 3)
    client = redis_from_url(settings.broker_url, socket_timeout=timeout, socket_connect_timeout=timeout)
    state.registration = routing.Registration(lambda: client, sender.hostname, queues, settings.routing_ttl_s)
    state.registration.start()
    log.info("%s serves queues %s", sender.hostname, ", ".join(queues))
    idle = [q for q in queues if not routing.is_routable(q)]
    if idle:
        log.warning("no attempt is ever published to %s (see IPUCLOUD_WORKER_QUEUES)", ", ".join(idle))


@signals.worker_shutting_down.connect
def _begin_shutdown(**_: Any) -> None:
    state = worker_state()
    if state.registration is not None:
        state.registration.stop()
    if state.agent is not None:
        state.agent.stop()


@signals.worker_shutdown.connect
def _finish_shutdown(**_: Any) -> None:
    state = worker_state()
    if state.registration is not None:
        state.registration.join(timeout=5.0)
    if state.agent is not None:
        settings = state.runtime.settings
        state.agent.stop()
        if not state.agent.join(settings.worker_grace_s + settings.lease_s):
            log.warning("agent did not wind down in time; its lease will lapse")


@app.task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True)
def run_attempt(self: Any, attempt_id: int, epoch: int) -> str:
    agent = current_agent()
    outcome = agent.take(attempt_id, epoch)
    if outcome == "stopping":
        # Back on the queue for an agent that is staying.
        raise Reject("this host agent is shutting down", requeue=True)
    return outcome
