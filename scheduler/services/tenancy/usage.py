"""Usage reports from the meter ledger: by day, job, workload and partition size (and tenant, for admins).

Every figure is a sum over meter events, so it is exactly what was billed: ticks while an attempt
ran, its settle record at the end, and the negative settle that refunds an attempt the platform
lost. An event counts on the UTC day it was written.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import Date, cast, func, select
from sqlalchemy.orm import Session

from scheduler.billing import ipu_hours as _hours
from scheduler.models import Endpoint, Job, MeterEvent, Tenant
from scheduler.services.tenancy.scope import Scope, restrict

GROUPS = ("day", "job", "workload", "partition_size", "machine_type", "endpoint")


class UsageDayRow(TypedDict):
    """IPU-hours billed on one UTC day (`YYYY-MM-DD`)."""

    day: str
    ipu_hours: float


class UsageJobRow(TypedDict):
    """IPU-hours billed to one job, with its tenant, name, workload and largest partition."""

    job_id: str
    tenant_id: str
    name: str
    workload: str
    partition_size: int
    ipu_hours: float  # the grant charged (rate x IPU-hours), as `charged_ipu_hours`
    machine_type: str | None  # the type it ran on ("bow,m2000" if its attempts ran on several)
    rate: float | None  # what it was charged per IPU-hour (None if its attempts ran at several)
    raw_ipu_hours: float  # the IPU-hours run, whatever the rate
    charged_ipu_hours: float


class UsageWorkloadRow(TypedDict):
    """IPU-hours billed to one workload."""

    workload: str
    ipu_hours: float


class UsagePartitionSizeRow(TypedDict):
    """IPU-hours billed on partitions of one size."""

    partition_size: int
    ipu_hours: float


class UsageMachineTypeRow(TypedDict):
    """IPU-hours run on one machine type and the grant they spent (`charged_ipu_hours`)."""

    machine_type: str
    ipu_hours: float
    charged_ipu_hours: float


class UsageEndpointRow(TypedDict):
    """IPU-hours billed to one inference endpoint's replicas (held, busy or idle)."""

    endpoint_id: str
    tenant_id: str
    name: str
    model: str
    ipu_hours: float


class UsageBreakdowns(TypedDict):
    """Usage grouped six ways (`breakdowns`)."""

    by_day: list[UsageDayRow]
    by_job: list[UsageJobRow]
    by_workload: list[UsageWorkloadRow]
    by_partition_size: list[UsagePartitionSizeRow]
    by_machine_type: list[UsageMachineTypeRow]
    by_endpoint: list[UsageEndpointRow]


def job_used_ipu_ms(*, session: Session, job_id: str) -> int:
    return int(
        session.execute(
            select(func.coalesce(func.sum(MeterEvent.ipu_ms), 0)).where(MeterEvent.job_id == job_id)
        ).scalar_one()
    )


def jobs_used_ipu_ms(*, session: Session, job_ids: Sequence[str]) -> dict[str, int]:
    """IPU-milliseconds billed to each job so far, in one query for a page of jobs."""
    out = dict.fromkeys(job_ids, 0)
    if not job_ids:
        return out
    rows = session.execute(
        select(MeterEvent.job_id, func.sum(MeterEvent.ipu_ms))
        .where(MeterEvent.job_id.in_(list(job_ids)))
        .group_by(MeterEvent.job_id)
    ).tuples()
    for job_id, ms in rows:
        out[job_id] = int(ms or 0)
    return out


def _scoped(stmt: Any, scope: Scope, since: datetime | None, until: datetime | None) -> Any:
    stmt = restrict(stmt, MeterEvent.tenant_id, scope)
    if since is not None:
        stmt = stmt.where(MeterEvent.at >= since)
    if until is not None:
        stmt = stmt.where(MeterEvent.at < until)
    return stmt


def by_day(
    *,
    session: Session,
    scope: Scope,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 366,
) -> list[UsageDayRow]:
    """The last `limit` days with usage in the window, oldest first."""
    day = (
        cast(MeterEvent.at, Date)
        if session.get_bind().dialect.name == "postgresql"
        else func.date(MeterEvent.at)
    )
    rows = session.execute(
        _scoped(select(day.label("day"), func.sum(MeterEvent.ipu_ms)), scope, since, until)
        .group_by(day)
        .order_by(day.desc())
        .limit(limit)
    ).all()
    return [{"day": str(d), "ipu_hours": _hours(ms)} for d, ms in reversed(rows)]


def by_job(
    *,
    session: Session,
    scope: Scope,
    since: datetime | None = None,
    until: datetime | None = None,
    after: str | None = None,
    limit: int = 100,
) -> list[UsageJobRow]:
    """Newest job first; `after` is the last job id of the previous page."""
    stmt = _scoped(
        select(
            MeterEvent.job_id,
            MeterEvent.tenant_id,
            Job.name,
            MeterEvent.workload,
            func.max(MeterEvent.partition_size),
            func.sum(MeterEvent.ipu_ms),
            func.min(MeterEvent.machine_type),
            func.max(MeterEvent.machine_type),
            func.min(MeterEvent.rate),
            func.max(MeterEvent.rate),
            func.sum(func.coalesce(MeterEvent.raw_ipu_ms, MeterEvent.ipu_ms)),
        ).join(Job, Job.id == MeterEvent.job_id),
        scope,
        since,
        until,
    )
    if after is not None:
        stmt = stmt.where(MeterEvent.job_id < after)
    rows = session.execute(
        stmt.group_by(MeterEvent.job_id, MeterEvent.tenant_id, Job.name, MeterEvent.workload)
        .order_by(MeterEvent.job_id.desc())
        .limit(limit)
    ).all()
    return [
        {
            "job_id": j,
            "tenant_id": t,
            "name": n,
            "workload": w,
            "partition_size": size,
            "ipu_hours": _hours(ms),
            "machine_type": first if first == last else f"{first},{last}",
            "rate": None if low is None or low != high else float(low),
            "raw_ipu_hours": _hours(raw),
            "charged_ipu_hours": _hours(ms),
        }
        for j, t, n, w, size, ms, first, last, low, high, raw in rows
    ]


