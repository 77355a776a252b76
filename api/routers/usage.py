"""The tenant's metered usage and what is left of its grant (JSON or CSV)."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Response

from api.deps import DbDep, Reader
from api.schemas import UsageOut
from api.views import days_left, hours
from scheduler.errors import InvalidRequest
from scheduler.services import tenants as tenant_service
from scheduler.services import usage as usage_service

router = APIRouter(prefix="/api/v1", tags=["usage"])


def usage_csv(rows: list[dict[str, object]], fields: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buf.getvalue()


@router.get(
    "/usage",
    response_model=UsageOut,
    summary="Metered usage and remaining quota",
    responses={200: {"content": {"text/csv": {}}}},
)
def get_usage(
    principal: Reader,
    db: DbDep,
    format: Literal["json", "csv"] = "json",
    since: datetime | None = None,
    until: datetime | None = None,
) -> Response | UsageOut:
    if principal.tenant_id is None:
        raise InvalidRequest("Admin keys have no tenant: use GET /api/v1/admin/usage.")
    if (since is not None and since.tzinfo is None) or (until is not None and until.tzinfo is None):
        raise InvalidRequest("since and until need a timezone (e.g. 2026-12-01T00:00:00Z).")
    with db.read() as s:
        t = tenant_service.get_tenant(session=s, tenant_id=principal.tenant_id)
        groups = usage_service.breakdowns(session=s, tenant_id=t.id, since=since, until=until)
    if format == "csv":
        rows = [dict(r, tenant_id=t.id) for r in groups["by_job"]]
        body = usage_csv(rows, ["tenant_id", "job_id", "name", "workload", "partition_size", "ipu_hours"])
        return Response(
            body, media_type="text/csv", headers={"Content-Disposition": 'attachment; filename="usage.csv"'}
        )
    remaining = max(0, t.quota_ipu_ms - t.used_ipu_ms - t.reserved_ipu_ms)
    return UsageOut(
        tenant_id=t.id,
        plan=t.plan_name,
        quota_ipu_hours=hours(t.quota_ipu_ms),
        used_ipu_hours=hours(t.used_ipu_ms),
        reserved_ipu_hours=hours(t.reserved_ipu_ms),
        remaining_ipu_hours=hours(remaining),
        used_ipu_seconds=round(t.used_ipu_ms / 1000, 3),
        expires_at=t.expires_at,
        days_left=days_left(t.expires_at),
        **groups,
    )
