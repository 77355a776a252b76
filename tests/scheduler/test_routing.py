"""Worker routing: attempts go to the most specific queue a live worker serves, and a republish
after that worker's registration lapsed goes to a queue that is served now."""

from __future__ import annotations

import time
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select, update

from scheduler import broker, routing
from scheduler.jobspec import JobSpec
from scheduler.loop import SchedulerLoop
from scheduler.models import OutboxMessage, Partition, utcnow
from scheduler.routing import Router
from scheduler.runtime import Runtime
from scheduler.services.batch import jobs
from scheduler.services.tenancy import tenants
from scheduler.settings import Settings, get_settings


class RecordingCelery:
    def __init__(self) -> None:
        self.sent: list[tuple[int, str]] = []

    def producer_or_acquire(self) -> Any:
        return nullcontext(None)

    def send_task(self, name: str, args: list[Any], queue: str, producer: Any = None) -> None:
        self.sent.append((args[0], queue))


def test_queues_are_tried_pod_first_then_machine_type_then_default() -> None:
    one_pod = ["pod0003-m00-i0", "pod0003-m00-i1"]
    assert routing.candidates("m2000", one_pod) == ["pod0003", "m2000", "ipucloud"]
    two_pods = ["pod0005-m15-i3", "pod0004-m00-i0"]
    assert routing.candidates("bow", two_pods) == ["pod0004", "pod0005", "bow", "ipucloud"]
    assert routing.candidates("c2", ["srv0002-i04", "srv0002-i05"]) == ["srv0002", "c2", "ipucloud"]
    assert routing.parse_queues("srv0002,c2") == ["srv0002", "c2"]
    options = routing.candidates("m2000", one_pod)
    assert routing.choose(options, frozenset({"ipucloud", "m2000", "pod0003"})) == "pod0003"
    assert routing.choose(options, frozenset({"ipucloud", "m2000", "pod0001"})) == "m2000"
    assert routing.choose(options, frozenset({"ipucloud", "bow"})) == "ipucloud"
    # A site that serves only other racks is never sent this pod's work; it waits on the default.
    assert routing.choose(options, frozenset({"bow", "pod0001"})) == "ipucloud"


def test_each_untaken_republish_widens_one_served_level() -> None:
    options = routing.candidates("m2000", ["pod0003-m00-i0"])
    everything = frozenset({"pod0003", "m2000", "ipucloud"})
    assert [routing.choose(options, everything, widen=n) for n in range(4)] == [
        "pod0003",
        "m2000",
        "ipucloud",
        "ipucloud",
    ]
    # Levels nobody serves are skipped, not waited on.
    assert [routing.choose(options, frozenset({"pod0003", "ipucloud"}), widen=n) for n in range(3)] == [
        "pod0003",
        "ipucloud",
        "ipucloud",
    ]
    assert routing.choose(options, frozenset({"pod0003"}), widen=5) == "pod0003"


def test_the_default_queue_is_the_brokers() -> None:
    assert routing.DEFAULT_QUEUE == broker.DEFAULT_QUEUE


def test_a_worker_queue_nobody_publishes_to_is_refused_at_start() -> None:
    assert Settings(worker_queues=" pod0003 , m2000,pod0003").worker_queues == "pod0003,m2000"
    for bad in ("pod3", "M2000", "gpu", " , "):
        with pytest.raises(ValidationError, match=r"worker_queues[\s\S]*(never publishes to|names no queue)"):
            Settings(worker_queues=bad)


def test_registrations_lapse_unless_refreshed(runtime: Runtime) -> None:
    client = runtime.redis
    client.delete(routing.ROUTING_KEY)
    routing.register(client, "w1@a", ["pod0000", "ipucloud"], ttl_s=30)
    routing.register(client, "w2@b", ["ipucloud"], ttl_s=0.3)
    assert routing.live_registrations(client) == {"pod0000": {"w1@a"}, "ipucloud": {"w1@a", "w2@b"}}
    time.sleep(0.4)
    assert routing.live_registrations(client) == {"pod0000": {"w1@a"}, "ipucloud": {"w1@a"}}
    routing.deregister(client, "w1@a", ["pod0000", "ipucloud"])
    assert routing.live_registrations(client) == {}


def test_registration_thread_refreshes_and_withdraws(runtime: Runtime) -> None:
    client = runtime.redis
    client.delete(routing.ROUTING_KEY)
    reg = routing.Registration(lambda: client, "w@h", ["bow"], ttl_s=0.3)
    reg.start()
    try:
        time.sleep(0.8)  # well past one TTL: only refreshing keeps it
        assert routing.live_registrations(client) == {"bow": {"w@h"}}
    finally:
        reg.stop()
        reg.join(5)
    assert routing.live_registrations(client) == {}


def test_dispatch_follows_live_workers_and_republish_reroutes(db: Any, runtime: Runtime, seeded: Any) -> None:
    settings = get_settings()
    client = runtime.redis
    client.delete(routing.ROUTING_KEY)
    celery = RecordingCelery()
    loop = SchedulerLoop(settings=settings, db=db, celery=celery)  # type: ignore[arg-type]
    loop.router = Router(runtime.redis_client(), cache_s=0)
    with db.write() as s:
        tid = tenants.create_tenant(
            session=s, secret=settings.secret(), name="site", plan="standard", quota_ipu_hours=100
        ).tenant.id
        spec = JobSpec.model_validate(
            {"name": "r", "workload": {"model": "resnet50", "batch_size": 64, "steps": 10}, "ipus": 4}
        )
        jobs.submit_job(session=s, tenant_id=tid, spec=spec)
    assert loop.lead()
    assert loop.schedule_pass() == 1
    with db.read() as s:
        attempt_id = s.execute(select(OutboxMessage.attempt_id)).scalar_one()
        ipus = s.execute(select(Partition.ipu_ids).where(Partition.kind == "job")).scalar_one()
    pod = routing.candidates("m2000", ipus)[0]
    routing.register(client, "site@rack", [pod, "m2000"], ttl_s=0.5)
    routing.register(client, "anywhere@dc", ["ipucloud"], ttl_s=30)
    assert loop.dispatch() == 1
    assert celery.sent == [(attempt_id, pod)]

    time.sleep(0.6)  # the site's worker host went silent: its registration lapsed
    with db.write() as s:
        s.execute(update(OutboxMessage).values(published_at=utcnow() - timedelta(hours=1)))
    loop.reconcile()
    assert loop.dispatch() == 1
    assert celery.sent[-1] == (attempt_id, "ipucloud")
    with db.read() as s:
        row = s.execute(select(OutboxMessage.queue, OutboxMessage.publish_count)).one()
    assert tuple(row) == ("ipucloud", 2)
    client.delete(routing.ROUTING_KEY)


def test_queue_depth_counts_what_waits_on_the_broker(env: Any) -> None:
    """The reconciler's hint comes from the broker itself: a queue's messages until a worker takes them."""
    app = broker.make_celery(get_settings())
    queue = f"depth-{time.monotonic_ns()}"
    assert broker.queue_depth(app, queue) == 0, "on Redis a queue nobody used is an empty list"
    for n in range(3):
        app.send_task(broker.TASK_NAME, args=[n, 0], queue=queue)
    assert broker.queue_depth(app, queue) == 3
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)
    assert broker.queue_depth(app, queue) == 0
    broken = broker.make_celery(get_settings().model_copy(update={"redis_url": "redis://127.0.0.1:1/0"}))
    assert broker.queue_depth(broken, queue) is None, "an unreachable broker is 'unknown', not an error"
