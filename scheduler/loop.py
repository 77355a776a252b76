"""The live scheduler: leader election, scheduling passes, the outbox dispatcher, the reconciler.

Every replica runs this loop; only the leader acts, and each of its write transactions begins by
fencing its lease (services.leader). The loop wakes on Redis events (submit, finish, cancel,
machine change) and at least every `scheduler_tick_s`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

import redis
from celery import Celery
from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from scheduler import bus
from scheduler.broker import TASK_NAME, make_celery
from scheduler.db import Database
from scheduler.models import (
    Attempt,
    AttemptState,
    Job,
    JobState,
    OutboxMessage,
    Partition,
    Plan,
    Tenant,
)
from scheduler.policy import QueuedJob, RunningJob, Snapshot, TenantState, decide
from scheduler.routing import Router
from scheduler.services import attempts, fleet, leader, reconciler
from scheduler.services.clock import db_now
from scheduler.services.leader import Fence, NotLeader
from scheduler.settings import Settings

log = logging.getLogger("ipucloud.scheduler")

PASSES = Counter("ipucloud_scheduler_passes_total", "Scheduling passes run by the leader")
PLACED = Counter("ipucloud_jobs_placed_total", "Attempts placed on a partition")
PUBLISHED = Counter("ipucloud_outbox_published_total", "Outbox messages published to the broker")
REPUBLISHED = Counter("ipucloud_outbox_republished_total", "Outbox messages published again (not taken)")
LOST = Counter("ipucloud_attempts_lost_total", "Attempts ended as lost because their lease expired")
ORPHANS = Counter("ipucloud_orphan_partitions_freed_total", "Partitions freed whose job had gone")
CONFLICTS = Counter("ipucloud_placement_conflicts_total", "Placements refused by the database")
PASS_SECONDS = Histogram("ipucloud_scheduler_pass_seconds", "Time of one scheduling pass")
IS_LEADER = Gauge("ipucloud_scheduler_is_leader", "1 while this replica leads")
QUEUED = Gauge("ipucloud_jobs_queued", "Jobs waiting for a partition (as of the last pass)")


def _epoch_s(dt: object) -> float:
    return dt.timestamp()  # type: ignore[attr-defined]


@dataclass
class SchedulerLoop:
    settings: Settings
    db: Database
    celery: Celery | None = None
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    fence_token: Fence | None = None
    sync: fleet.AllocatorSync | None = None
    last_reconcile: float = 0.0
    stop_event: threading.Event = field(default_factory=threading.Event)
    router: Router | None = None

    def __post_init__(self) -> None:
        self.sync = fleet.AllocatorSync(self.settings.placement_policy)
        if self.router is None:
            self.router = Router(bus.get_redis)
        if self.celery is None:
            self.celery = make_celery(self.settings)

    # Leadership -----------------------------------------------------------------------------

    def lead(self) -> bool:
        with self.db.write() as s:
            fence = leader.try_acquire(session=s, holder=self.holder, ttl_s=self.settings.leader_lease_s)
        if fence is not None and (self.fence_token is None or fence.epoch != self.fence_token.epoch):
            log.info("%s leads the scheduler at epoch %d", self.holder, fence.epoch)
            assert self.sync is not None
            self.sync.invalidate()
        self.fence_token = fence
        IS_LEADER.set(1 if fence else 0)
        return fence is not None

    def _fence(self, session: Session) -> None:
        if self.fence_token is None:
            raise NotLeader("not the leader")
        leader.fence(session=session, fence=self.fence_token, ttl_s=self.settings.leader_lease_s)

    def step_down(self) -> None:
        if self.fence_token is not None:
            try:
                with self.db.write() as s:
                    leader.release(session=s, fence=self.fence_token)
            except Exception as exc:  # the lease then simply expires
                log.warning("could not release the leader lease: %s", exc)
            self.fence_token = None
            IS_LEADER.set(0)

    # One iteration ----------------------------------------------------------------------------

    def iterate(self) -> None:
        if not self.lead():
            return
        try:
            now = time.monotonic()
            if now - self.last_reconcile >= min(1.0, self.settings.scheduler_tick_s):
                self.reconcile()
                self.last_reconcile = now
            self.schedule_pass()
            self.dispatch()
        except NotLeader as exc:
            log.warning("lost leadership mid-pass: %s", exc)
            self.fence_token = None
            IS_LEADER.set(0)

    # Scheduling ---------------------------------------------------------------------------------

    def schedule_pass(self) -> int:
        """Place what the policy says can start now; returns the number of attempts placed."""
        assert self.sync is not None
        with PASS_SECONDS.time(), self.db.write() as s:
            self._fence(s)
            PASSES.inc()
            alloc = self.sync.refresh(s)
            snapshot = self._snapshot(s, alloc)
            QUEUED.set(len(snapshot.queued))
            if not snapshot.queued:
                return 0
            decision = decide(snapshot, policy=self.settings.placement_policy)
            placed = 0
            jobs = {
                j.id: j
                for j in s.execute(
                    select(Job).where(Job.id.in_([q.id for q, _ in decision.starts]))
                ).scalars()
            }
            for queued, where in decision.starts:
                job = jobs[queued.id]
                if isinstance(where, str):
                    partition = fleet.get_live_partition(session=s, name=where)
                    assert partition is not None
                else:
                    try:
                        partition = fleet.insert_partition(
                            session=s,
                            name=where.partition_id,
                            kind="job",
                            placement=where,
                            tenant_id=job.tenant_id,
                            job_id=job.id,
                        )
                    except fleet.PlacementConflict as exc:
                        CONFLICTS.inc()
                        log.warning("placement of %s refused by the database: %s", job.id, exc)
                        self.sync.invalidate()
                        break
                    self.sync.known[partition.pk] = partition.name
                attempts.place(session=s, job=job, partition=partition, queue=self.queue_for(partition))
                placed += 1
            PLACED.inc(placed)
            return placed

    def queue_for(self, partition: Partition) -> str:
        """The most specific queue a live worker serves: the partition's pod, its machine type, default."""
        assert self.router is not None
        return self.router.queue_for(partition.machine_type, partition.ipu_ids)

    def _snapshot(self, s: Session, alloc: object) -> Snapshot:
        now = time.time()
        live = (
            select(Attempt.job_id)
            .where(Attempt.state.in_([AttemptState.PLACED, AttemptState.RUNNING]))
            .scalar_subquery()
        )
        rows = s.execute(
            select(
                Job.id,
                Job.tenant_id,
                Job.ipus,
                Job.created_at,
                Job.predicted_runtime_s,
                Job.priority,
                Job.machine_type,
                Job.partition_name,
            ).where(Job.state == JobState.QUEUED, Job.cancel_requested.is_(False), Job.id.not_in(live))
        ).all()
        queued = [
            QueuedJob(
                id=r[0],
                tenant_id=r[1],
                size=r[2],
                submitted_at=_epoch_s(r[3]),
                predicted_runtime_s=r[4],
                priority=r[5],
                machine_type=r[6],
                partition=r[7],
            )
            for r in rows
        ]
        running_rows = s.execute(
            select(
                Attempt.job_id,
                Attempt.tenant_id,
                Attempt.size,
                Partition.name,
                Attempt.placed_at,
                Job.predicted_runtime_s,
                Job.priority,
            )
            .join(Partition, Partition.pk == Attempt.partition_pk)
            .join(Job, Job.id == Attempt.job_id)
            .where(Attempt.state.in_([AttemptState.PLACED, AttemptState.RUNNING]))
        ).all()
        running = [
            RunningJob(
                id=r[0],
                tenant_id=r[1],
                size=r[2],
                partition=r[3],
                started_at=_epoch_s(r[4]),
                expected_end=_epoch_s(r[4]) + r[5],
                priority=r[6],
            )
            for r in running_rows
        ]
        tenant_ids = {q.tenant_id for q in queued}
        counts: dict[str, int] = {}
        for r in running:
            counts[r.tenant_id] = counts.get(r.tenant_id, 0) + 1
        tenants: dict[str, TenantState] = {}
        if tenant_ids:
            for tid, max_conc in s.execute(
                select(Tenant.id, Plan.max_concurrent_jobs)
                .join(Plan, Plan.name == Tenant.plan_name)
                .where(Tenant.id.in_(tenant_ids))
            ).tuples():
                tenants[tid] = TenantState(
                    id=tid, max_concurrent_jobs=max_conc, running_jobs=counts.get(tid, 0)
                )
        busy = {r.partition for r in running}
        reserved_free = dict(
            s.execute(
                select(Partition.name, Partition.tenant_id).where(
                    Partition.kind == "reserved", Partition.released_at.is_(None)
                )
            )
            .tuples()
            .all()
        )
        for name in busy:
            reserved_free.pop(name, None)
        return Snapshot(
            now=now,
            queued=queued,
            running=running,
            tenants=tenants,
            allocator=alloc,
            reserved_free={k: v for k, v in reserved_free.items() if v},
        )  # type: ignore[arg-type]

    # Dispatch -------------------------------------------------------------------------------------

    def dispatch(self, limit: int = 1000) -> int:
        """Publish outbox rows not yet published. A second publish is harmless (take is a CAS).

        The queue is chosen again at every publish, one level wider each time (scheduler/routing.py),
        so a republish after a worker host died goes to a queue that is served now; the row keeps
        the queue last used."""
        assert self.celery is not None and self.router is not None
        with self.db.read() as s:
            pending = s.execute(
                select(
                    OutboxMessage.id,
                    OutboxMessage.queue,
                    OutboxMessage.payload,
                    OutboxMessage.publish_count,
                    Partition.machine_type,
                    Partition.ipu_ids,
                )
                .join(Attempt, Attempt.id == OutboxMessage.attempt_id)
                .join(Partition, Partition.pk == Attempt.partition_pk)
                .where(OutboxMessage.published_at.is_(None), OutboxMessage.acked_at.is_(None))
                .order_by(OutboxMessage.id)
                .limit(limit)
            ).all()
        if not pending:
            return 0
        sent: dict[str, list[int]] = {}
        try:
            with self.celery.producer_or_acquire() as producer:
                for oid, _stored, payload, published, machine_type, ipu_ids in pending:
                    queue = self.router.queue_for(machine_type, ipu_ids, widen=published)
                    self.celery.send_task(
                        TASK_NAME,
                        args=[payload["attempt_id"], payload["epoch"]],
                        queue=queue,
                        producer=producer,
                    )
                    sent.setdefault(queue, []).append(oid)
        except Exception as exc:  # broker down: what was not marked is published again next time
            done = sum(len(ids) for ids in sent.values())
            log.warning("publishing to the broker failed after %d of %d: %s", done, len(pending), exc)
        if sent:
            with self.db.write() as s:
                self._fence(s)
                # The reconciler judges "published too long ago" on the database's clock too.
                now = db_now(s)
                for queue, ids in sent.items():
                    s.execute(
                        update(OutboxMessage)
                        .where(OutboxMessage.id.in_(ids))
                        .values(queue=queue, published_at=now, publish_count=OutboxMessage.publish_count + 1)
                    )
            PUBLISHED.inc(sum(len(ids) for ids in sent.values()))
        return sum(len(ids) for ids in sent.values())

    # Reconciliation ---------------------------------------------------------------------------------

    def reconcile(self) -> reconciler.Repairs:
        """Repair what faults left behind (services.reconciler), in one fenced transaction."""
        assert self.fence_token is not None
        with self.db.write() as s:
            self._fence(s)
            repairs = reconciler.reconcile(
                session=s,
                leader_epoch=self.fence_token.epoch,
                max_attempts=self.settings.max_attempts,
                outbox_retry_s=self.settings.outbox_retry_s,
            )
        # Counted once committed: a pass rolled back by a lost lease repaired nothing.
        LOST.inc(repairs.count(reconciler.LEASE_EXPIRED))
        REPUBLISHED.inc(repairs.count(reconciler.OUTBOX_REPUBLISHED))
        ORPHANS.inc(repairs.count(reconciler.ORPHAN_PARTITION_FREED))
        return repairs

    # Running ------------------------------------------------------------------------------------------

    def run(self) -> None:
        """Loop until `stop_event` is set; wakes on bus events or every tick."""
        log.info("scheduler replica %s stands by until it holds the leader lease", self.holder)
        pubsub = None
        while not self.stop_event.is_set():
            try:
                if pubsub is None:
                    pubsub = bus.get_redis().pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(bus.WAKE_CHANNEL)
            except redis.RedisError as exc:
                log.warning("event bus unavailable (%s); polling every tick", exc)
                pubsub = None
            try:
                self.iterate()
            except Exception:
                log.exception("scheduler iteration failed; retrying")
                time.sleep(min(1.0, self.settings.scheduler_tick_s))
            self._wait(pubsub)
        self.step_down()

    def _wait(self, pubsub: object) -> None:
        if self.stop_event.is_set():
            return  # step down now: the next replica leads without waiting out a tick
        deadline = time.monotonic() + self.settings.scheduler_tick_s
        if pubsub is None:
            self.stop_event.wait(self.settings.scheduler_tick_s)
            return
        try:
            msg = pubsub.get_message(timeout=self.settings.scheduler_tick_s)  # type: ignore[attr-defined]
            if msg is not None:
                # Batch a burst of submissions into one pass: drain what is already there.
                while time.monotonic() < deadline and pubsub.get_message(timeout=0) is not None:  # type: ignore[attr-defined]
                    pass
        except (redis.RedisError, OSError) as exc:
            log.warning("event bus error: %s", exc)
            self.stop_event.wait(self.settings.scheduler_tick_s)


def queue_depth(db: Database) -> int:
    with db.read() as s:
        return s.execute(
            select(func.count()).select_from(Job).where(Job.state == JobState.QUEUED)
        ).scalar_one()
