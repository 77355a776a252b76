"""Prometheus metrics of the API process, and of all its worker processes when run with several.

With `PROMETHEUS_MULTIPROC_DIR` set (as `ipucloud api --workers N` does), every process writes
its samples to that directory and any one of them can serve the sum.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, multiprocess

REQUESTS = Counter("ipucloud_http_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "ipucloud_http_request_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


def registry() -> CollectorRegistry:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        return reg
    return REGISTRY
