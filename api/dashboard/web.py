"""The dashboard's plumbing: templates, who is signed in, HTML error pages, security headers."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from anyio import to_thread
from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from api.dashboard import sessions
from api.deps import DbDep
from scheduler import figures
from scheduler.errors import DomainError, Forbidden, Unauthorized
from scheduler.services.tenancy import keys
from vipu.machine_types import LAYOUTS, MACHINES, SERVER_MODELS

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)


def _asset_versions() -> dict[str, str]:
    # Content hashes in asset URLs: browsers may cache them forever and still see every change.
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:10] for p in STATIC_DIR.iterdir() if p.is_file()
    }


_ASSETS = _asset_versions()


def asset(name: str) -> str:
    return f"/static/{name}?v={_ASSETS.get(name, '0')}"


def hours(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    if value and abs(value) < 10 ** (-digits):
        return f"{value:.{digits + 3}f}"
    return f"{value:,.{digits}f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = float(seconds)
    if s == 0:
        return "0 s"
    if s < 0.001:  # a small model's step: "0 ms" said nothing
        return f"{s * 1e6:.0f} µs"
    if s < 0.01:
        return f"{s * 1000:.2f} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def when(value: datetime | None) -> str:
    if value is None:
        return "–"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat()


templates = Jinja2Templates(directory=str(HERE / "templates"))
# Machine types and server models come from the registry (vipu/machine_types.py): a new type needs no
# template edit. (value, label) pairs for the forms' selects.
MACHINE_CHOICES = tuple((kind.value, f"{m.product} ({m.chip})") for kind, m in MACHINES.items())
POD_CHOICES = tuple(
    (kind.value, m.product)
    for kind, m in MACHINES.items()
    if any(LAYOUTS[n].name != "server" for n in m.layouts)
)
LAYOUT_CHOICES = tuple((name, layout.label) for name, layout in LAYOUTS.items() if name != "server")
SERVER_CHOICES = tuple(SERVER_MODELS.items())
templates.env.globals.update(
    asset=asset,
    machine_choices=MACHINE_CHOICES,
    pod_choices=POD_CHOICES,
    layout_choices=LAYOUT_CHOICES,
    server_choices=SERVER_CHOICES,
)
templates.env.filters.update(hours=hours, duration=duration, when=when, iso=iso, flops=figures.flops)


class LoginRequired(Exception):
    def __init__(self, next_path: str) -> None:
        self.next_path = next_path


def render(
    request: Request,
    template: str,
    context: Mapping[str, Any] | None = None,
    *,
    status_code: int = 200,
    user: sessions.DashSession | None = None,
) -> HTMLResponse:
    user = user if user is not None else getattr(request.state, "dash_user", None)
    ctx = {
        "user": user,
        "flashes": sessions.take_flashes(user) if user is not None else [],
        "path": request.url.path,
        # Every figure a page shows names its clock (`clock.name`, `clock.wall_name`): the app's.
        "clock": request.app.state.runtime.clock,
        **(context or {}),
    }
    response = templates.TemplateResponse(request, template, ctx, status_code=status_code)
    if user is not None:
        # Pages of a signed-in user are theirs alone: never cached (the key-once page above all).
        response.headers["Cache-Control"] = "no-store"
    return response


def error_page(request: Request, status: int, title: str, detail: str) -> HTMLResponse:
    user = getattr(request.state, "dash_user", None)
    return render(
        request,
        "error.html",
        {"status": status, "title": title, "detail": detail},
        status_code=status,
        user=user,
    )


def safe_next(path: str | None) -> str:
    """Only a path on this site: `//host` and absolute URLs would make sign-in an open redirect."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):  # a header (Location) cannot carry them
        return "/"
    return path


