"""A tenant's webhooks in the dashboard: the list with a form to register one (its secret shown once),
one webhook's page (change it, pause or enable it, rotate its secret, send a signed test ping, read its
deliveries and send one again), and its removal.

Every page and action asks what its API twin asks (api/routers/webhooks.py): reading needs `read`,
changing needs `submit`, and the service refuses a member who is not an owner (owners manage, members
read); another tenant's webhook is a 404. Forms carry the session's CSRF token, and a cross-site POST is
refused on its Origin before anything is read.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ValidationError

from api.dashboard import forms, sessions
from api.dashboard.web import DashboardRoute, Form, ReaderUser, SubmitterUser, render
from api.deps import DbDep, SettingsDep
from api.schemas.notifications import (
    MAX_OVERLAP_S,
    DeliveryOut,
    WebhookChange,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
)
from scheduler.errors import DomainError, InvalidRequest
from scheduler.services.tenancy import notifications, webhooks

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

WebhookId = Annotated[str, Path(min_length=1, max_length=40)]
DeliveryId = Annotated[int, Path(ge=1, le=2**62)]
PAGE = 50
# The rotation form's choices of how long the old secret keeps signing (wall seconds).
OVERLAPS = (
    (0, "no overlap: the old secret stops now"),
    (3600, "1 hour"),
    (86400, "1 day"),
    (604800, "7 days"),
)
FIELDS_MAX = 2000
Body = TypeVar("Body", bound=BaseModel)


def _is_manager(user: sessions.DashSession) -> bool:
    p = user.principal
    return bool(p.is_admin or p.role == "owner") and ("submit" in p.scopes or p.is_admin)


def _chosen_events(form: dict[str, str]) -> list[str]:
    return [e for e in notifications.EVENT_TYPES if form.get(f"event:{e}")]


def _checked(model: type[Body], data: dict[str, Any]) -> Body:
    """The form's fields validated by the API's own body (the same limits and refused characters on
    both faces); else a 422 naming the first field wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        name, message = next(iter(forms._errors(exc).items()))
        raise InvalidRequest(f"{name}: {message}", field=name)


