"""The Celery application, shared by the dispatcher (which only sends) and the workers.

The broker carries only "attempt N is ready"; results are never stored or read (docs/architecture.md).
"""

from __future__ import annotations

import logging

from celery import Celery
from kombu.exceptions import ChannelError

from scheduler.settings import Settings, get_settings

log = logging.getLogger(__name__)

TASK_NAME = "ipucloud.run_attempt"
DEFAULT_QUEUE = "ipucloud"


def celery_broker_url(url: str) -> str:
    """redis-py spells a Unix socket `unix://`, kombu spells it `redis+socket://`."""
    if url.startswith("unix://"):
        return "redis+socket://" + url[len("unix://") :]
    return url


def make_celery(settings: Settings | None = None) -> Celery:
    s = settings or get_settings()
    app = Celery("ipucloud", broker=celery_broker_url(s.broker_url))
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # A delivery holds its thread for milliseconds (run_attempt returns once the attempt is
        # taken), so there is nothing long to cancel when the broker connection drops; and the
        # threads pool cannot cancel a task at all (it has no kill_job): asked to, Celery 5.6
        # stops the whole worker as on an unrecoverable error. An unacked delivery is redelivered
        # or republished by the outbox, and the take's CAS turns the duplicate away.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        result_backend=None,
        task_default_queue=DEFAULT_QUEUE,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # A redelivery after the visibility timeout is a duplicate the lease CAS turns away, so
        # this only bounds how long a message of a dead worker waits before another worker sees it
        # (the outbox republishes it long before). A broker that vanishes without closing the
        # connection (a cut cable, a failover) must not hang a publish forever: the socket
        # timeouts bound it. kombu's health checks are its own best effort against half-open
        # consumer connections; nothing here relies on them (the fault suite saw a cut-off worker
        # not notice for many seconds): leases in the database decide what a worker may run, and
        # the outbox republishes whatever a cut-off worker never received.
        broker_transport_options={
            "visibility_timeout": 3600,
            "socket_keepalive": True,
            "socket_timeout": 15,
            "socket_connect_timeout": 5,
            "health_check_interval": 10,
        },
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_enable_remote_control=True,
        enable_utc=True,
    )
    return app


def queue_depth(app: Celery, queue: str) -> int | None:
    """How many messages wait in `queue` on the broker; None when the broker cannot be asked.

    Only a hint for the reconciler (whether an untaken attempt may still be waiting its turn), so
    any failure to ask is "unknown", never an error. On Redis a queue is a list, and a list that
    does not exist is an empty one.
    """
    try:
        with app.connection_for_read() as conn:
            # One try: a broker that is down must not hold up the reconciler's other repairs.
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=2)
            return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
    except ChannelError:
        return 0  # "NOT_FOUND": no list of that name, so nothing waits in it
    except Exception as exc:
        log.debug("could not read the depth of queue %s: %s", queue, exc)
        return None
