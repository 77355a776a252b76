"""Prometheus metrics: this API process's own, and the cluster's as the database records it.

With `PROMETHEUS_MULTIPROC_DIR` set (as `ipucloud api --workers N` does), every process writes
its samples to that directory and any one of them can serve the sum.

The scheduler and the workers run in other processes, often on other hosts, and restart; their
in-process counters would be scattered and reset. So `/metrics` also carries `ipucloud_cluster_*`
figures read from the database at scrape time (ClusterCollector): jobs and attempts by state,
overdue leases, the outbox, live partitions and IPUs, the leader, and every repair the reconciler
ever made (it records each one in `reconciler_actions`). They are exact and survive restarts, and
every API replica reports the same values.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger("ipucloud.api")

REQUESTS = Counter("ipucloud_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "ipucloud_http_request_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


_CHILDREN: dict[tuple[Any, ...], Any] = {}


def post_metric(family: Any, *labels: str) -> Any:
    """The family's child for a POST with these labels, kept: ``labels()`` takes a lock and builds its key
    on every call (the fast paths, api/inference.py and api/fast_submit.py, count every request)."""
    child = _CHILDREN.get((family, *labels))
    if child is None:
        child = _CHILDREN[(family, *labels)] = family.labels("POST", *labels)
    return child


class ClusterCollector(Collector):
    """Cluster-wide reliability figures, read from the database on every scrape."""

    def collect(self) -> Iterator[Metric]:
        from scheduler.runtime import current
        from scheduler.services.capacity.reconciler import cluster_state

        ok = GaugeMetricFamily(
            "ipucloud_cluster_scrape_ok", "1 if the cluster figures below could be read from the database"
        )
        try:
            with current().db.read() as s:
                state = cluster_state(s)
        except Exception as exc:  # the API's own metrics still matter while the database is away
            log.warning("cluster metrics unavailable: %s", exc)
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok

        jobs = GaugeMetricFamily("ipucloud_cluster_jobs", "Jobs by state", labels=["state"])
        for k, v in state.jobs.items():
            jobs.add_metric([k], v)
        yield jobs
        ended = CounterMetricFamily(
            "ipucloud_cluster_attempts_ended",
            "Attempts ended, by outcome (lost, handed_back, preempted and interrupted are platform faults, "
            "never billed)",
            labels=["outcome"],
        )
        for k, v in state.attempts_ended.items():
            ended.add_metric([k], v)
        yield ended
        live = GaugeMetricFamily(
            "ipucloud_cluster_attempts_live", "Attempts placed or running", labels=["state"]
        )
        for k, v in state.attempts_live.items():
            live.add_metric([k], v)
        yield live
        yield GaugeMetricFamily(
            "ipucloud_cluster_leases_overdue",
            "Host agents whose lease ran out and whose attempts the reconciler has not ended yet",
            value=state.leases_overdue,
        )
        agent_states = GaugeMetricFamily(
            "ipucloud_cluster_agents", "Host agents by state (active, stopped, lapsed)", labels=["state"]
        )
        for k, v in state.agents.items():
            agent_states.add_metric([k], v)
        yield agent_states
        repairs = CounterMetricFamily(
            "ipucloud_cluster_reconciler_repairs",
            "Repairs made by the scheduler's reconciler, by action (lease_expired: attempt lost; "
            "outbox_republished; orphan_partition_freed; ...)",
            labels=["action"],
        )
        for k, v in state.repairs.items():
            repairs.add_metric([k], v)
        yield repairs
        yield GaugeMetricFamily(
            "ipucloud_cluster_outbox_unacked",
            "Outbox messages no worker has taken yet",
            value=state.outbox_unacked,
        )
        yield CounterMetricFamily(
            "ipucloud_cluster_outbox_publishes",
            "Publishes of outbox messages to the broker, first ones and republishes",
            value=state.outbox_publishes,
        )
        yield GaugeMetricFamily(
            "ipucloud_cluster_partitions_live", "Live partitions", value=state.partitions_live
        )
        yield GaugeMetricFamily(
            "ipucloud_cluster_ipus_assigned", "IPUs in live partitions", value=state.ipus_assigned
        )
        yield GaugeMetricFamily(
            "ipucloud_cluster_leader_epoch",
            "Fencing epoch of the scheduler leader's lease",
            value=state.leader_epoch,
        )
        yield GaugeMetricFamily(
            "ipucloud_cluster_leader_lease_remaining_seconds",
            "Seconds until the scheduler leader's lease runs out unless renewed (0: no leader)",
            value=state.leader_lease_remaining_s,
        )


class FleetCollector(Collector):
    """The fleet by machine type: IPUs in all and free, machines by health, and the queue-wait
    histogram (submission to first placement), read from the database on every scrape."""

    def collect(self) -> Iterator[Metric]:
        from scheduler.runtime import current
        from scheduler.services.capacity import fleet_metrics

        try:
            with current().db.read() as s:
                ipus = fleet_metrics.ipus_by_type(s)
                machines = fleet_metrics.machines_by_health(s)
                waits = fleet_metrics.queue_wait_histogram(s)
        except Exception as exc:  # ipucloud_cluster_scrape_ok already says the database is away
            log.warning("fleet metrics unavailable: %s", exc)
            return
        total = GaugeMetricFamily(
            "ipucloud_cluster_ipus", "IPUs of live machines, by machine type", labels=["machine_type"]
        )
        free = GaugeMetricFamily(
            "ipucloud_cluster_ipus_free",
            "IPUs a new partition could take now (machine and IPU up, in no partition), by machine type",
            labels=["machine_type"],
        )
        for kind, figures in ipus.items():
            total.add_metric([kind], figures.total)
            free.add_metric([kind], figures.free)
        yield total
        yield free
        health = GaugeMetricFamily(
            "ipucloud_cluster_machines", "Live machines by type and health", labels=["machine_type", "health"]
        )
        for (kind, state), n in sorted(machines.items()):
            health.add_metric([kind, state], n)
        yield health
        hist = HistogramMetricFamily(
            "ipucloud_cluster_queue_wait_seconds",
            "Wall-clock seconds from a job's submission to its first placement",
        )
        hist.add_metric([], [(_bound(b), n) for b, n in waits.buckets], sum_value=waits.total_s)
        yield hist


class EndpointCollector(Collector):
    """Every inference endpoint's last minute, read from its Redis counters on every scrape (the same
    figures `GET /api/v1/endpoints/{id}/metrics` answers): the replicas and the API processes write
    them, so any API process reports the whole endpoint."""

    WINDOW_S = 60.0

    def collect(self) -> Iterator[Metric]:
        from scheduler import inference
        from scheduler.runtime import current

        try:
            r = current().redis
            keys = list(r.scan_iter(match=inference.PREFIX + "*:route", count=500))
            raws: list[bytes | None] = list(r.mget(keys)) if keys else []  # type: ignore[arg-type]
            routes = [inference.Route.from_json(raw) for raw in raws if raw]
            stats = inference.windows(r, [x.endpoint_id for x in routes], self.WINDOW_S)
        except Exception as exc:
            log.warning("endpoint metrics unavailable: %s", exc)
            return
        labels = ["endpoint", "name", "tenant"]
        families = {
            "rps": GaugeMetricFamily(
                "ipucloud_endpoint_requests_per_second",
                "Requests answered per second, last minute",
                labels=labels,
            ),
            "latency": GaugeMetricFamily(
                "ipucloud_endpoint_latency_ms",
                "Emulated latency (queue + batch + host + IPU) of the last minute's answers, by quantile",
                labels=[*labels, "quantile"],
            ),
            "batch": GaugeMetricFamily(
                "ipucloud_endpoint_mean_batch", "Mean batch, last minute", labels=labels
            ),
            "queue": GaugeMetricFamily(
                "ipucloud_endpoint_queue_delay_ms",
                "Mean time in queue and batching, last minute",
                labels=labels,
            ),
            "replicas": GaugeMetricFamily(
                "ipucloud_endpoint_ready_replicas", "Replicas serving now", labels=labels
            ),
            "queued": GaugeMetricFamily("ipucloud_endpoint_queued", "Requests waiting now", labels=labels),
            "rejected": GaugeMetricFamily(
                "ipucloud_endpoint_rejected_last_minute",
                "Requests refused in the last minute: 429 (queue full), 503 (no replica in time, or lost)",
                labels=[*labels, "status"],
            ),
            "cold": GaugeMetricFamily(
                "ipucloud_endpoint_cold_starts_last_minute",
                "Requests that arrived with no replica serving, last minute",
                labels=labels,
            ),
        }
        for route in routes:
            w = stats.get(route.endpoint_id)
            if w is None:
                continue
            key = [route.endpoint_id, route.name, route.tenant_id]
            families["rps"].add_metric(key, w.rps)
            for q, v in (("0.5", w.p50_ms), ("0.9", w.p90_ms), ("0.99", w.p99_ms)):
                if v is not None:
                    families["latency"].add_metric([*key, q], v)
            families["batch"].add_metric(key, w.mean_batch)
            families["queue"].add_metric(key, w.queue_delay_ms)
            families["replicas"].add_metric(key, w.ready_replicas)
            families["queued"].add_metric(key, w.queued)
            families["rejected"].add_metric([*key, "429"], w.rejected_429)
            families["rejected"].add_metric([*key, "503"], w.unavailable_503)
            families["cold"].add_metric(key, w.cold_starts)
        yield from families.values()


class EndpointStateCollector(Collector):
    """Inference endpoints by state and their replicas by state (derived from the replicas' holder jobs,
    scheduler/services/endpoints/), read from the database on every scrape."""

    def collect(self) -> Iterator[Metric]:
        from scheduler.runtime import current
        from scheduler.services import endpoints
        from scheduler.services.clock import db_now

        try:
            with current().db.read() as s:
                states = endpoints.endpoint_counts(session=s)
                replicas = endpoints.replica_counts(session=s, now=db_now(s))
        except Exception as exc:  # ipucloud_cluster_scrape_ok already says the database is away
            log.warning("endpoint metrics unavailable: %s", exc)
            return
        by_state = GaugeMetricFamily(
            "ipucloud_cluster_endpoints", "Inference endpoints by state", labels=["state"]
        )
        for state, n in sorted(states.items()):
            by_state.add_metric([state], n)
        yield by_state
        reps = GaugeMetricFamily(
            "ipucloud_endpoint_replicas",
            "Replicas of each live inference endpoint by state (queued, compiling, loading, ready, draining)",
            labels=["endpoint", "state"],
        )
        for (endpoint_id, state), n in sorted(replicas.items()):
            reps.add_metric([endpoint_id, state], n)
        yield reps


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


# prometheus_client's default REGISTRY is process-wide and refuses a collector registered twice, so
# these stay module-level; they read the process's runtime (`scheduler.runtime.current()`) at scrape.
_cluster = ClusterCollector()
_fleet = FleetCollector()
_endpoints = EndpointCollector()
_endpoint_states = EndpointStateCollector()
_registered = False
_lock = threading.Lock()


def registry() -> CollectorRegistry:
    global _registered
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        reg.register(_cluster)
        reg.register(_fleet)
        reg.register(_endpoints)
        reg.register(_endpoint_states)
        return reg
    with _lock:
        if not _registered:
            REGISTRY.register(_cluster)
            REGISTRY.register(_fleet)
            REGISTRY.register(_endpoints)
            REGISTRY.register(_endpoint_states)
            _registered = True
    return REGISTRY
