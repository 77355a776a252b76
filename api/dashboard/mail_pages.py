"""E-mail in the dashboard: the claim link an approved applicant follows (their first key, once, and
signed in), the List-Unsubscribe link of every notification, a member's notification settings, and,
for admins, the messages kept as `.eml` files when the cloud has no SMTP server (`ipucloud up`)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.dashboard import sessions
from api.dashboard.web import AdminUser, DashboardRoute, Form, TenantReader, TenantSubmitter, render
from api.deps import DbDep, SettingsDep
from scheduler import mail as mail_wire
from scheduler.errors import DomainError, Gone, InvalidRequest, NotFound
from scheduler.services.tenancy import claims, keys, mail

router = APIRouter(include_in_schema=False, route_class=DashboardRoute)

Token = Annotated[str, Path(min_length=1, max_length=120)]
MailName = Annotated[str, Path(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
MAX_SHOWN = 200_000
THRESHOLDS = re.compile(r"[ ,]*(?:[0-9]{1,3}[ ,]*)*")


def _anonymous(
    request: Request, template: str, context: dict[str, Any], *, status_code: int = 200
) -> Response:
    token, new = sessions.form_token(request)
    response = render(request, template, {**context, "form_token": token}, status_code=status_code)
    if new:
        sessions.set_form_cookie(response, request, token)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


# Claim links -------------------------------------------------------------------------------------------


@router.get("/claim/{token}", response_class=HTMLResponse)
def claim_page(request: Request, token: Token, db: DbDep) -> Response:
    """What the mailed link opens: a button that uses it. A GET uses nothing, so a mail scanner that
    fetches the link does not spend it."""
    try:
        with db.read() as s:
            tenant_name = claims.check(session=s, token=token)
    except (Gone, NotFound) as exc:
        return _anonymous(request, "claim.html", {"gone": exc.detail, "token": None}, status_code=exc.status)
    return _anonymous(request, "claim.html", {"gone": None, "token": token, "tenant": tenant_name})


@router.post("/claim/{token}", response_class=HTMLResponse)
def claim(request: Request, token: Token, db: DbDep, settings: SettingsDep, form: Form) -> Response:
    sessions.check_csrf(request, form.get("form_token"), request.cookies.get(sessions.FORM_COOKIE, ""))
    try:
        with db.write() as s:
            claimed = claims.claim(session=s, secret=settings.secret(), token=token)
            key_id = claimed.key.id
    except (Gone, NotFound) as exc:
        return _anonymous(request, "claim.html", {"gone": exc.detail, "token": None}, status_code=exc.status)
    with db.read() as s:
        principal = keys.principal_by_id(session=s, key_id=key_id)
    store = sessions.store_of(request)
    session_token, csrf = sessions.create(store, principal)
    user = sessions.DashSession(token=session_token, principal=principal, csrf=csrf, store=store)
    response = render(
        request,
        "claim_done.html",
        {"api_key": claimed.api_key, "tenant_name": claimed.tenant_name},
        user=user,
    )
    response.headers["Referrer-Policy"] = "no-referrer"
    sessions.set_session_cookie(response, request, session_token)
    return response


# List-Unsubscribe --------------------------------------------------------------------------------------


CATEGORY_NAMES = {
    "job": "job e-mail",
    "budget": "budget alerts",
    "trial": "trial e-mail",
    "session": "session e-mail",
    "webhook": "webhook e-mail",
}


@router.get("/unsubscribe/{token}", response_class=HTMLResponse)
def unsubscribe_page(request: Request, token: Token, settings: SettingsDep) -> Response:
    _, category = mail.check_unsubscribe(secret=settings.secret(), token=token)
    return _anonymous(
        request,
        "unsubscribe.html",
        {"token": token, "what": CATEGORY_NAMES.get(category, "these e-mails"), "done": False},
    )


@router.post("/unsubscribe/{token}", response_class=HTMLResponse)
def unsubscribe(request: Request, token: Token, db: DbDep, settings: SettingsDep) -> Response:
    """One click (RFC 8058): a mail client POSTs `List-Unsubscribe=One-Click` here without cookies; the
    signed link is its own authority, and all it can do is turn one kind of mail off."""
    sessions.check_origin(request)
    with db.write() as s:
        _, category = mail.unsubscribe(session=s, secret=settings.secret(), token=token)
    return _anonymous(
        request, "unsubscribe.html", {"token": None, "what": CATEGORY_NAMES[category], "done": True}
    )


# A member's settings -----------------------------------------------------------------------------------


def _settings_page(
    request: Request,
    user: sessions.DashSession,
    view: mail.SettingsView,
    error: str | None,
    status: int = 200,
) -> Response:
    return render(
        request,
        "notification_settings.html",
        {
            "settings": view,
            "job_events": mail.JOB_EVENTS,
            "kinds": mail.BUDGET_KINDS,
            "thresholds": ", ".join(str(t) for t in view["budget_thresholds"]),
            "error": error,
        },
        status_code=status,
        user=user,
    )


@router.get("/settings/notifications", response_class=HTMLResponse)
def settings_page(request: Request, db: DbDep, user: TenantReader) -> Response:
    with db.read() as s:
        view = mail.get_settings(session=s, principal=user.principal)
    return _settings_page(request, user, view, None)


@router.post("/settings/notifications", response_class=HTMLResponse)
def change_settings(request: Request, db: DbDep, user: TenantSubmitter, form: Form) -> Response:
    sessions.check_csrf(request, form.get("csrf"), user.csrf)
    raw = form.get("budget_thresholds", "")
    # Whole percentages in ASCII digits, separated by commas or spaces; nothing else is read as a number.
    thresholds = (
        [int(t) for t in raw.replace(",", " ").split(" ") if t]
        if len(raw) <= 200 and THRESHOLDS.fullmatch(raw)
        else None
    )
    changes: dict[str, Any] = {
        "job_events": [e for e in mail.JOB_EVENTS if form.get(f"job:{e}")],
        "budget_kinds": [k for k in mail.BUDGET_KINDS if form.get(f"kind:{k}")],
        "trial_mail": bool(form.get("trial_mail")),
        "session_mail": bool(form.get("session_mail")),
        "webhook_mail": bool(form.get("webhook_mail")),
    }
    try:
        if thresholds is None:
            raise InvalidRequest(
                "Thresholds are whole percentages, e.g. 50, 80, 100.", field="budget_thresholds"
            )
        changes["budget_thresholds"] = thresholds
        with db.write() as s:
            mail.put_settings(session=s, principal=user.principal, changes=changes)
    except DomainError as exc:
        with db.read() as s:
            view = mail.get_settings(session=s, principal=user.principal)
        return _settings_page(request, user, view, exc.detail, exc.status)
    sessions.flash(user, "Notification settings saved.")
    return RedirectResponse("/settings/notifications", status_code=303)


# Kept messages (admins) --------------------------------------------------------------------------------


@router.get("/admin/mail", response_class=HTMLResponse)
def mail_page(request: Request, settings: SettingsDep, user: AdminUser) -> Response:
    kept = mail_wire.list_kept(settings.mail_dir)
    return render(
        request,
        "admin_mail.html",
        {"messages": kept, "smtp": settings.smtp_url is not None, "mail_dir": str(settings.mail_dir)},
        user=user,
    )


@router.get("/admin/mail/{name}", response_class=HTMLResponse)
def mail_message(request: Request, name: MailName, settings: SettingsDep, user: AdminUser) -> Response:
    msg = mail_wire.read_kept(settings.mail_dir, name)
    if msg is None:
        raise NotFound(f"No kept message {name}.")
    text = msg.get_body(preferencelist=("plain",))
    page = msg.get_body(preferencelist=("html",))
    headers = [(k, str(v)) for k, v in msg.items()]
    return render(
        request,
        "admin_mail_message.html",
        {
            "name": name,
            "headers": headers,
            "text": text.get_content()[:MAX_SHOWN] if text is not None else "",
            "html": page.get_content()[:MAX_SHOWN] if page is not None else "",
        },
        user=user,
    )
