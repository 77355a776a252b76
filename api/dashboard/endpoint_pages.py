"""A tenant's inference endpoints in the dashboard: the list, and an endpoint's page with its replicas,
its serve plan (latency against throughput), and its history drawn on the server: latency (p50, p90,
p99) and replicas (serving and wanted) per minute, from `endpoint_stats`."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, Response

from api.dashboard import charts
from api.dashboard.web import DashboardRoute, ReaderUser, markup, render
from api.deps import DbDep, RuntimeDep, SettingsDep
from scheduler.services import endpoints as endpoint_service
from scheduler.services.clock import db_now

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

EndpointRef = Annotated[str, Path(min_length=1, max_length=64)]


def _base(request: Request, public_url: str | None) -> str:
    return public_url or str(request.base_url)


@router.get("/endpoints", response_class=HTMLResponse)
def endpoints_page(request: Request, db: DbDep, settings: SettingsDep, user: ReaderUser) -> Response:
    with db.read() as s:
        rows = endpoint_service.list_endpoints(session=s, scope=user.principal.scope, after=None, limit=100)
        ids = [r.id for r in rows]
        replicas = endpoint_service.replicas_of(session=s, endpoint_ids=ids, now=db_now(s))
        billed = endpoint_service.billed_ipu_ms(session=s, endpoint_ids=ids)
        views = [
            endpoint_service.endpoint_json(
                ep=r,
                replicas=replicas[r.id],
                billed_ipu_ms=billed.get(r.id, 0),
                base_url=_base(request, settings.public_url),
            )
            for r in rows
        ]
    return render(request, "endpoints.html", {"endpoints": views}, user=user)


def history_charts(history: list[endpoint_service.StatView], name: str) -> dict[str, Any]:
    """The endpoint page's two charts over its minutes."""
    times = [h["minute"] for h in history]
    latency = charts.time_series_chart(
        times,
        [
            ("p50", "#4b4bc8", [h["p50_ms"] for h in history]),
            ("p90", "#c88a1e", [h["p90_ms"] for h in history]),
            ("p99", "#c83c4b", [h["p99_ms"] for h in history]),
        ],
        title=f"{name}: latency per minute, ms",
        unit="ms",
        chart_id="latency-chart",
    )
    replicas = charts.time_series_chart(
        times,
        [
            ("serving", "#2e8b57", [float(h["replicas"]) for h in history]),
            ("wanted", "#4b4bc8", [float(h["desired"]) for h in history]),
        ],
        title=f"{name}: replicas over time",
        unit="replicas",
        chart_id="replicas-chart",
        step=True,
    )
    return {"latency_chart": markup(latency), "replicas_chart": markup(replicas)}


@router.get("/endpoints/{endpoint_id}", response_class=HTMLResponse)
def endpoint_page(
    request: Request,
    endpoint_id: EndpointRef,
    db: DbDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    user: ReaderUser,
    minutes: Annotated[int, Query(ge=1, le=1440)] = 120,
) -> Response:
    with db.read() as s:
        row = endpoint_service.get_endpoint(session=s, endpoint_id=endpoint_id, scope=user.principal.scope)
        now = db_now(s)
        replicas = endpoint_service.replicas_of(session=s, endpoint_ids=[row.id], now=now)[row.id]
        billed = endpoint_service.billed_ipu_ms(session=s, endpoint_ids=[row.id]).get(row.id, 0)
        view = endpoint_service.endpoint_json(
            ep=row, replicas=replicas, billed_ipu_ms=billed, base_url=_base(request, settings.public_url)
        )
        history = endpoint_service.history(
            session=s, endpoint_id=row.id, since=now - timedelta(minutes=minutes)
        )
    window = endpoint_service.window_json(endpoint_service.read_windows(runtime.redis, [row.id]).get(row.id))
    plans = []
    for p in view["serve_plans"]:
        chart = charts.latency_throughput_chart(
            [(b["batch_size"], b["throughput"], b["latency_ms"]) for b in p["batches"]],
            title=f"Serving on {p['ipus']} x {p['machine']}: latency against throughput",
            chart_id=f"plan-{p['machine']}",
        )
        plans.append({**p, "chart": markup(chart)})
    context = {
        "e": view,
        "window": window,
        "plans": plans,
        "minutes": minutes,
        "history": history,
        **history_charts(history, view["name"]),
    }
    return render(request, "endpoint.html", context, user=user)
