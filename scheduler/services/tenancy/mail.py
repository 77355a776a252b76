"""E-mail: members' choices, the mail outbox, and what of each event is mailed to whom.

A message is a row of `mail_messages`, written in a transaction: a trial's decision writes the
applicant's in its own (the claim link, the reason), and the notifier's `fan_out` turns each new event
into one message per member who wants it (their settings, or the job's own `notify`). The notifier then
claims the messages that are due (`claim_due`), sends each (scheduler/mail.py: SMTP, or an `.eml`
file) and records the outcome (`record_sent`, `record_failure`). A message whose sender died is claimed
again once its claim lapses: at least once, never lost. Each row's `key` names its cause, so a replayed
fan-out writes nothing twice.

Every notification carries a List-Unsubscribe link that turns off its category of the member's
settings (`unsubscribe_token`, signed with the cloud's secret, nothing stored).
"""

from __future__ import annotations

import hashlib
import hmac
import html as html_module
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler import mail as mail_wire
from scheduler.clock import CLUSTER, WALL, Clock
from scheduler.db import changed
from scheduler.errors import Forbidden, InvalidRequest, NotFound
from scheduler.models import IpuSession, Job, Member, utcnow
from scheduler.notify_models import Event, MailMessage, NotificationSetting
from scheduler.services.tenancy import deliveries

log = logging.getLogger("ipucloud.mail")

JOB_EVENTS = (
    "job.started",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.preempted",
    "job.runtime_warning",
)
BUDGET_KINDS = ("actual", "forecast")
MAX_THRESHOLDS = 10
CATEGORIES = ("job", "budget", "trial", "session", "webhook")

# A job's `notify.on`, as Slurm's --mail-type: which of its events mail its submitter.
NOTIFY_ON: dict[str, frozenset[str]] = {
    "start": frozenset({"job.started"}),
    "end": frozenset({"job.succeeded", "job.failed", "job.cancelled"}),
    "fail": frozenset({"job.failed"}),
    "requeue": frozenset({"job.preempted"}),
    "time_limit": frozenset({"job.runtime_warning"}),
    "all": frozenset(JOB_EVENTS),
}
MAIL_KEPT = timedelta(days=30)
FAN_OUT_BATCH = 500


class SettingsView(TypedDict):
    member_id: str
    job_events: list[str]
    budget_thresholds: list[int]
    budget_kinds: list[str]
    trial_mail: bool
    session_mail: bool
    webhook_mail: bool


DEFAULTS: dict[str, Any] = {
    "job_events": ["job.failed"],
    "budget_thresholds": [50, 80, 100],
    "budget_kinds": ["actual", "forecast"],
    "trial_mail": True,
    "session_mail": True,
    "webhook_mail": True,
}


def _view(member_id: str, row: NotificationSetting | None) -> SettingsView:
    if row is None:
        return SettingsView(
            member_id=member_id,
            job_events=list(DEFAULTS["job_events"]),
            budget_thresholds=list(DEFAULTS["budget_thresholds"]),
            budget_kinds=list(DEFAULTS["budget_kinds"]),
            trial_mail=True,
            session_mail=True,
            webhook_mail=True,
        )
    return SettingsView(
        member_id=member_id,
        job_events=list(row.job_events),
        budget_thresholds=list(row.budget_thresholds),
        budget_kinds=list(row.budget_kinds),
        trial_mail=row.trial_mail,
        session_mail=row.session_mail,
        webhook_mail=row.webhook_mail,
    )


def _member_of(principal: Any) -> str:
    if principal.tenant_id is None or principal.member_id is None:
        raise Forbidden("Notification settings belong to a member of a tenant; this key has none.")
    return str(principal.member_id)


def get_settings(*, session: Session, principal: Any) -> SettingsView:
    """The calling member's choices (the defaults until they change one)."""
    member_id = _member_of(principal)
    return _view(member_id, session.get(NotificationSetting, member_id))


