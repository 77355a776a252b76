"""A tenant's job arrays and sweeps in the dashboard: the list, and an array's page with a grid of its
elements by state, its progress, a results table of the swept parameters against each element's run
time, throughput and IPU-hours (sorted on the server by any column, and as CSV), a plot of throughput
against a swept parameter drawn on the server, and "retry failed" (`POST /api/v1/arrays/{id}/retry`
with `failed`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.dashboard import charts, sessions
from api.dashboard.web import DashboardRoute, Form, ReaderUser, SubmitterUser, markup, render
from api.deps import DbDep
from api.views import array_out
from scheduler import bus
from scheduler.errors import DomainError, InvalidRequest, NotFound, Unauthorized
from scheduler.services.batch import arrays as array_service
from scheduler.services.batch.arrays import ElementResult
from scheduler.services.clock import db_now

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

ArrayRef = Annotated[str, Path(min_length=1, max_length=64)]
# The most elements the page draws as grid cells and table rows (the CSV has every one).
MAX_CELLS = 2_000
MAX_ROWS = 500
FIGURES = ("index", "state", "run_s", "throughput", "ipu_hours")
SortKey = Annotated[str, Query(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9_.:]+$")]


@router.get("/arrays", response_class=HTMLResponse)
def arrays_page(request: Request, db: DbDep, user: ReaderUser) -> Response:
    with db.read() as s:
        rows = array_service.list_arrays(session=s, scope=user.principal.scope, after=None, limit=100)
        views = [array_out(summary) for summary in array_service.summaries(session=s, arrays=rows)]
    return render(request, "arrays.html", {"arrays": views}, user=user)


def _parameters(array: Any, results: Sequence[ElementResult]) -> list[str]:
    """The swept parameters, in the order the sweep gave them."""
    names = list(((array.sweep or {}).get("parameters") or {}).keys())
    for r in results:
        names += [k for k in (r.params or {}) if k not in names]
    return names


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _sort(results: list[ElementResult], key: str, order: str) -> list[ElementResult]:
    """By a figure or by a parameter (`param:<path>`); elements without a value last either way."""

    def value(r: ElementResult) -> object:
        if key.startswith("param:"):
            return (r.params or {}).get(key[len("param:") :])
        return getattr(r, key)

    present = [r for r in results if value(r) is not None]
    absent = [r for r in results if value(r) is None]

    def rank(r: ElementResult) -> tuple[int, Any, int]:
        v = value(r)
        return (0, v, r.index) if _numeric(v) else (1, str(v), r.index)

    present.sort(key=rank, reverse=order == "desc")
    return present + absent


def _chart(results: Sequence[ElementResult], params: list[str], x: str, name: str) -> str | None:
    """Throughput against parameter `x` (the index for a plain array), a series per value of the
    other parameters; only elements that ran report a throughput."""
    series: dict[str, list[tuple[float, float]]] = {}
    for r in results:
        if r.throughput is None:
            continue
        at = r.index if x == "index" else (r.params or {}).get(x)
        if not _numeric(at):
            continue
        label = ", ".join(f"{p}={(r.params or {}).get(p)}" for p in params if p != x)
        series.setdefault(label, []).append((float(at), r.throughput))  # type: ignore[arg-type]
    if not series:
        return None
    return charts.sweep_chart(
        list(series.items()),
        title=f"{name}: throughput against {x}",
        x_label=x,
        y_label="samples/s",
        chart_id="sweep-chart",
    )


def _page(
    request: Request,
    db: DbDep,
    user: sessions.DashSession,
    array_id: str,
    *,
    sort: str = "index",
    order: str = "asc",
    x: str | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    scope = user.principal.scope
    with db.read() as s:
        array = array_service.get_array(session=s, array_id=array_id, scope=scope)
        (summary,) = array_service.summaries(session=s, arrays=[array])
        results = array_service.results(session=s, array_id=array_id, scope=scope, now=db_now(s))
        view = array_out(summary)
    params = _parameters(array, results)
    if sort not in FIGURES and not (sort.startswith("param:") and sort[len("param:") :] in params):
        choices = ", ".join([*FIGURES, *(f"param:{p}" for p in params)])
        raise InvalidRequest(f"sort: one of {choices}.", field="sort")
    numeric = [p for p in params if any(_numeric((r.params or {}).get(p)) for r in results)]
    if x is not None and x not in numeric and x != "index":
        raise InvalidRequest(
            f"x: a swept parameter with numbers ({', '.join(numeric) or 'none'}).", field="x"
        )
    if x is None:
        x = numeric[0] if numeric else "index"
    chart = _chart(results, params, x, array.name)
    context = {
        "a": view,
        "cells": results[:MAX_CELLS],
        "more_cells": max(0, len(results) - MAX_CELLS),
        "rows": _sort(list(results), sort, order)[:MAX_ROWS],
        "more_rows": max(0, len(results) - MAX_ROWS),
        "params": params,
        "sort": sort,
        "order": order,
        "x": x,
        "x_choices": numeric,
        "chart": markup(chart) if chart else None,
        "failed": sum(1 for r in results if r.state in ("failed", "cancelled")),
        "error": error,
    }
    return render(request, "array.html", context, status_code=status_code, user=user)


@router.get("/arrays/{array_id}", response_class=HTMLResponse)
def array_page(
    request: Request,
    array_id: ArrayRef,
    db: DbDep,
    user: ReaderUser,
    sort: SortKey = "index",
    order: Literal["asc", "desc"] = "asc",
    x: SortKey | None = None,
) -> Response:
    return _page(request, db, user, array_id, sort=sort, order=order, x=x)


@router.get("/arrays/{array_id}/results.csv")
def array_results_csv(array_id: ArrayRef, db: DbDep, user: ReaderUser) -> Response:
    """Every element's row, by index: what the page's table shows, for a spreadsheet."""
    scope = user.principal.scope
    with db.read() as s:
        array = array_service.get_array(session=s, array_id=array_id, scope=scope)
        results = array_service.results(session=s, array_id=array_id, scope=scope, now=db_now(s))
    params = _parameters(array, results)
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["index", "job_id", "state", *params, "run_s", "throughput", "ipu_hours"])
    for r in results:
        out.writerow(
            [
                r.index,
                r.job_id,
                r.state,
                *[_cell((r.params or {}).get(p)) for p in params],
                "" if r.run_s is None else f"{r.run_s:.3f}",
                "" if r.throughput is None else f"{r.throughput:.3f}",
                f"{r.ipu_hours:.6f}",
            ]
        )
    return Response(
        buf.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{array.id}.csv"',
            "Cache-Control": "no-store",
        },
    )


def _cell(value: object) -> str:
    """A parameter's value for a spreadsheet: a text a formula could start with is quoted, so that
    opening the file runs nothing (`=`, `+`, `-`, `@` as the first character)."""
    if value is None:
        return ""
    text = str(value)
    if not _numeric(value) and text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + text
    return text


@router.post("/arrays/{array_id}/retry", response_class=HTMLResponse)
def retry_failed(
    request: Request, array_id: ArrayRef, db: DbDep, user: SubmitterUser, form: Form
) -> Response:
    """Queue every failed or cancelled element again, as `POST /api/v1/arrays/{id}/retry` with
    `{"indices": "failed"}` does (reserving their cost again)."""
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    try:
        with db.write() as s:
            ids = array_service.retry_elements(
                session=s, array_id=array_id, scope=user.principal.scope, indices="failed"
            )
    except DomainError as exc:  # nothing to retry (409), or the grant no longer covers them (403)
        if isinstance(exc, NotFound | Unauthorized):
            raise
        return _page(request, db, user, array_id, error=exc.detail, status_code=exc.status)
    bus.wake_scheduler("retry")
    sessions.flash(user, f"{len(ids)} failed or cancelled element(s) of {array_id} queued again.")
    return RedirectResponse(f"/arrays/{array_id}", status_code=303)