def _list_page(
    request: Request,
    db: DbDep,
    user: sessions.DashSession,
    *,
    values: dict[str, Any] | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    with db.read() as s:
        rows = webhooks.list_webhooks(session=s, scope=user.principal.scope, after=None, limit=500)
        hooks = [WebhookOut.of(r) for r in rows]
    context = {
        "hooks": hooks,
        "event_types": notifications.EVENT_TYPES,
        "values": values or {"events": []},
        "error": error,
        "manager": _is_manager(user),
    }
    return render(request, "webhooks.html", context, status_code=status_code, user=user)


def _secret_page(
    request: Request, user: sessions.DashSession, created: WebhookCreated, *, rotated: bool
) -> Response:
    response = render(request, "webhook_secret.html", {"hook": created, "rotated": rotated}, user=user)
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@router.get("/webhooks", response_class=HTMLResponse)
def webhooks_page(request: Request, db: DbDep, user: ReaderUser) -> Response:
    return _list_page(request, db, user)


@router.post("/webhooks", response_class=HTMLResponse)
def create(request: Request, db: DbDep, settings: SettingsDep, user: SubmitterUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    values: dict[str, Any] = {
        "url": form.get("url", "")[:FIELDS_MAX],
        "description": form.get("description", "")[:500],
        "events": _chosen_events(form),
    }
    try:
        body = _checked(
            WebhookCreate,
            {
                "url": form.get("url", ""),
                "events": values["events"],
                "description": form.get("description", ""),
            },
        )
        with db.write() as s:
            row, secret = webhooks.create_webhook(
                session=s,
                principal=user.principal,
                url=body.url,
                events=list(body.events),
                description=body.description,
                allow_private=settings.webhook_allow_private,
            )
            created = WebhookCreated.created(row, secret)
    except DomainError as exc:
        if exc.status in (401, 403):
            raise
        return _list_page(request, db, user, values=values, error=exc.detail, status_code=exc.status)
    return _secret_page(request, user, created, rotated=False)


def _detail_page(
    request: Request,
    db: DbDep,
    user: sessions.DashSession,
    webhook_id: str,
    *,
    status: str | None = None,
    before: int | None = None,
    test: dict[str, Any] | None = None,
    error: str | None = None,
    values: dict[str, Any] | None = None,
    status_code: int = 200,
) -> Response:
    with db.read() as s:
        row = webhooks.get_webhook(session=s, scope=user.principal.scope, webhook_id=webhook_id)
        hook = WebhookOut.of(row)
        rows = webhooks.list_deliveries(
            session=s,
            scope=user.principal.scope,
            webhook_id=webhook_id,
            status=status,
            before=before,
            limit=PAGE + 1,
        )
        deliveries = [DeliveryOut.of(d) for d in rows[:PAGE]]
    context = {
        "hook": hook,
        "deliveries": deliveries,
        "more": deliveries[-1].id if len(rows) > PAGE else None,
        "status": status,
        "statuses": webhooks.DELIVERY_STATUSES,
        "event_types": notifications.EVENT_TYPES,
        "values": values or {"url": hook.url, "description": hook.description, "events": hook.events},
        "overlaps": OVERLAPS,
        "test": test,
        "error": error,
        "manager": _is_manager(user),
    }
    return render(request, "webhook.html", context, status_code=status_code, user=user)


@router.get("/webhooks/{webhook_id}", response_class=HTMLResponse)
def webhook_page(
    request: Request,
    webhook_id: WebhookId,
    db: DbDep,
    user: ReaderUser,
    status: Literal["pending", "succeeded", "failed"] | None = None,
    before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> Response:
    return _detail_page(request, db, user, webhook_id, status=status, before=before)


@router.post("/webhooks/{webhook_id}", response_class=HTMLResponse)
def change(
    request: Request,
    webhook_id: WebhookId,
    db: DbDep,
    settings: SettingsDep,
    user: SubmitterUser,
    form: Form,
) -> Response:
    """Change the URL, description and events (the form sends all three)."""
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    values: dict[str, Any] = {
        "url": form.get("url", "")[:FIELDS_MAX],
        "description": form.get("description", "")[:500],
        "events": _chosen_events(form),
    }
    try:
        # An empty URL leaves it as it is; the description and events are what the form shows.
        changes = _checked(
            WebhookChange,
            {
                "url": form.get("url", "") or None,
                "description": form.get("description", ""),
                "events": values["events"],
            },
        ).model_dump(exclude_none=True)
        with db.write() as s:
            webhooks.update_webhook(
                session=s,
                principal=user.principal,
                webhook_id=webhook_id,
                changes=changes,
                allow_private=settings.webhook_allow_private,
            )
    except DomainError as exc:
        if exc.status in (401, 403, 404):
            raise
        return _detail_page(
            request, db, user, webhook_id, error=exc.detail, values=values, status_code=exc.status
        )
    sessions.flash(user, "Webhook saved.")
    return RedirectResponse(f"/webhooks/{webhook_id}", status_code=303)


def _switch(
    request: Request, webhook_id: str, db: DbDep, settings: SettingsDep, user: Any, form: Form, *, on: bool
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        webhooks.update_webhook(
            session=s,
            principal=user.principal,
            webhook_id=webhook_id,
            changes={"enabled": on},
            allow_private=settings.webhook_allow_private,
        )
    sessions.flash(
        user,
        "Webhook enabled; its failures are forgotten. Redeliver what it missed below."
        if on
        else "Webhook disabled: nothing is sent to it until you enable it.",
    )
    return RedirectResponse(f"/webhooks/{webhook_id}", status_code=303)


@router.post("/webhooks/{webhook_id}/enable", response_class=HTMLResponse)
def enable(
    request: Request, webhook_id: WebhookId, db: DbDep, settings: SettingsDep, user: SubmitterUser, form: Form
) -> Response:
    return _switch(request, webhook_id, db, settings, user, form, on=True)


@router.post("/webhooks/{webhook_id}/disable", response_class=HTMLResponse)
def disable(
    request: Request, webhook_id: WebhookId, db: DbDep, settings: SettingsDep, user: SubmitterUser, form: Form
) -> Response:
    return _switch(request, webhook_id, db, settings, user, form, on=False)


@router.post("/webhooks/{webhook_id}/rotate-secret", response_class=HTMLResponse)
def rotate(request: Request, webhook_id: WebhookId, db: DbDep, user: SubmitterUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    raw = form.get("overlap_s", "86400")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 7 and int(raw) <= MAX_OVERLAP_S):
        raise InvalidRequest(f"overlap_s is whole seconds, 0 to {MAX_OVERLAP_S:,}.", field="overlap_s")
    with db.write() as s:
        row, secret = webhooks.rotate_secret(
            session=s, principal=user.principal, webhook_id=webhook_id, overlap_s=int(raw)
        )
        created = WebhookCreated.created(row, secret)
    return _secret_page(request, user, created, rotated=True)


@router.post("/webhooks/{webhook_id}/test", response_class=HTMLResponse)
def test(
    request: Request, webhook_id: WebhookId, db: DbDep, settings: SettingsDep, user: SubmitterUser, form: Form
) -> Response:
    """A signed `webhook.ping` now, as `POST /api/v1/webhooks/{id}/test` sends it; the page shows what the
    receiver answered."""
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    ping = webhooks.send_ping(db=db, principal=user.principal, webhook_id=webhook_id, settings=settings)
    outcome, msg_id = ping.outcome, ping.msg_id
    result = {
        "ok": outcome.ok,
        "status": outcome.status,
        "latency_ms": outcome.latency_ms,
        "body_excerpt": outcome.excerpt,
        "error": outcome.error,
        "msg_id": msg_id,
    }
    return _detail_page(request, db, user, webhook_id, test=result)


@router.post("/webhooks/{webhook_id}/delete", response_class=HTMLResponse)
def remove(request: Request, webhook_id: WebhookId, db: DbDep, user: SubmitterUser, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    with db.write() as s:
        row = webhooks.delete_webhook(session=s, principal=user.principal, webhook_id=webhook_id)
        url = row.url
    sessions.flash(user, f"Webhook to {url} removed, with its deliveries.")
    return RedirectResponse("/webhooks", status_code=303)


@router.post("/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver", response_class=HTMLResponse)
def redeliver(
    request: Request,
    webhook_id: WebhookId,
    delivery_id: DeliveryId,
    db: DbDep,
    user: SubmitterUser,
    form: Form,
) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    try:
        with db.write() as s:
            row = webhooks.redeliver(
                session=s, principal=user.principal, webhook_id=webhook_id, delivery_id=delivery_id
            )
            event_id = row.event_id
    except DomainError as exc:
        if exc.status != 422:
            raise
        return _detail_page(request, db, user, webhook_id, error=exc.detail, status_code=exc.status)
    sessions.flash(user, f"{event_id} queued again as a new delivery, with the same webhook-id.")
    return RedirectResponse(f"/webhooks/{webhook_id}", status_code=303)