def put_settings(*, session: Session, principal: Any, changes: dict[str, Any]) -> SettingsView:
    """Replace the calling member's choices; a field left out keeps its value."""
    member_id = _member_of(principal)
    current = _view(member_id, session.get(NotificationSetting, member_id))
    merged: dict[str, Any] = {**current, **{k: v for k, v in changes.items() if v is not None}}
    events = list(dict.fromkeys(merged["job_events"]))
    unknown = [e for e in events if e not in JOB_EVENTS]
    if unknown:
        raise InvalidRequest(f"Unknown job events {unknown}; known: {list(JOB_EVENTS)}.", field="job_events")
    thresholds = sorted(set(int(t) for t in merged["budget_thresholds"]))
    if len(thresholds) > MAX_THRESHOLDS or any(not 1 <= t <= 100 for t in thresholds):
        raise InvalidRequest(
            f"At most {MAX_THRESHOLDS} thresholds, each 1 to 100 (% of the grant).", field="budget_thresholds"
        )
    kinds = [k for k in BUDGET_KINDS if k in set(merged["budget_kinds"])]
    if len(kinds) != len(set(merged["budget_kinds"])):
        raise InvalidRequest(f"budget_kinds must be among {list(BUDGET_KINDS)}.", field="budget_kinds")
    row = session.get(NotificationSetting, member_id, with_for_update=True)
    if row is None:
        row = NotificationSetting(member_id=member_id, tenant_id=principal.tenant_id)
        session.add(row)
    row.job_events = events
    row.budget_thresholds = thresholds
    row.budget_kinds = kinds
    row.trial_mail = bool(merged["trial_mail"])
    row.session_mail = bool(merged["session_mail"])
    row.webhook_mail = bool(merged["webhook_mail"])
    row.updated_at = utcnow()
    session.flush()
    return _view(member_id, row)


def thresholds_of(*, session: Session, tenant_ids: Sequence[str]) -> dict[str, set[int]]:
    """Per tenant, the budget thresholds its members chose (a member with no row has the defaults)."""
    found: dict[str, set[int]] = {t: set() for t in tenant_ids}
    if not tenant_ids:
        return found
    members = session.execute(
        select(Member.id, Member.tenant_id, NotificationSetting.budget_thresholds)
        .outerjoin(NotificationSetting, NotificationSetting.member_id == Member.id)
        .where(Member.tenant_id.in_(list(tenant_ids)))
    ).all()
    for _, tenant_id, chosen in members:
        found[tenant_id].update(DEFAULTS["budget_thresholds"] if chosen is None else chosen)
    return found


# ------------------------------------------------------------------------------------------ unsubscribe


