"""An endpoint as readers see it: the API's and the dashboard's JSON, its replicas and last minute,
and the counts behind the Prometheus gauges."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.models import Endpoint
from scheduler.services.endpoints.plans import ServeFigures
from scheduler.services.endpoints.replicas import Replica, replicas_of
from scheduler.services.endpoints.routes import WindowLike
from scheduler.services.endpoints.serve import live_endpoint_ids
from scheduler.services.endpoints.stats import _num


class ReplicaView(TypedDict):
    """One replica: its holder job, state and where it runs."""

    id: str
    state: str
    ipus: int
    machine: str | None
    partition: str | None
    started_at: datetime | None
    ready_at: datetime | None
    billed_ipu_hours: float


class WindowView(TypedDict):
    """The endpoint's last minute as the data plane counts it."""

    requests: int
    answered: int
    rejected_429: int
    unavailable_503: int
    cold_starts: int
    rps: float
    mean_batch: float | None
    queue_delay_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    queued: int
    ready_replicas: int


def window_json(w: WindowLike | None) -> WindowView | None:
    if w is None:
        return None
    return {
        "requests": int(w.requests),
        "answered": int(w.answered),
        "rejected_429": int(w.rejected_429),
        "unavailable_503": int(w.unavailable_503),
        "cold_starts": int(w.cold_starts),
        "rps": round(float(w.rps), 4),
        "mean_batch": _num(w.mean_batch),
        "queue_delay_ms": _num(w.queue_delay_ms),
        "p50_ms": _num(w.p50_ms),
        "p90_ms": _num(w.p90_ms),
        "p99_ms": _num(w.p99_ms),
        "queued": int(w.queued),
        "ready_replicas": int(w.ready_replicas),
    }


class EndpointJson(TypedDict):
    """An endpoint as the API shows it (`EndpointOut`)."""

    id: str
    name: str
    url: str
    model: str
    model_id: str
    state: str
    reason: str | None
    machine: str
    ipus_per_replica: int
    ipus_requested: str
    workload: dict[str, Any]
    replicas: dict[str, int]
    autoscaling: dict[str, Any]
    batching: dict[str, Any]
    max_queue: int
    cold_start_timeout_s: float
    preemptible: bool
    signature: dict[str, Any]
    serve_plans: list[ServeFigures]
    replica_list: list[ReplicaView]
    billed_ipu_hours: float
    created_at: datetime
    updated_at: datetime
    stopped_at: datetime | None


def endpoint_json(
    *, ep: Endpoint, replicas: Sequence[Replica], billed_ipu_ms: int, base_url: str
) -> EndpointJson:
    return {
        "id": ep.id,
        "name": ep.name,
        "url": f"{base_url.rstrip('/')}/api/v1/endpoints/{ep.id}",
        "model": ep.model_name,
        "model_id": ep.model,
        "state": ep.state,
        "reason": ep.reason,
        "machine": ep.machine,
        "ipus_per_replica": ep.ipus_per_replica,
        "ipus_requested": ep.ipus_requested,
        "workload": dict(ep.workload),
        "replicas": {
            "min": ep.replicas_min,
            "max": ep.replicas_max,
            "desired": ep.desired_replicas,
            "ready": sum(1 for r in replicas if r.state == "ready"),
        },
        "autoscaling": dict(ep.autoscaling),
        "batching": dict(ep.batching),
        "max_queue": ep.max_queue,
        "cold_start_timeout_s": ep.cold_start_timeout_s,
        "preemptible": ep.preemptible,
        "signature": dict(ep.signature),
        "serve_plans": list(ep.serve.values()),
        "replica_list": [
            {
                "id": r.job.id,
                "state": r.state,
                "ipus": r.job.ipus,
                "machine": r.attempt.machine_type if r.attempt is not None else r.job.machine_type,
                "partition": r.partition,
                "started_at": r.attempt.started_at if r.attempt is not None else None,
                "ready_at": r.ready_at,
                "billed_ipu_hours": billing.ipu_hours(
                    r.attempt.metered_ipu_ms if r.attempt is not None else 0
                ),
            }
            for r in replicas
        ],
        "billed_ipu_hours": billing.ipu_hours(billed_ipu_ms),
        "created_at": ep.created_at,
        "updated_at": ep.updated_at,
        "stopped_at": ep.stopped_at,
    }


def endpoint_counts(*, session: Session) -> dict[str, int]:
    """Endpoints by state, for the Prometheus gauges."""
    return {
        str(state): int(n)
        for state, n in session.execute(
            select(Endpoint.state, func.count()).group_by(Endpoint.state)
        ).tuples()
    }


def replica_counts(*, session: Session, now: datetime) -> dict[tuple[str, str], int]:
    """Replicas per (endpoint, state) of every live endpoint, for the Prometheus gauges."""
    ids = live_endpoint_ids(session=session)
    out: dict[tuple[str, str], int] = {}
    for ep_id, reps in replicas_of(session=session, endpoint_ids=ids, now=now).items():
        for r in reps:
            out[(ep_id, r.state)] = out.get((ep_id, r.state), 0) + 1
    return out