def by_workload(
    *, session: Session, scope: Scope, since: datetime | None = None, until: datetime | None = None
) -> list[UsageWorkloadRow]:
    rows = session.execute(
        _scoped(select(MeterEvent.workload, func.sum(MeterEvent.ipu_ms)), scope, since, until)
        .group_by(MeterEvent.workload)
        .order_by(MeterEvent.workload)
    ).all()
    return [{"workload": w, "ipu_hours": _hours(ms)} for w, ms in rows]


def by_partition_size(
    *, session: Session, scope: Scope, since: datetime | None = None, until: datetime | None = None
) -> list[UsagePartitionSizeRow]:
    rows = session.execute(
        _scoped(select(MeterEvent.partition_size, func.sum(MeterEvent.ipu_ms)), scope, since, until)
        .group_by(MeterEvent.partition_size)
        .order_by(MeterEvent.partition_size)
    ).all()
    return [{"partition_size": s, "ipu_hours": _hours(ms)} for s, ms in rows]


def by_machine_type(
    *, session: Session, scope: Scope, since: datetime | None = None, until: datetime | None = None
) -> list[UsageMachineTypeRow]:
    """Per machine type: the IPU-hours run there and the grant they spent (rate x IPU-hours)."""
    rows = session.execute(
        _scoped(
            select(
                MeterEvent.machine_type,
                func.sum(func.coalesce(MeterEvent.raw_ipu_ms, MeterEvent.ipu_ms)),
                func.sum(MeterEvent.ipu_ms),
            ),
            scope,
            since,
            until,
        )
        .group_by(MeterEvent.machine_type)
        .order_by(MeterEvent.machine_type)
    ).all()
    return [
        {"machine_type": kind or "unknown", "ipu_hours": _hours(raw), "charged_ipu_hours": _hours(charged)}
        for kind, raw, charged in rows
    ]


def by_endpoint(
    *, session: Session, scope: Scope, since: datetime | None = None, until: datetime | None = None
) -> list[UsageEndpointRow]:
    """Per inference endpoint, newest first: what its replicas' holder jobs were billed."""
    rows = session.execute(
        _scoped(
            select(
                Endpoint.id,
                Endpoint.tenant_id,
                Endpoint.name,
                Endpoint.model_name,
                func.sum(MeterEvent.ipu_ms),
            )
            .join(Job, Job.id == MeterEvent.job_id)
            .join(Endpoint, Endpoint.id == Job.endpoint_id),
            scope,
            since,
            until,
        )
        .group_by(Endpoint.id, Endpoint.tenant_id, Endpoint.name, Endpoint.model_name)
        .order_by(Endpoint.id.desc())
    ).all()
    return [
        {"endpoint_id": e, "tenant_id": t, "name": n, "model": m, "ipu_hours": _hours(ms)}
        for e, t, n, m, ms in rows
    ]


def breakdowns(
    *,
    session: Session,
    scope: Scope,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    job_after: str | None = None,
    day_limit: int = 366,
) -> UsageBreakdowns:
    """Usage grouped six ways, over the scope's meter events (`ALL_TENANTS`: across tenants, for admins).

    `by_job` is a page of `limit` jobs (continue with `job_after`); `by_day` the last `day_limit`
    days. Workloads and partition sizes are few, so they are reported whole.
    """
    return {
        "by_day": by_day(session=session, scope=scope, since=since, until=until, limit=day_limit),
        "by_job": by_job(
            session=session, scope=scope, since=since, until=until, after=job_after, limit=limit
        ),
        "by_workload": by_workload(session=session, scope=scope, since=since, until=until),
        "by_partition_size": by_partition_size(session=session, scope=scope, since=since, until=until),
        "by_machine_type": by_machine_type(session=session, scope=scope, since=since, until=until),
        "by_endpoint": by_endpoint(session=session, scope=scope, since=since, until=until),
    }


def ledger_total_ipu_ms(*, session: Session, tenant_id: str) -> int:
    return int(
        session.execute(
            select(func.coalesce(func.sum(MeterEvent.ipu_ms), 0)).where(MeterEvent.tenant_id == tenant_id)
        ).scalar_one()
    )


def tenant_totals(
    *, session: Session, scope: Scope, after: str | None = None, limit: int | None = None
) -> list[Tenant]:
    """The scope's tenants with their counters, by id (a page with `limit`; `after` is a tenant id)."""
    stmt = restrict(select(Tenant).order_by(Tenant.id), Tenant.id, scope)
    if after is not None:
        stmt = stmt.where(Tenant.id > after)
    if limit is not None:
        stmt = stmt.limit(limit)
    return list(session.execute(stmt).scalars())