def unsubscribe_token(secret: bytes, member_id: str, category: str) -> str:
    mac = hmac.new(secret, f"unsubscribe:{member_id}:{category}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"{member_id}.{category}.{mac}"


def check_unsubscribe(*, secret: bytes, token: str) -> tuple[str, str]:
    """(member id, category) of a genuine List-Unsubscribe link; a forged or altered one is a 404."""
    parts = token.split(".")
    if len(token) > 120 or len(parts) != 3 or parts[1] not in CATEGORIES:
        raise NotFound("No such unsubscribe link.")
    member_id, category, _ = parts
    if not hmac.compare_digest(unsubscribe_token(secret, member_id, category).encode(), token.encode()):
        raise NotFound("No such unsubscribe link.")
    return member_id, category


def unsubscribe(*, session: Session, secret: bytes, token: str) -> tuple[str, str]:
    """Turn off the category a List-Unsubscribe link names; returns (member id, category). The link is
    its own authority (it was mailed to the member); a forged or altered one is a 404."""
    member_id, category = check_unsubscribe(secret=secret, token=token)
    member = session.get(Member, member_id)
    if member is None or member.tenant_id is None:
        raise NotFound("No such unsubscribe link.")
    row = session.get(NotificationSetting, member_id, with_for_update=True)
    if row is None:
        defaults = _view(member_id, None)
        row = NotificationSetting(
            member_id=member_id,
            tenant_id=member.tenant_id,
            job_events=defaults["job_events"],
            budget_thresholds=defaults["budget_thresholds"],
            budget_kinds=defaults["budget_kinds"],
            trial_mail=True,
            session_mail=True,
            webhook_mail=True,
        )
        session.add(row)
    if category == "job":
        row.job_events = []
    elif category == "budget":
        row.budget_thresholds = []
    elif category == "trial":
        row.trial_mail = False
    elif category == "session":
        row.session_mail = False
    else:
        row.webhook_mail = False
    row.updated_at = utcnow()
    session.flush()
    return member_id, category


# -------------------------------------------------------------------------------------------- the outbox


@dataclass(frozen=True)
class Body:
    """What a message says: a subject, paragraphs, and the one link it is about."""

    subject: str
    paragraphs: list[str]
    link: tuple[str, str] | None = None  # (label, absolute URL)


def render(body: Body, *, footer: list[tuple[str, str]]) -> tuple[str, str]:
    """Plain text and HTML of the same message; every value is escaped in the HTML."""
    esc = html_module.escape
    lines = [*body.paragraphs]
    parts = [f"<p>{esc(p)}</p>" for p in body.paragraphs]
    if body.link is not None:
        label, url = body.link
        lines.append(f"{label}: {url}")
        parts.append(f'<p><a href="{esc(url, quote=True)}">{esc(label)}</a></p>')
    if footer:
        lines.append("--")
        lines.extend(f"{label}: {url}" for label, url in footer)
        links = " &middot; ".join(
            f'<a href="{esc(url, quote=True)}">{esc(label)}</a>' for label, url in footer
        )
        parts.append(f'<hr><p style="color:#666;font-size:smaller">{links}</p>')
    text = "\n\n".join(lines) + "\n"
    page = (
        '<!doctype html><html><body style="font-family:sans-serif;max-width:40em">'
        + "".join(parts)
        + "</body></html>\n"
    )
    return text, page


class MailRow(TypedDict):
    """One row of `mail_messages` as inserted."""

    key: str
    kind: str
    tenant_id: str | None
    member_id: str | None
    to_addr: str
    to_name: str
    subject: str
    text: str
    html: str
    unsubscribe: str | None
    sensitive: bool
    status: str
    attempts: int
    next_attempt_at: datetime
    created_at: datetime


def _insert_ignore(session: Session, rows: Sequence[MailRow]) -> None:
    table = MailMessage.__table__
    ins = (
        postgresql.insert(table) if session.get_bind().dialect.name == "postgresql" else sqlite.insert(table)
    )
    session.execute(ins.on_conflict_do_nothing(index_elements=["key"]), [dict(r) for r in rows])


def message_row(
    *,
    key: str,
    kind: str,
    to_addr: str,
    to_name: str,
    body: Body,
    link_base: str,
    tenant_id: str | None = None,
    member_id: str | None = None,
    unsubscribe: tuple[str, str] | None = None,  # (category, absolute URL)
    sensitive: bool = False,
    now: datetime | None = None,
) -> MailRow:
    """One outbox row, its headers checked: a name, address or subject with a line break is refused
    (mail_wire.HeaderInjection)."""
    mail_wire.address(to_name, to_addr)
    mail_wire.check_header(body.subject, "subject")
    footer: list[tuple[str, str]] = []
    if member_id is not None and tenant_id is not None:
        footer.append(("Your notification settings", f"{link_base}/settings/notifications"))
    if unsubscribe is not None:
        footer.append(("Unsubscribe from these", unsubscribe[1]))
    text, page = render(body, footer=footer)
    at = now or utcnow()
    return MailRow(
        key=key[:200],
        kind=kind,
        tenant_id=tenant_id,
        member_id=member_id,
        to_addr=to_addr,
        to_name=to_name[:100],
        subject=body.subject[:300],
        text=text,
        html=page,
        unsubscribe=unsubscribe[0] if unsubscribe else None,
        sensitive=sensitive,
        status="pending",
        attempts=0,
        next_attempt_at=at,
        created_at=at,
    )


def enqueue(session: Session, **fields: Any) -> None:
    """Put one message in the outbox, in the caller's transaction (once per key); a header that would
    carry a line break is a 422 naming `name`."""
    try:
        row = message_row(**fields)
    except mail_wire.HeaderInjection as exc:
        raise InvalidRequest(str(exc), field="name")
    _insert_ignore(session, [row])


# --------------------------------------------------------------------------------- events into messages


@dataclass(frozen=True)
class _Recipient:
    member_id: str
    email: str
    name: str
    role: str


def _job_body(ev: Event, link_base: str) -> Body:
    d = ev.data
    name, job_id = str(d.get("name", "")), str(d.get("id", ""))
    link = ("The job", f"{link_base}/jobs/{job_id}")
    kind = ev.type.removeprefix("job.")
    if ev.type == "job.runtime_warning":
        return Body(
            f"Job {name} has run {d.get('percent')}% of its time limit",
            [
                f"Your job {name} ({job_id}) has run {d.get('run_s')} of its "
                f"{d.get('max_runtime_s')} cluster "
                "seconds; it is stopped at the limit (with a checkpoint if it takes them)."
            ],
            link,
        )
    if ev.type == "job.started":
        return Body(
            f"Job {name} started",
            [f"Your job {name} ({job_id}) started running (attempt {d.get('attempt')})."],
            link,
        )
    if ev.type == "job.preempted":
        why = d.get("reason")
        return Body(
            f"Job {name} was preempted",
            [
                f"Your job {name} ({job_id}) was preempted and is queued again."
                + (f" Reason: {why}" if why else "")
            ],
            link,
        )
    reason = d.get("reason")
    return Body(
        f"Job {name} {kind}",
        [f"Your job {name} ({job_id}) {kind}." + (f" Reason: {reason}" if reason else "")],
        link,
    )


def _body(ev: Event, link_base: str) -> Body | None:
    d = ev.data
    if ev.type.startswith("job."):
        return _job_body(ev, link_base)
    if ev.type == "usage.threshold":
        pct, kind = d.get("threshold_percent"), d.get("kind")
        verb = "is used" if kind == "actual" else "will be used at the present pace"
        burn = float(d.get("recent_burn_ipu_hours") or 0)
        pace = (
            f", and {burn:.2f} spent in the last 24 hours, which at that rate until the grant expires makes "
            f"{float(d.get('forecast_ipu_hours', 0)):.2f}"
            if kind == "forecast" and burn > 0 and d.get("expires_at")
            else ""
        )
        return Body(
            f"{pct}% of your IPU-hour grant {verb}",
            [
                f"{pct}% of your grant of {float(d.get('grant_ipu_hours', 0)):.2f} IPU-hours {verb}: "
                f"{float(d.get('used_ipu_hours', 0)):.2f} used, {float(d.get('reserved_ipu_hours', 0)):.2f} "
                f"reserved by queued and running work{pace}.",
                "Work that would pass the grant is refused; ask your administrator for more.",
            ],
            ("Your usage", f"{link_base}/"),
        )
    if ev.type == "trial.expiring":
        within = {"7d": "7 days", "1d": "1 day"}.get(str(d.get("within")), str(d.get("within")))
        return Body(
            f"Your ipucloud trial ends in {within}",
            [
                f"Your trial ends at {d.get('expires_at')} (in {within}). "
                "Jobs still queued then will not start."
            ],
            ("Your usage", f"{link_base}/"),
        )
    if ev.type == "trial.expired":
        return Body(
            "Your ipucloud trial has ended",
            [f"Your trial ended at {d.get('expires_at')}. Contact us to continue."],
            ("Your account", f"{link_base}/"),
        )
    if ev.type == "session.ending_soon":
        return Body(
            # `ends_in_s` counts cluster seconds (what the session is billed in); `ends_at` is a wall instant.
            f"Session {d.get('id')} ends in {float(d.get('ends_in_s', 0)):.0f} s of {CLUSTER}",
            [
                f"Your session {d.get('id')} will be ended at {d.get('ends_at')} ({WALL}; {d.get('reason')})."
                + (" Submit a job to it to keep it." if d.get("reason") == "idle_timeout" else "")
            ],
            ("The session", f"{link_base}/sessions/{d.get('id')}"),
        )
    if ev.type == "session.ended":
        return Body(
            f"Session {d.get('id')} ended",
            [f"Your session {d.get('id')} ended: {d.get('detail') or d.get('reason')}."],
            ("The session", f"{link_base}/sessions/{d.get('id')}"),
        )
    if ev.type == "webhook.disabled":
        return Body(
            f"Webhook {d.get('id')} was disabled",
            [
                f"Your webhook {d.get('id')} was disabled: {d.get('reason')}.",
                "Fix the receiver, enable it again (PATCH enabled=true) and redeliver what it missed.",
            ],
            ("The webhook", f"{link_base}{d.get('url', '')}"),
        )
    return None


def _category(type_: str) -> str | None:
    if type_.startswith("job."):
        return "job"
    return {
        "usage.threshold": "budget",
        "trial.expiring": "trial",
        "trial.expired": "trial",
        "session.ending_soon": "session",
        "session.ended": "session",
        "webhook.disabled": "webhook",
    }.get(type_)


def _wants(s: SettingsView, ev: Event, category: str) -> bool:
    if category == "job":
        return ev.type in s["job_events"]
    if category == "budget":
        return (
            ev.data.get("threshold_percent") in s["budget_thresholds"]
            and ev.data.get("kind") in s["budget_kinds"]
        )
    return bool(s[f"{category}_mail"])  # type: ignore[literal-required]


def fan_out(*, session: Session, secret: bytes, link_base: str, limit: int = FAN_OUT_BATCH) -> int:
    """Turn the oldest events not yet mailed into messages for the members who want them; returns how
    many events were handled. A job's submitter who asked (`notify.on`) gets its events whatever their
    settings; a session's mail goes to whoever started it, a webhook's to the tenant's owners."""
    stmt = select(Event).where(Event.mailed_at.is_(None)).order_by(Event.seq).limit(limit)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    events = list(session.execute(stmt).scalars())
    if not events:
        return 0
    tenants = sorted({e.tenant_id for e in events})
    members: dict[str, list[_Recipient]] = {t: [] for t in tenants}
    by_id: dict[str, _Recipient] = {}
    for mid, tid, email, name, role in session.execute(
        select(Member.id, Member.tenant_id, Member.email, Member.name, Member.role).where(
            Member.tenant_id.in_(tenants)
        )
    ).tuples():
        r = _Recipient(mid, email, name or "", role)
        members[str(tid)].append(r)
        by_id[mid] = r
    chosen = {
        row.member_id: row
        for row in session.execute(
            select(NotificationSetting).where(NotificationSetting.tenant_id.in_(tenants))
        ).scalars()
    }
    settings = {mid: _view(mid, chosen.get(mid)) for mid in by_id}
    job_ids = {str(e.data.get("id")) for e in events if e.type.startswith("job.")}
    jobs = (
        {
            j.id: (j.submitted_by, j.notify)
            for j in session.execute(
                select(Job.id, Job.submitted_by, Job.notify).where(Job.id.in_(sorted(job_ids)))
            )
        }
        if job_ids
        else {}
    )
    session_ids = {str(e.data.get("id")) for e in events if e.type.startswith("session.")}
    starters = (
        {
            row.id: row.submitted_by
            for row in session.execute(
                select(IpuSession.id, Job.submitted_by)
                .join(Job, Job.id == IpuSession.job_id)
                .where(IpuSession.id.in_(sorted(session_ids)))
            )
        }
        if session_ids
        else {}
    )
    rows: list[MailRow] = []
    for ev in events:
        category = _category(ev.type)
        body = _body(ev, link_base) if category else None
        if category is None or body is None:
            continue
        targets: dict[str, bool] = {}  # member id -> whether the mail may be unsubscribed from
        if category == "session":
            starter = starters.get(str(ev.data.get("id")))
            candidates = (
                [by_id[starter]]
                if starter in by_id
                else [m for m in members[ev.tenant_id] if m.role == "owner"]
            )
        elif category == "webhook":
            candidates = [m for m in members[ev.tenant_id] if m.role == "owner"]
        else:
            candidates = members[ev.tenant_id]
        for m in candidates:
            if _wants(settings[m.member_id], ev, category):
                targets[m.member_id] = True
        if category == "job":
            submitter, notify = jobs.get(str(ev.data.get("id")), (None, None))
            if (
                submitter in by_id
                and notify
                and any(ev.type in NOTIFY_ON.get(o, frozenset()) for o in notify)
            ):
                targets[submitter] = False  # asked for by the job itself
        for member_id, optional in targets.items():
            r = by_id[member_id]
            unsubscribe = None
            if optional:
                token = unsubscribe_token(secret, member_id, category)
                unsubscribe = (category, f"{link_base}/unsubscribe/{token}")
            try:
                rows.append(
                    message_row(
                        key=f"event:{ev.id}:{member_id}",
                        kind=ev.type,
                        to_addr=r.email,
                        to_name=r.name,
                        body=body,
                        link_base=link_base,
                        tenant_id=ev.tenant_id,
                        member_id=member_id,
                        unsubscribe=unsubscribe,
                    )
                )
            except mail_wire.HeaderInjection as exc:
                log.warning("not mailing %s to member %s: %s", ev.id, member_id, exc)
    if rows:
        _insert_ignore(session, rows)
    now = utcnow()
    session.execute(update(Event).where(Event.seq.in_([e.seq for e in events])).values(mailed_at=now))
    return len(events)


# ------------------------------------------------------------------------------------------- the sender


def claim_due(*, session: Session, now: datetime, lease_s: float, limit: int = 100) -> list[int]:
    """Claim the messages due now (pending, their time come, not claimed or the claim lapsed)."""
    due = and_(
        MailMessage.status == "pending",
        MailMessage.next_attempt_at <= now,
        or_(MailMessage.claimed_until.is_(None), MailMessage.claimed_until < now),
    )
    ids = list(
        session.execute(
            select(MailMessage.id).where(due).order_by(MailMessage.next_attempt_at).limit(limit)
        ).scalars()
    )
    if not ids:
        return []
    return sorted(
        session.execute(
            update(MailMessage)
            .where(MailMessage.id.in_(ids), due)
            .values(claimed_until=now + timedelta(seconds=lease_s))
            .returning(MailMessage.id)
        ).scalars()
    )


def outgoing(*, session: Session, message_id: int) -> tuple[mail_wire.Outgoing, str] | None:
    """A claimed, pending message as the wire needs it, with the name of its `.eml` file."""
    row = session.get(MailMessage, message_id)
    if row is None or row.status != "pending":
        return None
    unsubscribe_url = None
    if row.unsubscribe:
        # The link is in the text's footer; the header says the same.
        for line in row.text.splitlines():
            if line.startswith("Unsubscribe from these: "):
                unsubscribe_url = line.removeprefix("Unsubscribe from these: ")
    out = mail_wire.Outgoing(
        to_addr=row.to_addr,
        to_name=row.to_name,
        subject=row.subject,
        text=row.text,
        html=row.html,
        unsubscribe_url=unsubscribe_url,
        message_key=f"{row.id}.{row.kind}",
    )
    return out, f"{row.created_at:%Y%m%dT%H%M%S}-{row.id:010d}"


def record_sent(*, session: Session, message_id: int, now: datetime) -> bool:
    row = session.get(MailMessage, message_id, with_for_update=True)
    if row is None or row.status != "pending":
        return False
    row.status = "sent"
    row.sent_at = now
    row.attempts += 1
    row.claimed_until = None
    row.last_error = None
    if row.sensitive:
        # A claim link lives in the database only until it is on its way.
        row.text = ""
        row.html = ""
    return True


def record_failure(
    *,
    session: Session,
    message_id: int,
    error: str,
    permanent: bool,
    now: datetime,
    clock: Clock,
    rng: random.Random | None = None,
) -> str | None:
    """A try failed: schedule the next (the webhooks' schedule, about three days), or fail it for good
    on a permanent refusal or once the schedule is spent. Returns the message's status."""
    row = session.get(MailMessage, message_id, with_for_update=True)
    if row is None or row.status != "pending":
        return None
    row.attempts += 1
    row.last_error = error[:500]
    row.claimed_until = None
    delay = None if permanent else deliveries.retry_delay_s(row.attempts, clock, None, rng or random.Random())
    if delay is None:
        row.status = "failed"
    else:
        row.next_attempt_at = now + timedelta(seconds=delay)
    return row.status


def prune(*, session: Session, now: datetime) -> int:
    return changed(
        session,
        delete(MailMessage).where(MailMessage.created_at < now - MAIL_KEPT, MailMessage.status != "pending"),
    )
