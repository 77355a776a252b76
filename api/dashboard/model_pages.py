"""A tenant's own models in the dashboard: the list with an upload form, one model's page, removal.

The upload is a plain multipart form (no script needed): the file is spooled to disk as it arrives and
stripped of its weights, exactly as the API's ``POST /api/v1/models`` does.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.dashboard import sessions
from api.dashboard.web import DashboardRoute, Form, TenantReader, TenantSubmitter, render
from api.deps import DbDep, SettingsDep
from api.schemas import ModelOut
from api.uploads import receive_upload
from scheduler import figures
from scheduler.errors import DomainError, InvalidRequest
from scheduler.services import own_models

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

ModelRef = Annotated[str, Path(min_length=1, max_length=100)]
UPLOAD_FIELDS = frozenset({"file", "name", "dims", "elementwise", "csrf"})


def tenant_models(db: DbDep, tenant_id: str) -> list[ModelOut]:
    """The tenant's models, newest first (for the list and the submit form's choices)."""
    with db.read() as s:
        return [
            ModelOut.of(m)
            for m in own_models.list_models(session=s, tenant_id=tenant_id, after=None, limit=500)
        ]


def _page(
    request: Request,
    db: DbDep,
    user: sessions.DashSession,
    *,
    values: dict[str, str] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    context = {"models": tenant_models(db, str(user.tenant_id)), "values": values or {}, "error": error}
    return render(request, "models.html", context, status_code=status_code, user=user)


@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request, db: DbDep, user: TenantReader) -> Response:
    return _page(request, db, user)


@router.post("/models/upload", response_class=HTMLResponse)
async def upload(request: Request, db: DbDep, settings: SettingsDep, user: TenantSubmitter) -> Response:
    # Async to stream the file to disk as it arrives; everything that reads the database or Redis
    # runs in a worker thread, never on the event loop. A cross-site request is refused before any of
    # its body is read, a forged CSRF token (the form sends it before the file) before its file is.
    sessions.check_origin(request)
    await to_thread.run_sync(_may_upload, db, str(user.tenant_id))

    def check_token(fields: dict[str, str]) -> None:
        sessions.check_csrf(request, fields.get("csrf"), user.csrf)

    received = await receive_upload(
        request,
        fields=UPLOAD_FIELDS,
        max_bytes=settings.model_upload_max_bytes,
        spool_dir=settings.upload_dir,
        before_file=check_token,
    )
    values = {k: received.fields.get(k, "") for k in ("name", "dims", "elementwise")}
    try:
        sessions.check_csrf(request, received.fields.get("csrf"), user.csrf)
        name = values["name"] or own_models.name_from_filename(received.filename)
        if not name:
            raise InvalidRequest("Give the model a name (the file's name does not make one).", field="name")
        own_models.check_name(name)
        dims = own_models.parse_dims(values["dims"])
        elementwise = own_models.parse_elementwise(values["elementwise"])
        analysed = await to_thread.run_sync(
            partial(
                own_models.analyse,
                data=received.path,
                dims=dims,
                elementwise=elementwise,
                max_graph_bytes=settings.model_graph_max_bytes,
            )
        )
        model_id = await to_thread.run_sync(_store, db, str(user.tenant_id), name, analysed)
    except DomainError as exc:
        if exc.status in (401, 403):
            raise
        names = exc.extra.get("names") or []
        detail = exc.detail + (
            f" ({', '.join(map(str, names))})"
            if names and not all(str(n) in exc.detail for n in names)
            else ""
        )
        page = partial(_page, request, db, user, values=values, error=detail, status_code=exc.status)
        return await to_thread.run_sync(page)
    finally:
        received.remove()
    await to_thread.run_sync(sessions.flash, user, f"Model {name} uploaded.")
    return RedirectResponse(f"/models/{model_id}", status_code=303)


def _may_upload(db: DbDep, tenant_id: str) -> None:
    with db.read() as s:
        own_models.may_upload(session=s, tenant_id=tenant_id)


def _store(db: DbDep, tenant_id: str, name: str, analysed: own_models.Analysed) -> str:
    with db.write() as s:
        return own_models.create_model(session=s, tenant_id=tenant_id, name=name, analysed=analysed).id


@router.get("/models/{model}", response_class=HTMLResponse)
def model_page(request: Request, model: ModelRef, db: DbDep, user: TenantReader) -> Response:
    with db.read() as s:
        m = ModelOut.of(own_models.get_model(session=s, tenant_id=str(user.tenant_id), ref=model))
    return render(request, "model.html", {"model": m}, user=user)


@router.post("/models/{model}/delete", response_class=HTMLResponse)
def delete(request: Request, model: ModelRef, db: DbDep, user: TenantSubmitter, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    try:
        removed = _remove(db, str(user.tenant_id), model)
    except DomainError as exc:
        if exc.status != 409:
            raise
        with db.read() as s:
            m = ModelOut.of(own_models.get_model(session=s, tenant_id=str(user.tenant_id), ref=model))
        return render(request, "model.html", {"model": m, "error": exc.detail}, status_code=409, user=user)
    sessions.flash(user, f"Model {removed} removed.")
    return RedirectResponse("/models", status_code=303)


def _remove(db: DbDep, tenant_id: str, ref: str) -> str:
    with db.write() as s:
        return own_models.delete_model(session=s, tenant_id=tenant_id, ref=ref).name


def submit_choices(db: DbDep, tenant_id: str) -> list[dict[str, Any]]:
    """The tenant's models as the submit form lists them beside the catalogue."""
    out = []
    for m in tenant_models(db, tenant_id):
        dims = ", ".join(f"{k}={v}" for k, v in m.dims.items())
        out.append(
            {
                "name": m.name,
                "description": f"Your ONNX model: {m.parameters:,} parameters, "
                f"{figures.flops(m.forward_flops_per_sample)} per sample forward"
                + (f"; {dims} unless you give seq_len" if dims else ""),
                "seq": next(iter(m.dims.values()), None),
            }
        )
    return out
