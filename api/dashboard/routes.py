"""Dashboard pages."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from api.deps import DbDep
from scheduler.services import fleet

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def home(request: Request, db: DbDep) -> HTMLResponse:
    with db.read() as s:
        shape = fleet.fleet_shape(session=s)
    return templates.TemplateResponse(
        request,
        "home.html",
        {"pods": shape.pods, "ipus": shape.ipus, "types": sorted({str(t) for t in shape.machine_types})},
    )
