"""Usage reports from the meter ledger: by day, job, workload and partition size."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Date, cast, func, select
from sqlalchemy.orm import Session

from scheduler.models import IPU_MS_PER_HOUR, Job, MeterEvent, Tenant


def job_used_ipu_ms(*, session: Session, job_id: str) -> int:
    return int(
        session.execute(
            select(func.coalesce(func.sum(MeterEvent.ipu_ms), 0)).where(MeterEvent.job_id == job_id)
        ).scalar_one()
    )


def _hours(ms: int | None) -> float:
    return round((ms or 0) / IPU_MS_PER_HOUR, 6)


def breakdowns(
    *,
    session: Session,
    tenant_id: str | None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 1000,
) -> dict[str, list[dict[str, Any]]]:
    """Usage grouped four ways. `tenant_id=None` reports across tenants (admins)."""

    def scoped(stmt: Any) -> Any:
        if tenant_id is not None:
            stmt = stmt.where(MeterEvent.tenant_id == tenant_id)
        if since is not None:
            stmt = stmt.where(MeterEvent.at >= since)
        if until is not None:
            stmt = stmt.where(MeterEvent.at < until)
        return stmt

    total = func.sum(MeterEvent.ipu_ms)
    day = (
        cast(MeterEvent.at, Date)
        if session.get_bind().dialect.name == "postgresql"
        else func.date(MeterEvent.at)
    )
    by_day = session.execute(
        scoped(select(day.label("day"), total).group_by(day).order_by(day)).limit(limit)
    ).all()
    by_job = session.execute(
        scoped(
            select(
                MeterEvent.job_id, Job.name, MeterEvent.workload, func.max(MeterEvent.partition_size), total
            )
            .join(Job, Job.id == MeterEvent.job_id)
            .group_by(MeterEvent.job_id, Job.name, MeterEvent.workload)
            .order_by(MeterEvent.job_id.desc())
        ).limit(limit)
    ).all()
    by_workload = session.execute(
        scoped(select(MeterEvent.workload, total).group_by(MeterEvent.workload).order_by(MeterEvent.workload))
    ).all()
    by_size = session.execute(
        scoped(
            select(MeterEvent.partition_size, total)
            .group_by(MeterEvent.partition_size)
            .order_by(MeterEvent.partition_size)
        )
    ).all()
    return {
        "by_day": [{"day": str(d), "ipu_hours": _hours(ms)} for d, ms in by_day],
        "by_job": [
            {"job_id": j, "name": n, "workload": w, "partition_size": size, "ipu_hours": _hours(ms)}
            for j, n, w, size, ms in by_job
        ],
        "by_workload": [{"workload": w, "ipu_hours": _hours(ms)} for w, ms in by_workload],
        "by_partition_size": [{"partition_size": s, "ipu_hours": _hours(ms)} for s, ms in by_size],
    }


def ledger_total_ipu_ms(*, session: Session, tenant_id: str) -> int:
    return int(
        session.execute(
            select(func.coalesce(func.sum(MeterEvent.ipu_ms), 0)).where(MeterEvent.tenant_id == tenant_id)
        ).scalar_one()
    )


def tenant_totals(*, session: Session) -> list[Tenant]:
    return list(session.execute(select(Tenant).order_by(Tenant.name)).scalars())
