"""Metered usage: the caller's tenant (`/usage`) and every tenant (`/admin/usage`), as JSON or CSV.

JSON carries every grouping at once: by day (the last `days` days with usage), by job (a page of
`limit` jobs, newest first, continued with `cursor`), by workload, by partition size and by machine
type (IPU-hours run there and the grant they spent at that type's rate). CSV
carries one grouping, chosen with `group`, under a header row naming its columns; a page of jobs
that has more after it says so in a `Link: <...>; rel="next"` header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response

from api.deps import Admin, DbDep, Reader
from api.schemas import (
    AdminUsageOut,
    CursorParam,
    TenantUsage,
    UsageOut,
    UtcDatetime,
    decode_cursor,
    encode_cursor,
)
from api.views import days_left, hours, tenant_status, usage_csv
from scheduler.billing import remaining_ipu_ms
from scheduler.errors import Forbidden
from scheduler.models import Tenant
from scheduler.services.tenancy import rates
from scheduler.services.tenancy import tenants as tenant_service
from scheduler.services.tenancy import usage as usage_service
from scheduler.services.tenancy.scope import ALL_TENANTS, OneTenant, Scope

router = APIRouter(prefix="/api/v1", tags=["usage"])

Format = Literal["json", "csv"]
Group = Literal["job", "day", "workload", "partition_size", "machine_type", "endpoint"]
AdminGroup = Literal["tenant", "job", "day", "workload", "partition_size", "machine_type", "endpoint"]
Since = Annotated[UtcDatetime | None, Query(description="Only usage at or after this instant.")]
Until = Annotated[UtcDatetime | None, Query(description="Only usage before this instant.")]
Cursor = Annotated[
    str | None, Query(max_length=200, description="`next_cursor` of the previous page of jobs.")
]
Limit = Annotated[int, Query(ge=1, le=1000, description="Jobs per page in `by_job`.")]
Days = Annotated[int, Query(ge=1, le=3660, description="At most this many days in `by_day` (the latest).")]

COLUMNS: dict[str, list[str]] = {
    "job": [
        "job_id",
        "tenant_id",
        "name",
        "workload",
        "partition_size",
        "machine_type",
        "rate",
        "raw_ipu_hours",
        "charged_ipu_hours",
        "ipu_hours",
    ],
    "day": ["day", "ipu_hours"],
    "workload": ["workload", "ipu_hours"],
    "partition_size": ["partition_size", "ipu_hours"],
    "machine_type": ["machine_type", "ipu_hours", "charged_ipu_hours"],
    "endpoint": ["endpoint_id", "tenant_id", "name", "model", "ipu_hours"],
    "tenant": [
        "tenant_id",
        "name",
        "plan",
        "status",
        "quota_ipu_hours",
        "used_ipu_hours",
        "reserved_ipu_hours",
        "remaining_ipu_hours",
        "expires_at",
    ],
}
CSV_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/csv": {"schema": {"type": "string"}}},
        "description": "JSON, or with `format=csv` one grouping as CSV with a header row.",
    }
}


def wants_csv(request: Request, format: str) -> bool:
    """CSV when `format=csv`, or when no `format` is given and the Accept header names `text/csv`
    before JSON (or without it): `Accept: text/csv` answered JSON before."""
    if format == "csv" or "format" in request.query_params:
        return format == "csv"
    for part in request.headers.get("accept", "").split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media == "text/csv":
            return True
        if media in ("application/json", "application/problem+json", "*/*", "application/*"):
            return False
    return False


def _csv_response(
    rows: Sequence[Mapping[str, Any]], group: str, filename: str, next_url: Any = None
) -> Response:
    headers = {"Content-Disposition": f'attachment; filename="{filename}-{group}.csv"'}
    if next_url is not None:
        headers["Link"] = f'<{next_url}>; rel="next"'
    return Response(usage_csv(rows, COLUMNS[group]), media_type="text/csv", headers=headers)


def _tenant_usage(t: Tenant) -> TenantUsage:
    return TenantUsage(
        tenant_id=t.id,
        name=t.name,
        plan=t.plan_name,
        status=tenant_status(t),
        quota_ipu_hours=hours(t.quota_ipu_ms),
        used_ipu_hours=hours(t.used_ipu_ms),
        reserved_ipu_hours=hours(t.reserved_ipu_ms),
        remaining_ipu_hours=hours(remaining_ipu_ms(t)),
        expires_at=t.expires_at,
    )


@router.get(
    "/usage",
    response_model=UsageOut,
    summary="The tenant's metered usage and remaining quota (JSON, or one grouping as CSV)",
    responses=CSV_RESPONSE,
)
def get_usage(
    request: Request,
    principal: Reader,
    db: DbDep,
    format: Format = "json",
    group: Annotated[Group, Query(description="The grouping a CSV carries.")] = "job",
    since: Since = None,
    until: Until = None,
    cursor: CursorParam = None,
    limit: Limit = 100,
    days: Days = 366,
) -> Response | UsageOut:
    if principal.tenant_id is None:
        raise Forbidden("Admin keys have no tenant: use GET /api/v1/admin/usage.")
    with db.read() as s:
        t = tenant_service.get_tenant(session=s, tenant_id=principal.tenant_id)
        groups = usage_service.breakdowns(
            session=s,
            scope=OneTenant(t.id),
            since=since,
            until=until,
            limit=limit + 1,
            job_after=decode_cursor(cursor),
            day_limit=days,
        )
        plan_rates, machine_types = rates.plan_terms(session=s, plan_name=t.plan_name)
    jobs = groups["by_job"]
    next_cursor = encode_cursor(jobs[limit - 1]["job_id"]) if len(jobs) > limit else None
    groups["by_job"] = jobs[:limit]
    if wants_csv(request, format):
        more = next_cursor is not None and group == "job"
        url = request.url.include_query_params(cursor=next_cursor) if more else None
        by_name: Mapping[str, Any] = groups
        return _csv_response(by_name[f"by_{group}"], group, "usage", url)
    remaining = remaining_ipu_ms(t)
    return UsageOut(
        tenant_id=t.id,
        plan=t.plan_name,
        rates=plan_rates,
        machine_types=list(machine_types),
        quota_ipu_hours=hours(t.quota_ipu_ms),
        used_ipu_hours=hours(t.used_ipu_ms),
        reserved_ipu_hours=hours(t.reserved_ipu_ms),
        remaining_ipu_hours=hours(remaining),
        used_ipu_seconds=round(t.used_ipu_ms / 1000, 3),
        expires_at=t.expires_at,
        days_left=days_left(t.expires_at),
        next_cursor=next_cursor,
        **groups,
    )


@router.get(
    "/admin/usage",
    response_model=AdminUsageOut,
    summary="Usage across tenants (JSON, or one grouping as CSV)",
    responses=CSV_RESPONSE,
    tags=["admin"],
)
def admin_usage(
    request: Request,
    principal: Admin,
    db: DbDep,
    format: Format = "json",
    group: Annotated[AdminGroup, Query(description="The grouping a CSV carries.")] = "tenant",
    tenant: Annotated[str | None, Query(min_length=1, max_length=40, description="Only this tenant.")] = None,
    since: Since = None,
    until: Until = None,
    cursor: CursorParam = None,
    limit: Limit = 100,
    days: Days = 366,
    tenants_cursor: CursorParam = None,
    tenants_limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response | AdminUsageOut:
    with db.read() as s:
        if tenant is not None:
            tenant_service.get_tenant(session=s, tenant_id=tenant)
        scope: Scope = ALL_TENANTS if tenant is None else OneTenant(tenant)
        rows = usage_service.tenant_totals(
            session=s, scope=scope, after=decode_cursor(tenants_cursor), limit=tenants_limit + 1
        )
        groups = usage_service.breakdowns(
            session=s,
            scope=scope,
            since=since,
            until=until,
            limit=limit + 1,
            job_after=decode_cursor(cursor),
            day_limit=days,
        )
    tenants = [_tenant_usage(t) for t in rows[:tenants_limit]]
    tenants_next = encode_cursor(rows[tenants_limit - 1].id) if len(rows) > tenants_limit else None
    jobs = groups["by_job"]
    next_cursor = encode_cursor(jobs[limit - 1]["job_id"]) if len(jobs) > limit else None
    groups["by_job"] = jobs[:limit]
    if wants_csv(request, format):
        if group == "tenant":
            url = request.url.include_query_params(tenants_cursor=tenants_next) if tenants_next else None
            return _csv_response([t.model_dump(mode="json") for t in tenants], group, "usage-all", url)
        more = next_cursor is not None and group == "job"
        url = request.url.include_query_params(cursor=next_cursor) if more else None
        by_name: Mapping[str, Any] = groups
        return _csv_response(by_name[f"by_{group}"], group, "usage-all", url)
    return AdminUsageOut(tenants=tenants, tenants_next_cursor=tenants_next, next_cursor=next_cursor, **groups)