class DashboardRoute(APIRoute):
    """Dashboard routes answer errors with HTML pages, and every response with security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                response = await handler(request)
            except LoginRequired as exc:
                target = "/login" if exc.next_path in ("/", "") else f"/login?next={exc.next_path}"
                response = RedirectResponse(target, status_code=303)
            except DomainError as exc:
                # Rendering reads the user's notices from Redis: not on the event loop.
                response = await to_thread.run_sync(error_page, request, exc.status, exc.title, exc.detail)
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {}
                where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
                detail = f"{where}: {first.get('msg', 'invalid')}".strip(": ")
                response = await to_thread.run_sync(error_page, request, 422, "Invalid request", detail)
            security_headers(response)
            return response

        return route


def security_headers(response: Response) -> None:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")


# Who is signed in ---------------------------------------------------------------------------------------


def optional_user(request: Request, db: DbDep) -> sessions.DashSession | None:
    """The signed-in user, checked by key id on every request (cached as API keys are).

    A revoked or expired key, or a deleted tenant, ends the session (the user is signed out); a
    suspended tenant's session ends too, with a 403 saying why."""
    token = request.cookies.get(sessions.COOKIE)
    if not token:
        return None
    store = sessions.store_of(request)
    record = sessions.read(store, token)
    if record is None:
        return None
    try:
        principal = keys.cached_principal_by_id(record.key_id)
        if principal is None:
            with db.read() as s:
                principal = keys.principal_by_id(session=s, key_id=record.key_id)
    except Unauthorized:
        sessions.destroy(store, token)
        return None
    if principal.tenant_id != record.tenant_id or principal.member_id != record.member_id:
        sessions.destroy(store, token)
        return None
    if principal.suspended:
        sessions.destroy(store, token)
        keys.check_standing(principal)
    user = sessions.DashSession(token=token, principal=principal, csrf=record.csrf, store=store)
    request.state.dash_user = user
    return user


OptionalUser = Annotated[sessions.DashSession | None, Depends(optional_user)]


def required_user(request: Request, user: OptionalUser) -> sessions.DashSession:
    if user is None:
        path = request.url.path
        raise LoginRequired(safe_next(path + (f"?{request.url.query}" if request.url.query else "")))
    return user


User = Annotated[sessions.DashSession, Depends(required_user)]


# What the user may do: each page and action asks the same scope as its API twin (a read-only key
# reads, a key without `submit` submits and cancels nothing, only admin keys reach /admin).


def reader_user(user: User) -> sessions.DashSession:
    user.principal.require("read")
    return user


ReaderUser = Annotated[sessions.DashSession, Depends(reader_user)]


def submitter_user(user: User) -> sessions.DashSession:
    user.principal.require("submit")
    return user


SubmitterUser = Annotated[sessions.DashSession, Depends(submitter_user)]


def admin_user(user: User) -> sessions.DashSession:
    if not user.is_admin:
        raise Forbidden("These pages are for cloud administrators; sign in with an admin key.")
    return user


AdminUser = Annotated[sessions.DashSession, Depends(admin_user)]


def tenant_user(user: User) -> sessions.DashSession:
    if user.tenant_id is None:
        raise Forbidden("Admin keys have no tenant: sign in with a tenant's key to run jobs.")
    return user


TenantUser = Annotated[sessions.DashSession, Depends(tenant_user)]


def tenant_reader(user: TenantUser) -> sessions.DashSession:
    user.principal.require("read")
    return user


TenantReader = Annotated[sessions.DashSession, Depends(tenant_reader)]


def tenant_submitter(user: TenantUser) -> sessions.DashSession:
    user.principal.require("submit")
    return user


TenantSubmitter = Annotated[sessions.DashSession, Depends(tenant_submitter)]


async def form_data(request: Request) -> dict[str, str]:
    """The submitted form as plain strings (repeated fields keep their last value).

    A dependency, read on the event loop before the handler runs: the handlers themselves are
    plain functions, which FastAPI runs in worker threads, so their database and Redis calls never
    block the loop."""
    form = await request.form(max_files=0, max_fields=100)
    return {k: v for k, v in form.items() if isinstance(v, str)}


Form = Annotated[dict[str, str], Depends(form_data)]


def markup(svg: str) -> Markup:
    """SVG built by our own drawing code, which escapes every text it puts in."""
    return Markup(svg)
