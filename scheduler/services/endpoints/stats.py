"""Each endpoint's minutes: rolled up by the serve pass into `endpoint_stats`, one row per endpoint
per minute, as the data plane's last-minute window says once the minute has passed; read back as its
history."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypedDict

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models import LIVE_ENDPOINT_STATES, Endpoint, EndpointStat
from scheduler.services.endpoints.replicas import Replica
from scheduler.services.endpoints.routes import WindowLike


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def _roll_up(
    session: Session,
    rows: Sequence[Endpoint],
    windows: Mapping[str, WindowLike],
    live: Mapping[str, Sequence[Replica]],
    now: datetime,
) -> int:
    """One `endpoint_stats` row per endpoint per minute: the minute just ended, as the last minute's
    window says once it has passed (the first pass of a minute writes the one before)."""
    written = 0
    this = _minute(now)
    for ep in rows:
        if ep.state not in LIVE_ENDPOINT_STATES:
            continue
        last = ep.rolled_up_to
        w = windows.get(ep.id)
        if w is None or (last is not None and last >= this - timedelta(minutes=1)):
            continue
        minute = this - timedelta(minutes=1)
        if session.get(EndpointStat, (ep.id, minute)) is None:
            session.add(
                EndpointStat(
                    endpoint_id=ep.id,
                    minute=minute,
                    tenant_id=ep.tenant_id,
                    requests=int(w.requests),
                    errors=int(getattr(w, "unavailable_503", 0)),
                    rejected=int(getattr(w, "rejected_429", 0)),
                    cold_starts=int(getattr(w, "cold_starts", 0)),
                    p50_ms=_num(getattr(w, "p50_ms", None)),
                    p90_ms=_num(getattr(w, "p90_ms", None)),
                    p99_ms=_num(getattr(w, "p99_ms", None)),
                    mean_batch=_num(getattr(w, "mean_batch", None)),
                    queue_delay_ms=_num(getattr(w, "queue_delay_ms", None)),
                    replicas=sum(1 for r in live.get(ep.id, ()) if r.state == "ready"),
                    desired=ep.desired_replicas,
                )
            )
            written += 1
        ep.rolled_up_to = minute
    return written


def _num(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    return None if math.isnan(v) or math.isinf(v) else round(v, 4)


class StatView(TypedDict):
    """One minute of an endpoint's history."""

    minute: datetime
    requests: int
    errors: int
    rejected: int
    cold_starts: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    mean_batch: float | None
    queue_delay_ms: float | None
    replicas: int
    desired: int


def history(*, session: Session, endpoint_id: str, since: datetime, limit: int = 1440) -> list[StatView]:
    """An endpoint's minutes since `since`, oldest first."""
    rows = session.execute(
        select(EndpointStat)
        .where(EndpointStat.endpoint_id == endpoint_id, EndpointStat.minute >= since)
        .order_by(EndpointStat.minute)
        .limit(limit)
    ).scalars()
    return [
        {
            "minute": r.minute,
            "requests": r.requests,
            "errors": r.errors,
            "rejected": r.rejected,
            "cold_starts": r.cold_starts,
            "p50_ms": r.p50_ms,
            "p90_ms": r.p90_ms,
            "p99_ms": r.p99_ms,
            "mean_batch": r.mean_batch,
            "queue_delay_ms": r.queue_delay_ms,
            "replicas": r.replicas,
            "desired": r.desired,
        }
        for r in rows
    ]
