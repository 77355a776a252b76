"""Events: what happened to a tenant, written in the transaction that made the change.

An event is written by `emit` in the transaction that made the state change (a job's end, a trial's
approval, a session's warning), with a deterministic id: one row per state change, however often the
transaction or a sweep is replayed. The events table is the outbox of the tenant's webhooks
(`webhooks.py`: receivers and their secrets; `deliveries.py`: the notifier's fan-out, claims and
retries) and of its mail (`mail.py`). Thresholds of the grant and a trial's end are written by
`thresholds.py`'s sweep. docs/notifications.md tells the whole story.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, TypedDict

from sqlalchemy import delete, event, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.db import changed
from scheduler.models import SERVE_TASK, Job, utcnow
from scheduler.notify_models import Event, WebhookDelivery
from scheduler.services.tenancy.scope import Scope, restrict

# Every event type. `endpoint.*` are written by inference endpoints (scheduler/services/endpoints/);
# `trial.rejected` has no tenant to belong to, so it is only ever e-mailed to the applicant.
EVENT_TYPES = (
    "job.started",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.preempted",
    "job.runtime_warning",
    "session.ending_soon",
    "session.ended",
    "usage.threshold",
    "trial.approved",
    "trial.rejected",
    "trial.expiring",
    "trial.expired",
    "endpoint.ready",
    "endpoint.scaled",
    "endpoint.failed",
    "webhook.disabled",
)
PING = "webhook.ping"
# Jobs that are the machinery of something else (a session's hold, an endpoint's replica): their own
# events say what happened, not these jobs'.
HIDDEN_TASKS = frozenset({"session", SERVE_TASK})
EVENTS_KEPT = timedelta(days=30)
MAX_EVENTS_FILTER = 50


def event_id(type_: str, key: str) -> str:
    return f"{type_}:{key}"[:160]


def _insert_ignore(session: Session, table: Any, rows: list[dict[str, Any]], key: str) -> None:
    ins = (
        postgresql.insert(table) if session.get_bind().dialect.name == "postgresql" else sqlite.insert(table)
    )
    session.execute(ins.on_conflict_do_nothing(index_elements=[key]), rows)


_PENDING = "ipucloud.events"


def emit(
    session: Session,
    *,
    tenant_id: str,
    type_: str,
    key: str,
    data: dict[str, Any],
    at: datetime | None = None,
) -> None:
    """Write an event in the caller's transaction, unless one of that id exists (a replay).

    The rows are inserted together as the transaction commits: an agent's tick or a scheduling pass
    that ends or starts hundreds of jobs adds one statement, not hundreds."""
    assert type_ in EVENT_TYPES, type_
    pending = session.info.setdefault(_PENDING, [])
    if not pending:
        event.listen(session, "before_commit", _insert_pending, once=True)
        event.listen(session, "after_rollback", _drop_pending, once=True)
    pending.append(
        {
            "id": event_id(type_, key),
            "tenant_id": tenant_id,
            "type": type_,
            "data": data,
            "created_at": at or utcnow(),
        }
    )


def _insert_pending(session: Session) -> None:
    rows = session.info.pop(_PENDING, [])
    if rows:
        session.flush()  # the rows they name (a tenant made in this transaction) first
        # The first row of an id stays (here and in the table); a repeat is dropped.
        unique: dict[str, dict[str, Any]] = {}
        for row in rows:
            unique.setdefault(row["id"], row)
        _insert_ignore(session, Event.__table__, list(unique.values()), "id")


def _drop_pending(session: Session) -> None:
    session.info.pop(_PENDING, None)


def job_event(session: Session, job: Job, type_: str, *, key: str, **extra: Any) -> None:
    """A job's event: thin, its id and where to read it."""
    if job.task in HIDDEN_TASKS:
        return
    data = {"id": job.id, "name": job.name, "state": str(job.state), "url": f"/api/v1/jobs/{job.id}"}
    emit(session, tenant_id=job.tenant_id, type_=type_, key=key, data={**data, **extra})


class EventView(TypedDict):
    id: str
    seq: int
    type: str
    data: dict[str, Any]
    created_at: datetime


def list_events(
    *, session: Session, scope: Scope, before: int | None, limit: int, types: Sequence[str] = ()
) -> list[Event]:
    """The scope's events of the last 30 days, newest first; `before` is the `seq` of the last one of
    the previous page."""
    stmt = (
        restrict(select(Event), Event.tenant_id, scope)
        .where(Event.created_at >= utcnow() - EVENTS_KEPT)
        .order_by(Event.seq.desc())
        .limit(limit)
    )
    if before is not None:
        stmt = stmt.where(Event.seq < before)
    if types:
        stmt = stmt.where(Event.type.in_(list(types)))
    return list(session.execute(stmt).scalars())


def prune(*, session: Session, now: datetime) -> int:
    """Forget events and settled deliveries older than 30 days."""
    cutoff = now - EVENTS_KEPT
    gone = changed(
        session,
        delete(WebhookDelivery).where(
            WebhookDelivery.created_at < cutoff, WebhookDelivery.status != "pending"
        ),
    )
    return gone + changed(
        session, delete(Event).where(Event.created_at < cutoff, Event.fanned_out_at.is_not(None))
    )
