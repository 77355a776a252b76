"""Inference endpoints, the control plane: a model served by replicas that the scheduler holds,
adds, drains and replaces (docs/endpoints.md).

A replica is a *holder job* (task `serve`, hidden from the job list) like a session's: admission
reserves a window of its cost (`WINDOW_S` cluster seconds at the plan's rate) from the grant, and it
queues, is placed, fair-shared and limited by the same machinery as any job, except that it counts
against the plan's endpoint limits instead of its job-count limits. Unlike a session's holder, an agent
runs its attempt: a model server that compiles, loads, then answers the endpoint's requests from Redis
until it is stopped (the data plane: scheduler/inference.py, workers/serving.py). Its attempt is
metered like any other, so the endpoint is billed per held IPU-second, busy or idle, compile included.

One module per thing a reader looks for:

- `plans`: the model laid out on a replica of each machine type, checked against the plan's limits;
- `lifecycle`: create, read, change and delete, and the endpoint's events;
- `replicas`: holder jobs queued, their derived states (`replica_state`), drained;
- `autoscaler`: how many replicas an endpoint wants (`decide_scale`, a pure function);
- `serve`: the scheduler leader's serve pass, which scales, replaces, stops and rolls up;
- `stats`: the per-minute rows the pass writes and their history;
- `views`: an endpoint as the API and the dashboard show it, and the Prometheus counts;
- `routes`: the link to the data plane: traffic windows read, routes published after commit.

Every public name is importable from here (`from scheduler.services import endpoints`).
Locks are taken in the order endpoints, jobs, attempts, tenants.
"""

from __future__ import annotations

from scheduler.services.endpoints.autoscaler import (
    DOWN_UTILISATION,
    ScalePolicy,
    ScaleState,
    decide_scale,
    policy_of,
    replicas_needed,
)
from scheduler.services.endpoints.lifecycle import (
    change_endpoint,
    create_endpoint,
    delete_endpoint,
    get_endpoint,
    list_endpoints,
)
from scheduler.services.endpoints.plans import BatchFigure, ServeFigures
from scheduler.services.endpoints.replicas import WINDOW_S, Replica, billed_ipu_ms, replica_state, replicas_of
from scheduler.services.endpoints.routes import (
    ROUTE_REFRESH_S,
    RouteFields,
    WindowLike,
    publish_routes,
    read_windows,
    routes_after_commit,
)
from scheduler.services.endpoints.serve import (
    FAILURE_LIMIT,
    QUOTA,
    ServeResult,
    live_endpoint_ids,
    serve_pass,
)
from scheduler.services.endpoints.stats import StatView, history
from scheduler.services.endpoints.views import (
    EndpointJson,
    ReplicaView,
    WindowView,
    endpoint_counts,
    endpoint_json,
    replica_counts,
    window_json,
)

__all__ = [
    "DOWN_UTILISATION",
    "FAILURE_LIMIT",
    "QUOTA",
    "ROUTE_REFRESH_S",
    "WINDOW_S",
    "BatchFigure",
    "EndpointJson",
    "Replica",
    "ReplicaView",
    "RouteFields",
    "ScalePolicy",
    "ScaleState",
    "ServeFigures",
    "ServeResult",
    "StatView",
    "WindowLike",
    "WindowView",
    "billed_ipu_ms",
    "change_endpoint",
    "create_endpoint",
    "decide_scale",
    "delete_endpoint",
    "endpoint_counts",
    "endpoint_json",
    "get_endpoint",
    "history",
    "list_endpoints",
    "live_endpoint_ids",
    "policy_of",
    "publish_routes",
    "read_windows",
    "replica_counts",
    "replica_state",
    "replicas_needed",
    "replicas_of",
    "routes_after_commit",
    "serve_pass",
    "window_json",
]
