"""The live scheduler: leader election, scheduling passes, the outbox dispatcher, the reconciler.

Every replica runs this loop; only the leader acts, and each of its write transactions begins by
fencing its lease (services.leader). The loop wakes on Redis events (submit, finish, cancel,
machine change) and at least every `scheduler_tick_s`.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import Celery
from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy.orm import Session

from scheduler import bus, inference, runtime
from scheduler.broker import TASK_NAME, make_celery
from scheduler.broker import queue_depth as broker_queue_depth
from scheduler.clock import Clock
from scheduler.db import Database
from scheduler.models import (
    Job,
    JobState,
    utcnow,
)
from scheduler.policy import Snapshot, Wait, decide
from scheduler.policy.forecast import forecast as forecast_starts
from scheduler.routing import Router
from scheduler.services import endpoints, sessions
from scheduler.services.batch import attempts, checkpoints, dependencies, outbox, scheduling
from scheduler.services.capacity import fleet, leader, reconciler
from scheduler.services.capacity.leader import Fence, NotLeader
from scheduler.services.clock import db_now
from scheduler.settings import Settings
from vipu.allocator import Allocator

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
BACKFILLED = Counter("ipucloud_jobs_backfilled_total", "Jobs started ahead of a blocked one (backfill)")
PREEMPTED = Counter("ipucloud_attempts_preempted_total", "Attempts stopped for higher-priority work")

# Attempts one pass places at most, and outbox messages one iteration publishes at most: a pass over
# tens of thousands of jobs that could start stays within the leader's lease, and the next follows.
MAX_STARTS_PER_PASS = 5000
MAX_DISPATCH_PER_ITERATION = 10_000
FORECAST_EVERY_S = 10.0  # wall seconds between forecasts of the queued jobs' starts
FORECAST_BUDGET_S = 0.5  # longest a forecast may take inside a pass (it holds the pass's transaction)
PRUNE_EVERY_S = 60.0  # wall seconds between prunings of checkpoints no one will read again
# Wall seconds between serve passes (scheduler/services/endpoints/): the autoscaler's delays are
# tens of seconds, and on SQLite each pass takes the one write lock.
SERVE_EVERY_S = 1.0


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Run a pass without Python's cyclic garbage collector.

    A pass at scale holds tens of thousands of live objects (ORM rows, the snapshot, rows to
    insert) and allocates many more, so the collector's generation-2 runs, each scanning all of
    them, took a third of the CPU of a pass placing 5,000 jobs (1.2 of 3.3 s for two such passes,
    docs/performance.md). Nearly all of it is freed by reference counting when the pass ends; what
    forms cycles waits for the collector's next run, after the pass."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class SchedulerLoop:
    settings: Settings
    db: Database
    celery: Celery | None = None
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    fence_token: Fence | None = None
    # When the last `lead()` that found this replica leading began (monotonic): see `_lease_fresh`.
    led_at: float = -math.inf
    sync: fleet.AllocatorSync | None = None
    last_reconcile: float = 0.0
    last_sweep: float = 0.0
    last_prune: float = -math.inf
    last_serve: float = -math.inf
    last_routes: float = -math.inf
    # The last pass left work for the next one (MAX_STARTS_PER_PASS, or a dispatch backlog).
    more: bool = False
    # Whether the last iteration's pass read a queue, and whether a submission's wake-up followed it:
    # the rest after an iteration is skipped only for a submission after one that read none (`run`).
    read_queue: bool = False
    submitted: bool = False
    stop_event: threading.Event = field(default_factory=threading.Event)
    router: Router | None = None
    # How many messages wait in a broker queue (None: unknown); the reconciler's hint.
    queue_depth: Callable[[str], int | None] | None = None
    # The event bus's client (wake-ups, routing); by default the process's runtime's
    # (scheduler/runtime.py), which `ipucloud scheduler` builds and installs at start-up.
    redis_client: Callable[[], redis.Redis] | None = None
    # Cluster time against the wall clock: the runtime's (`ipucloud scheduler` passes `rt.clock`);
    # by default the one `settings` describe, for loops built without a runtime (tests, tools).
    clock: Clock | None = None
    # Freeze the heap after the first iteration (`ipucloud scheduler` sets it): what the process has
    # built by then (SQLAlchemy's metadata, the policy's modules, the catalogue) lives as long as it,
    # and each full collection walked all of it, 270-630 ms of a core on a loaded 2-core machine that
    # the replicas and the API beside it were waiting for (benchmarks/endpoints.py).
    freeze_heap: bool = False
    # The scheduling pass's memory between passes (see schedule_pass): the explanation stored for
    # each queued job, and the queued jobs already shown to the placement policy's demand model.
    _waits: dict[str, Mapping[str, Any] | None] | None = None
    _seen: set[str] = field(default_factory=set)
    _waits_epoch: int | None = None
    _samples: list[dict[str, Any]] = field(default_factory=list)  # fair-share samples due after a pass
    _gated: dict[str, Wait] = field(default_factory=dict)  # queued jobs kept from the policy, and why
    # Forecast starts of the queued jobs (scheduler/policy/forecast.py) and when they were made.
    _forecast: dict[str, float] = field(default_factory=dict)
    _forecast_at: float = -math.inf

    @property
    def cluster_clock(self) -> Clock:
        assert self.clock is not None  # set by __post_init__
        return self.clock

    def __post_init__(self) -> None:
        if self.clock is None:
            self.clock = Clock.of(self.settings)
        self.sync = fleet.AllocatorSync(self.settings.placement_policy, clock=self.clock)
        self._policy = scheduling.live_policy(self.settings)
        if self.redis_client is None:
            self.redis_client = lambda: runtime.current().redis
        if self.router is None:
            self.router = Router(self.redis_client)
        if self.celery is None:
            self.celery = make_celery(self.settings)
        if self.queue_depth is None:
            celery = self.celery
            self.queue_depth = lambda queue: broker_queue_depth(celery, queue)

    # Leadership -----------------------------------------------------------------------------

    def lead(self) -> bool:
        began = time.monotonic()
        with self.db.write() as s:
            fence = leader.try_acquire(session=s, holder=self.holder, ttl_s=self.settings.leader_lease_s)
        if fence is not None and (self.fence_token is None or fence.epoch != self.fence_token.epoch):
            log.info("%s leads the scheduler at epoch %d", self.holder, fence.epoch)
            assert self.sync is not None
            self.sync.invalidate()
        self.fence_token = fence
        self.led_at = began if fence is not None else -math.inf
        IS_LEADER.set(1 if fence else 0)
        return fence is not None

    def _lease_fresh(self) -> bool:
        """Whether this replica led a quarter of a lease ago or less, so an iteration may go without its
        own `lead()` transaction. Every write of the iteration is fenced all the same (and each fence
        renews the lease), so a replica whose lease was taken over finds out at its first write; what
        the separate transaction cost was a commit on the path of every start (the iteration a
        submission wakes), docs/performance.md."""
        return (
            self.fence_token is not None and time.monotonic() - self.led_at < self.settings.leader_lease_s / 4
        )

    def _fence(self, session: Session) -> None:
        if self.fence_token is None:
            raise NotLeader("not the leader")
        leader.fence(session=session, fence=self.fence_token, ttl_s=self.settings.leader_lease_s)

    def _renew(self, session: Session) -> None:
        """Renew again at the end of a long transaction, so the lease runs from its commit."""
        self._fence(session)

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
        self.more = False
        self.read_queue = False
        if not self._lease_fresh() and not self.lead():
            return
        try:
            now = time.monotonic()
            reconcile_due = now - self.last_reconcile >= min(1.0, self.settings.scheduler_tick_s)
            # Woken by a submission, the pass and its dispatch come first and the repairs after them in
            # this same iteration: the reconciler's transaction (and every few seconds its sweeps across
            # all running work) sat before the pass on the path of one start in every few, which was the
            # start latency's tail (docs/performance.md). What it frees is placed by the next pass.
            reconcile_late = reconcile_due and self.submitted
            if reconcile_due and not reconcile_late:
                self.reconcile()
                self.last_reconcile = now
            if now - self.last_prune >= PRUNE_EVERY_S:
                self.prune_checkpoints()
                self.last_prune = now
            # Sessions first: one that ends frees its partition for this very pass.
            self.sweep_sessions()
            # Endpoints next: the replicas they add are placed by this very pass.
            if now - self.last_serve >= min(SERVE_EVERY_S, self.settings.scheduler_tick_s):
                self.serve_endpoints()
                self.last_serve = now
            self.resolve_dependencies()
            self.schedule_pass()
            sent = 0
            while sent < MAX_DISPATCH_PER_ITERATION:
                n = self.dispatch()
                sent += n
                if n < 1000:
                    break
            else:
                self.more = True
            if reconcile_late:
                self.reconcile()
                self.last_reconcile = now
        except NotLeader as exc:
            log.warning("lost leadership mid-pass: %s", exc)
            self.fence_token = None
            self.led_at = -math.inf
            IS_LEADER.set(0)

    # Scheduling ---------------------------------------------------------------------------------

    def schedule_pass(self) -> int:
        """Place what the policy says can start now; returns the number of attempts placed.

        The pass also stops what the policy preempts (when IPUCLOUD_PREEMPTION is on) and stores
        why every other queued job waits, for `GET /api/v1/jobs/{id}`.
        """
        assert self.sync is not None and self.fence_token is not None
        self._samples = []
        try:
            with _collector_paused():
                placed = self._schedule_pass()
        except BaseException:
            # `decide` allocates on the live allocator; a pass that did not commit must not leave
            # those placements behind in memory as phantoms.
            self.sync.invalidate()
            raise
        if self._samples:
            with self.db.write() as s:
                self._fence(s)
                scheduling.write_fairshare_samples(session=s, samples=self._samples)
        return placed

    def _schedule_pass(self) -> int:
        assert self.sync is not None and self.fence_token is not None
        with PASS_SECONDS.time(), self.db.write() as s:
            self._fence(s)
            PASSES.inc()
            if not scheduling.has_queued(session=s):
                # Nothing to decide: a fleet running tens of thousands of jobs is not read again
                # on every tick for nothing.
                QUEUED.set(0)
                return 0
            self.read_queue = True
            if self._waits_epoch != self.fence_token.epoch:
                # A new term: what an earlier leader stored is read once, then kept in step.
                self._waits, self._seen = None, set()
                self._waits_epoch = self.fence_token.epoch
            alloc = self.sync.refresh(s)
            snapshot = self._snapshot(s, alloc)
            QUEUED.set(len(snapshot.queue))
            if not len(snapshot.queue):
                assert self._waits is not None
                if snapshot.held:  # arrays at their max_running: when their next elements start
                    _date_waits(self._gated, self._forecast_for(snapshot))
                scheduling.record_waits(session=s, waits=self._gated, known=self._waits)
                return 0
            # The forecast only dates jobs left waiting, so it is made after the pass and only when
            # one is: at scale its replay costs as much as the pass (its first step is this pass again),
            # and a pass that starts every queued job has nothing to date. It replays from the state
            # this pass starts from, so when one is due it gets the allocator as it was before `decide`.
            before = (
                dataclasses.replace(snapshot, allocator=alloc.clone())
                if self._forecast_due(snapshot)
                else snapshot
            )
            decision = decide(snapshot, self._policy)
            if decision.waits or self._gated:
                forecast = self._forecast_for(before)
                _date_waits(decision.waits, forecast)
                _date_waits(self._gated, forecast)
            if decision.preempt:
                assert decision.reservation is not None
                waiting = snapshot.queue.get(decision.reservation.job_id)
                stopped = scheduling.preempt(
                    session=s,
                    victims=decision.preempt,
                    for_job=decision.reservation.job_id,
                    by_class=(
                        scheduling.by_service_class(self._policy, decision.preempt, waiting.priority)
                        if waiting is not None
                        else ()
                    ),
                    max_attempts=self.settings.max_attempts,
                    warning_s=self.settings.preemption_warning_s,
                    clock=self.cluster_clock,
                    grace_s=2 * self.settings.heartbeat_s + 0.5,
                )
                PREEMPTED.inc(stopped)
            if len(decision.starts) > MAX_STARTS_PER_PASS:
                # The rest start on the next pass, which follows at once: a bounded pass commits
                # within the leader's lease and lets dispatch and the agents work meanwhile.
                later = decision.starts[MAX_STARTS_PER_PASS:]
                decision.starts = decision.starts[:MAX_STARTS_PER_PASS]
                held = alloc.partitions()
                for _, where in later:
                    if not isinstance(where, str) and where.partition_id in held:
                        alloc.release(where.partition_id)
                self.more = True
            jobs = scheduling.lock_startable(session=s, job_ids=[q.id for q, _ in decision.starts])
            dropped = [w for q, w in decision.starts if q.id not in jobs and not isinstance(w, str)]
            if dropped:
                held = alloc.partitions()
                for where in dropped:
                    if where.partition_id in held:
                        alloc.release(where.partition_id)
            starts = [(q, where) for q, where in decision.starts if q.id in jobs]
            new_parts = [
                (where, jobs[q.id].tenant_id, q.id) for q, where in starts if not isinstance(where, str)
            ]
            made: dict[str, fleet.NewPartition] = {}
            try:
                for part in fleet.insert_job_partitions(session=s, placements=new_parts) if new_parts else ():
                    self.sync.known[part.pk] = part.name
                    made[part.job_id] = part
            except fleet.PlacementConflict as exc:
                # Someone else took some of these IPUs: start none of them now; the next pass
                # decides again on a reloaded allocator.
                CONFLICTS.inc()
                log.warning("placements refused by the database: %s", exc)
                self.sync.invalidate()
            batch: list[tuple[Job, attempts.PlacedPartition, str]] = []
            holds: list[tuple[Job, attempts.PlacedPartition]] = []
            for queued, where in starts:
                job = jobs[queued.id]
                partition: attempts.PlacedPartition | None = (
                    fleet.get_live_partition(session=s, name=where)
                    if isinstance(where, str)
                    else made.get(job.id)
                )
                if partition is None:
                    continue
                if job.task == sessions.SESSION_TASK:
                    # A session's holder: nothing for an agent to run; the session holds the partition.
                    holds.append((job, partition))
                else:
                    batch.append((job, partition, self.queue_for(partition)))
            attempts.place_many(session=s, placements=batch)
            sessions.activate_many(session=s, starts=holds, now=utcnow())
            # A hold whose session was being changed or ended at this moment was skipped (see
            # activate_many): it stays queued, and the partition made for it is freed at once.
            skipped = [p.pk for j, p in holds if j.state != JobState.RUNNING]
            if skipped:
                fleet.release_job_partitions(session=s, partition_pks=skipped)
                self.sync.invalidate()
            started: set[str] = set()
            for job in [j for j, _, _ in batch] + [j for j, _ in holds if j.state == JobState.RUNNING]:
                job.wait = None
                started.add(job.id)
            placed = len(batch)
            PLACED.inc(placed)
            BACKFILLED.inc(decision.stats.backfilled)
            assert self._waits is not None
            for job_id in started:
                self._waits.pop(job_id, None)
            waits = {job_id: wait for job_id, wait in decision.waits.items() if job_id not in started}
            waits.update(self._gated)
            scheduling.record_waits(session=s, waits=waits, known=self._waits)
            self._renew(s)
            return placed

    def resolve_dependencies(self) -> dependencies.Resolved | None:
        """Release jobs whose dependencies are met, cancel those whose can no longer be
        (services.batch.dependencies.resolve_dependencies), in one fenced transaction."""
        with self.db.read() as s:
            if not dependencies.has_held(session=s):
                return None
        with self.db.write() as s:
            self._fence(s)
            result = dependencies.resolve_dependencies(session=s)
        for job_id in result.cancelled:
            log.info("job %s cancelled: its dependencies can never be satisfied", job_id)
        return result

    def sweep_sessions(self) -> sessions.SweepResult | None:
        """Bill, warn and end active sessions (services.sessions.sweep), in one fenced transaction."""
        with self.db.read() as s:
            due = sessions.has_due(
                session=s,
                now=db_now(s),
                clock=self.cluster_clock,
                warning_s=self.settings.session_warning_s,
                meter_interval_s=self.settings.meter_interval_s,
            )
        if not due:
            return None
        with self.db.write() as s:
            self._fence(s)
            result = sessions.sweep(
                session=s,
                now=db_now(s),
                clock=self.cluster_clock,
                warning_s=self.settings.session_warning_s,
                meter_interval_s=self.settings.meter_interval_s,
            )
        for session_id, reason in result.ended:
            log.info("session %s ended: %s", session_id, reason)
        return result

    def serve_endpoints(self) -> endpoints.ServeResult | None:
        """Scale, replace, stop and roll up the live endpoints (services.endpoints.serve_pass), in one
        fenced transaction, then publish the routes that changed (every live one now and then)."""
        with self.db.read() as s:
            ids = endpoints.live_endpoint_ids(session=s)
        assert self.redis_client is not None
        # Stopped endpoints first, whether any is live or not: a replica lost after its endpoint
        # stopped holds requests that no live endpoint's reap would answer.
        try:
            failed = inference.reap_stopped(self.redis_client())
        except Exception as exc:  # next pass, then
            log.warning("stopped endpoints: could not fail over lost replicas' requests: %s", exc)
        else:
            if failed:
                log.info("stopped endpoints: %d requests of lost replicas answered 503", failed)
        if not ids:
            return None
        client = self.redis_client()
        windows = endpoints.read_windows(client, ids, seconds=self.settings.autoscale_window_s)
        refresh = time.monotonic() - self.last_routes >= endpoints.ROUTE_REFRESH_S
        with self.db.write() as s:
            self._fence(s)
            result = endpoints.serve_pass(
                session=s,
                now=db_now(s),
                clock=self.cluster_clock,
                windows=windows,
                refresh_routes=refresh,
            )
        if result.routes:
            endpoints.publish_routes(client, result.routes)
        for endpoint_id, running in result.running.items():
            try:
                failed = inference.reap_inflight(client, endpoint_id, running)
            except Exception as exc:  # next pass, then
                log.warning("endpoint %s: could not fail over lost replicas' requests: %s", endpoint_id, exc)
                continue
            if failed:
                log.info("endpoint %s: %d requests of lost replicas answered 503", endpoint_id, failed)
        if refresh:
            self.last_routes = time.monotonic()
        for endpoint_id, reason in result.stopped:
            log.info("endpoint %s stopped: %s", endpoint_id, reason)
        return result

    def prune_checkpoints(self) -> checkpoints.Pruned:
        """Delete checkpoints no one will read again (services.checkpoints.prune), in one fenced
        transaction."""
        with self.db.write() as s:
            self._fence(s)
            pruned = checkpoints.prune(session=s, now=db_now(s))
        if pruned.total:
            log.info("pruned %d checkpoints (%d expired)", pruned.total, pruned.expired)
        return pruned

    def queue_for(self, partition: attempts.PlacedPartition) -> str:
        """The most specific queue a live worker serves: the partition's pod, its machine type, default."""
        assert self.router is not None
        return self.router.queue_for(partition.machine_type, partition.ipu_ids)

    def _forecast_for(self, snapshot: Snapshot) -> dict[str, float]:
        """Every queued job's forecast start, made again every `FORECAST_EVERY_S`: the replay
        costs many passes, and a wait estimate seconds old is as good as a fresh one."""
        if self._forecast_due(snapshot):
            self._forecast = forecast_starts(snapshot, self._policy, budget_s=FORECAST_BUDGET_S)
            self._forecast_at = snapshot.now
        return self._forecast

    def _forecast_due(self, snapshot: Snapshot) -> bool:
        return snapshot.now - self._forecast_at >= FORECAST_EVERY_S or snapshot.now < self._forecast_at

    def _snapshot(self, s: Session, alloc: Allocator) -> Snapshot:
        first = self._waits is None
        live = scheduling.build_snapshot(
            session=s,
            allocator=alloc,
            now=db_now(s),
            clock=self.cluster_clock,
            half_life_s=self._policy.half_life_s,
            arrivals_seen=self._seen,
            read_waits=first,
            policy=self._policy,
        )
        if first:
            self._waits = live.waits
        self._samples = live.samples
        self._gated = live.gated
        return live.snapshot

    # Dispatch -------------------------------------------------------------------------------------

    def dispatch(self, limit: int = 1000) -> int:
        """Publish outbox rows not yet published. A second publish is harmless (take is a CAS).

        The queue is chosen again at every publish, one level wider each time (scheduler/routing.py),
        so a republish after a worker host died goes to a queue that is served now; the row keeps
        the queue last used."""
        assert self.celery is not None and self.router is not None
        with self.db.read() as s:
            pending = outbox.unpublished(session=s, limit=limit)
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
                outbox.mark_published(session=s, sent=sent, now=db_now(s))
            PUBLISHED.inc(sum(len(ids) for ids in sent.values()))
        return sum(len(ids) for ids in sent.values())

    # Reconciliation ---------------------------------------------------------------------------------

    def reconcile(self, sweep: bool | None = None) -> reconciler.Repairs:
        """Repair what faults left behind (services.reconciler), in one fenced transaction; the
        sweeps across all running work every `reconciler.SWEEP_S` unless `sweep` says otherwise."""
        assert self.fence_token is not None
        now = time.monotonic()
        if sweep is None:
            sweep = now - self.last_sweep >= reconciler.SWEEP_S
        with self.db.write() as s:
            self._fence(s)
            repairs = reconciler.reconcile(
                session=s,
                leader_epoch=self.fence_token.epoch,
                max_attempts=self.settings.max_attempts,
                outbox_retry_s=self.settings.outbox_retry_s,
                queue_depth=self.queue_depth or (lambda _queue: None),
                sweep=sweep,
            )
            self._renew(s)
        if sweep:
            self.last_sweep = now
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
                    assert self.redis_client is not None
                    client = self.redis_client()
                    pubsub = client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(bus.scoped(bus.WAKE_CHANNEL, client))
            except redis.RedisError as exc:
                log.warning("event bus unavailable (%s); polling every tick", exc)
                pubsub = None
            started = time.monotonic()
            try:
                self.iterate()
            except Exception:
                log.exception("scheduler iteration failed; retrying")
                time.sleep(min(1.0, self.settings.scheduler_tick_s))
            ended = time.monotonic()
            if self.freeze_heap:
                self.freeze_heap = False
                gc.collect()
                gc.freeze()
            self.submitted = False
            if not self.more and not self._wait(pubsub):
                pubsub = None
            # Under a stream of wake-ups (every finish and every submission sends one) passes would
            # run back to back, each reading the whole queue again, and the scheduler and its
            # database session would take the CPU the workers need. So the next pass starts no
            # sooner than the last one took: at most half the time goes to passes, each covering
            # every event of the pause before it. A submission's wake-up after an iteration whose
            # pass found nothing queued is not rested for: that iteration read no queue, yet on a
            # busy machine even its few statements take tens of milliseconds of wall time, and
            # resting that long (after the wake-up of a job's finish) held up the submission's start
            # (40% of the scheduler's wall time was this rest in the start-latency benchmark,
            # docs/performance.md). A stream of finishes is still rested after, as before.
            rests = self.read_queue or not self.submitted
            rested = min(ended - started, self.settings.scheduler_tick_s) if rests else 0.0
            rest = ended + rested - time.monotonic()
            if rest > 0:
                self.stop_event.wait(rest)
        self.step_down()

    def _wait(self, pubsub: object) -> bool:
        """Wait for a wake-up or a tick. False when the subscription broke (resubscribe next time)."""
        if self.stop_event.is_set():
            return True  # step down now: the next replica leads without waiting out a tick
        deadline = time.monotonic() + self.settings.scheduler_tick_s
        if pubsub is None:
            self.stop_event.wait(self.settings.scheduler_tick_s)
            return True
        try:
            msg = pubsub.get_message(timeout=self.settings.scheduler_tick_s)  # type: ignore[attr-defined]
            # Batch a burst of submissions into one pass: drain what is already there.
            while msg is not None:
                self.submitted = self.submitted or msg.get("data") in (b"submit", "submit")
                if time.monotonic() >= deadline:
                    break
                msg = pubsub.get_message(timeout=0)  # type: ignore[attr-defined]
        except (redis.RedisError, OSError) as exc:
            log.warning("event bus error: %s", exc)
            self.stop_event.wait(self.settings.scheduler_tick_s)
            return False
        return True


def _date_waits(waits: dict[str, Wait], forecast: dict[str, float]) -> None:
    """Give every job waiting for room its forecast start: the same estimate `POST /estimates` gives
    before submission (a job held by quota or a limit has none: it waits for a person)."""
    for job_id, wait in waits.items():
        start = forecast.get(job_id)
        if start is not None and wait.reason in ROOM_WAITS:
            waits[job_id] = dataclasses.replace(wait, estimated_start=start)


# An array's elements held back by its max_running (or behind its earlier elements) wait for room
# too: the forecast lets them in as the throttle would (scheduler/policy/forecast.py).
ROOM_WAITS = frozenset({"reserved", "behind", "no-room", "array-throttle", "array"})
