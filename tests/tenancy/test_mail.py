"""E-mail to a real SMTP server in process (aiosmtpd): a trial approval mails a claim link that shows a
working key once and signs the applicant in, then is gone (410); a rejection mails its reason; events
reach the members who want them, with List-Unsubscribe; a job's own `notify`; budget thresholds a
member chose; `.eml` files and the admin's mail page without a server; no header injection by names;
and `GET/PUT /api/v1/notification-settings`."""

from __future__ import annotations

import re
from email.message import EmailMessage
from typing import Any

import pytest
from sqlalchemy import select

from scheduler import mail as mail_wire
from scheduler.errors import InvalidRequest
from scheduler.models import ApiKey, AttemptState, Job, Member, Tenant, utcnow
from scheduler.notify_models import ClaimLink, Event, MailMessage
from scheduler.services.tenancy import mail, thresholds
from tests.support import services
from tests.support.smtp import Inbox, send_due_mail, smtp_server
from tests.tenancy.conftest import World, assert_problem, auth, finish, start_attempt, submit

SETTINGS = "/api/v1/notification-settings"
APPLICATION = {
    "name": "Grace Hopper",
    "email": "grace@example.org",
    "organisation": "Harvard Computation Lab",
    "category": "university",
    "intended_use": "Compiling COBOL to IPU graphs, for science.",
}
CLAIM = re.compile(r"(https?://[^\s]+/claim/([A-Za-z0-9_-]+))")
FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')
NEW_KEY = re.compile(r'id="new-key" class="mono key" readonly value="(ipuc_[^"]+)"')


def apply(client: Any, **over: Any) -> str:
    r = client.post("/api/v1/trials", json={**APPLICATION, **over})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_approval_mails_a_claim_link_that_shows_a_working_key_once(
    client: Any, seeded: Any, db: Any, inbox: Inbox
) -> None:
    app_id = apply(client)
    r = client.post(f"/api/v1/admin/trials/{app_id}/approve", headers=auth(seeded.admin_key))
    assert r.status_code == 200, r.text
    tenant_name = r.json()["tenant"]["name"]
    assert r.json()["api_key"] is None, "the admin never sees the applicant's key"
    assert send_due_mail(db) == ["sent"]
    (got,) = inbox.wait_for(1)
    assert got.rcpt_tos == ["grace@example.org"] and got.mail_from == "cloud@example.net"
    msg = got.message
    assert msg["To"] == "Grace Hopper <grace@example.org>" and "approved" in msg["Subject"]
    assert msg.get_content_type() == "multipart/alternative"
    link, token = CLAIM.search(got.text).groups()  # type: ignore[union-attr]
    assert link.startswith("http://testserver/claim/") and f'href="{link}"' in got.html
    # The link lived in the database only until it was sent.
    with db.read() as s:
        row = s.execute(select(MailMessage)).scalar_one()
        assert row.status == "sent" and token not in row.text + row.html

    # Opening the link uses nothing (a mail scanner may fetch it).
    page = client.get(f"/claim/{token}")
    assert page.status_code == 200 and tenant_name in page.text and "ipuc_" not in page.text
    assert client.get(f"/claim/{token}").status_code == 200
    form = FORM_TOKEN.search(page.text).group(1)  # type: ignore[union-attr]
    claimed = client.post(f"/claim/{token}", data={"form_token": form})
    assert claimed.status_code == 200, claimed.text
    assert claimed.headers["cache-control"] == "no-store"
    key = NEW_KEY.search(claimed.text).group(1)  # type: ignore[union-attr]
    # The key works, and the applicant is signed in to the dashboard.
    usage = client.get("/api/v1/usage", headers=auth(key))
    assert usage.status_code == 200 and usage.json()["quota_ipu_hours"] == 500.0
    home = client.get("/")
    assert home.status_code == 200 and "Sign out" in home.text

    # Used: a second use says so and reveals nothing.
    for again in (client.post(f"/claim/{token}", data={"form_token": form}), client.get(f"/claim/{token}")):
        assert again.status_code == 410
        assert "ipuc_" not in again.text and tenant_name not in again.text and "used already" in again.text
    assert client.get("/claim/nosuchtoken").status_code == 404


def _tenant_keys(db: Any, tenant_id: str) -> list[ApiKey]:
    with db.read() as s:
        return list(s.execute(select(ApiKey).where(ApiKey.tenant_id == tenant_id)).scalars())


def test_the_claim_link_mints_the_tenants_first_and_only_key(
    client: Any, seeded: Any, db: Any, inbox: Inbox
) -> None:
    app_id = apply(client)
    r = client.post(f"/api/v1/admin/trials/{app_id}/approve", json={}, headers=auth(seeded.admin_key))
    assert r.status_code == 200, r.text
    decision = r.json()
    tenant_id = decision["tenant"]["id"]
    assert decision["api_key"] is None and "ipuc_" not in r.text
    assert _tenant_keys(db, tenant_id) == [], "no key exists until the applicant claims it"
    send_due_mail(db)
    token = CLAIM.search(inbox.wait_for(1)[0].text).group(2)  # type: ignore[union-attr]
    page = client.get(f"/claim/{token}")
    form = FORM_TOKEN.search(page.text).group(1)  # type: ignore[union-attr]
    claimed = client.post(f"/claim/{token}", data={"form_token": form})
    assert claimed.status_code == 200, claimed.text
    key = NEW_KEY.search(claimed.text).group(1)  # type: ignore[union-attr]
    (only,) = _tenant_keys(db, tenant_id)
    with db.read() as s:
        owner = s.execute(select(Member).where(Member.tenant_id == tenant_id)).scalar_one()
    assert only.lookup in key and only.member_id == owner.id and owner.email == "grace@example.org"
    assert client.get("/api/v1/usage", headers=auth(key)).json()["tenant_id"] == tenant_id


def test_hand_over_key_answers_the_key_and_mails_no_link(
    client: Any, seeded: Any, db: Any, inbox: Inbox
) -> None:
    app_id = apply(client)
    admin = auth(seeded.admin_key)
    r = client.post(f"/api/v1/admin/trials/{app_id}/approve", json={"hand_over_key": True}, headers=admin)
    assert r.status_code == 200, r.text
    decision = r.json()
    tenant_id, key = decision["tenant"]["id"], decision["api_key"]
    assert key.startswith("ipuc_")
    assert client.get("/api/v1/usage", headers=auth(key)).json()["tenant_id"] == tenant_id
    # The applicant is told, with no link: no claim can mint a second key nobody sees.
    assert send_due_mail(db) == ["sent"]
    (got,) = inbox.wait_for(1)
    assert "approved" in got.message["Subject"] and "hand it over" in got.text
    assert CLAIM.search(got.text) is None and "/claim/" not in got.html and key not in got.text
    with db.read() as s:
        assert s.execute(select(ClaimLink)).scalars().all() == []
    assert len(_tenant_keys(db, tenant_id)) == 1
    assert_problem(
        client.post(f"/api/v1/admin/trials/{app_id}/approve", json={"hand_over_key": True}, headers=admin),
        409,
    )
    other = apply(client, email="kay@example.org")
    for loose in ("maybe", "yes", 1):  # strictly true or false: it decides who sees a secret
        assert_problem(
            client.post(
                f"/api/v1/admin/trials/{other}/approve", json={"hand_over_key": loose}, headers=admin
            ),
            422,
        )
    assert client.get(f"/api/v1/admin/trials/{other}", headers=admin).json()["status"] == "pending"


def test_an_expired_claim_link_is_gone(client: Any, seeded: Any, db: Any, inbox: Inbox) -> None:
    app_id = apply(client)
    client.post(f"/api/v1/admin/trials/{app_id}/approve", headers=auth(seeded.admin_key))
    send_due_mail(db)
    token = CLAIM.search(inbox.wait_for(1)[0].text).group(2)  # type: ignore[union-attr]
    with db.write() as s:
        s.execute(select(ClaimLink)).scalar_one().expires_at = utcnow()
    r = client.get(f"/claim/{token}")
    assert r.status_code == 410 and "ipuc_" not in r.text


def test_rejection_mails_the_reason(client: Any, seeded: Any, db: Any, inbox: Inbox) -> None:
    app_id = apply(client)
    reason = "We only take applications from accredited labs this quarter."
    r = client.post(
        f"/api/v1/admin/trials/{app_id}/reject", json={"reason": reason}, headers=auth(seeded.admin_key)
    )
    assert r.status_code == 200, r.text
    assert send_due_mail(db) == ["sent"]
    (got,) = inbox.wait_for(1)
    assert got.rcpt_tos == ["grace@example.org"] and reason in got.text and reason in got.html
    assert "List-Unsubscribe" not in got.message  # asked for, not a subscription


def test_names_cannot_inject_headers(client: Any, seeded: Any, db: Any) -> None:
    for name in ("Eve\r\nBcc: all@example.org", "Eve\nBcc: all@example.org", "Eve\rX: y"):
        r = client.post("/api/v1/trials", json={**APPLICATION, "name": name})
        assert_problem(r, 422)
        with pytest.raises(mail_wire.HeaderInjection):
            mail_wire.address(name, "eve@example.org")
        with db.write() as s, pytest.raises(InvalidRequest):
            mail.enqueue(
                s,
                key="x",
                kind="test",
                to_addr="eve@example.org",
                to_name=name,
                body=mail.Body("hello", ["hi"]),
                link_base="http://x",
            )
    with pytest.raises(mail_wire.HeaderInjection):
        mail_wire.check_header("Job done\r\nBcc: all@example.org", "subject")
    with pytest.raises(mail_wire.HeaderInjection):
        mail_wire.parse_from("cloud <c@example.org>\r\nBcc: x@example.org")


def _failed_job(db: Any, tenant_id: str, **over: Any) -> str:
    job_id = submit(db, tenant_id, **over)
    attempt = start_attempt(db, job_id, f"p-{job_id[-8:]}")
    finish(db, attempt, AttemptState.FAILED, 10.0, reason="out of memory")
    return job_id


def test_events_reach_the_members_who_want_them_with_list_unsubscribe(
    client: Any, world: World, db: Any, inbox: Inbox
) -> None:
    owner, member = "o@alpha.example.org", "m@alpha.example.org"
    # The member wants no job mail; the owner keeps the default (failures).
    r = client.put(SETTINGS, json={"job_events": []}, headers=auth(world.a.member_key))
    assert r.status_code == 200 and r.json()["job_events"] == []
    job_id = _failed_job(db, world.a.id)
    assert send_due_mail(db) == ["sent"]
    (got,) = inbox.wait_for(1)
    assert got.rcpt_tos == [owner] and "failed" in got.message["Subject"] and job_id in got.text
    assert "out of memory" in got.text
    assert got.message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    unsubscribe = got.message["List-Unsubscribe"].strip("<>")
    assert unsubscribe.startswith("http://testserver/unsubscribe/")

    # One click (RFC 8058), no cookie: the owner's job mail is off.
    path = unsubscribe.removeprefix("http://testserver")
    assert client.get(path).status_code == 200
    r = client.post(path, data={"List-Unsubscribe": "One-Click"})
    assert r.status_code == 200 and "no more job e-mail" in r.text
    assert client.get(SETTINGS, headers=auth(world.a.owner_key)).json()["job_events"] == []
    # A forged link is nothing.
    assert client.post(path[:-4] + "0000").status_code == 404
    _failed_job(db, world.a.id)
    assert send_due_mail(db) == []
    # Tenant b heard nothing of tenant a's jobs.
    assert inbox.to("o@beta.example.org") == [] and inbox.to(member) == []


def test_a_job_asks_to_mail_its_submitter(client: Any, world: World, db: Any, inbox: Inbox) -> None:
    for key in (world.a.owner_key, world.a.member_key):
        assert client.put(SETTINGS, json={"job_events": []}, headers=auth(key)).status_code == 200
    spec = {
        "name": "asks",
        "workload": {"model": "resnet50", "batch_size": 64, "steps": 20},
        "ipus": 4,
        "notify": {"on": ["end", "fail"]},
    }
    r = client.post("/api/v1/jobs", json=spec, headers=auth(world.a.member_key))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    attempt = start_attempt(db, job_id, "p-asks")
    finish(db, attempt, AttemptState.FAILED, 10.0, reason="diverged")
    assert send_due_mail(db) == ["sent"]  # one message though `end` and `fail` both match
    (got,) = inbox.wait_for(1)
    assert got.rcpt_tos == ["m@alpha.example.org"] and job_id in got.text
    assert "List-Unsubscribe" not in got.message  # the job asked; settings do not turn it off
    bad = {**spec, "notify": {"on": ["sometimes"]}}
    assert_problem(client.post("/api/v1/jobs", json=bad, headers=auth(world.a.member_key)), 422)


def test_jobs_from_the_dashboard_and_arrays_record_their_submitter(
    client: Any, world: World, db: Any, inbox: Inbox
) -> None:
    """A job submitted from the dashboard records the member signed in, as the API records the key's
    member; so does every element of an array, so that their `notify` mail has someone to go to."""
    token = FORM_TOKEN.search(client.get("/login").text).group(1)  # type: ignore[union-attr]
    client.post("/login", data={"form_token": token, "api_key": world.a.member_key})
    form = client.get("/jobs/new").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
    values = {"model": "resnet50", "task": "train", "batch_size": "64", "steps": "20", "ipus": "4"}
    r = client.post("/jobs/new", data={**values, "action": "submit", "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303, r.text
    dashboard_job = r.headers["location"].rsplit("/", 1)[-1]
    spec = {
        "name": "sweep",
        "workload": {"model": "resnet50", "batch_size": 64, "steps": 20},
        "ipus": 4,
        "array": {"indices": "0-1"},
        "notify": {"on": ["fail"]},
    }
    r = client.post("/api/v1/jobs", json=spec, headers=auth(world.a.member_key))
    assert r.status_code == 202, r.text
    array_id = r.json()["id"]
    with db.read() as s:
        assert s.get(Job, dashboard_job).submitted_by == world.a.member_id
        elements = list(s.execute(select(Job).where(Job.array_id == array_id)).scalars())
    assert len(elements) == 2 and {j.submitted_by for j in elements} == {world.a.member_id}
    # An element that fails mails its submitter, as the array asked.
    for key in (world.a.owner_key, world.a.member_key):
        assert client.put(SETTINGS, json={"job_events": []}, headers=auth(key)).status_code == 200
    attempt = start_attempt(db, elements[0].id, "p-element")
    finish(db, attempt, AttemptState.FAILED, 10.0, reason="diverged")
    assert send_due_mail(db) == ["sent"]
    (got,) = inbox.wait_for(1)
    assert got.rcpt_tos == ["m@alpha.example.org"] and elements[0].id in got.text


def test_budget_thresholds_a_member_chose_fire_once_per_grant(
    client: Any, world: World, db: Any, inbox: Inbox
) -> None:
    r = client.put(
        SETTINGS,
        json={"budget_thresholds": [30], "budget_kinds": ["actual"], "job_events": []},
        headers=auth(world.a.member_key),
    )
    assert r.json()["budget_thresholds"] == [30] and r.json()["budget_kinds"] == ["actual"]
    client.put(SETTINGS, json={"budget_thresholds": []}, headers=auth(world.a.owner_key))
    hour = 3_600_000
    with db.write() as s:
        t = s.get(Tenant, world.a.id)
        t.used_ipu_ms, t.reserved_ipu_ms = int(t.quota_ipu_ms * 0.35), 0
    for _ in range(2):
        with db.write() as s:
            thresholds.sweep(session=s, now=utcnow())
        send_due_mail(db)
    (got,) = inbox.wait_for(1)
    assert got.rcpt_tos == ["m@alpha.example.org"] and "30%" in got.message["Subject"]
    # The admin doubles the grant (17.5% used of it) and more is used: 30% fires again, for the new grant.
    with db.write() as s:
        s.get(Tenant, world.a.id).quota_ipu_ms *= 2
        s.get(Tenant, world.a.id).used_ipu_ms += 1000 * hour // 2
    with db.write() as s:
        thresholds.sweep(session=s, now=utcnow())
    send_due_mail(db)
    assert len(inbox.wait_for(2)) == 2


def test_without_smtp_messages_are_kept_and_shown_to_admins(
    client: Any, world: World, db: Any, runtime: Any
) -> None:
    settings = runtime.settings
    assert settings.smtp_url is None
    _failed_job(db, world.a.id)
    # The owner and the member, each by default told of failed jobs.
    assert send_due_mail(db) == ["sent", "sent"]
    files = sorted(settings.mail_dir.glob("*.eml"))
    assert len(files) == 2 and "o@alpha.example.org" in files[0].read_text()
    assert "m@alpha.example.org" in files[1].read_text()
    name = files[0].name.removesuffix(".eml")

    def signed_in(key: str) -> None:
        client.cookies.clear()
        login = client.get("/login")
        token = FORM_TOKEN.search(login.text).group(1)  # type: ignore[union-attr]
        assert client.post("/login", data={"form_token": token, "api_key": key}).status_code in (200, 303)

    signed_in(world.admin_key)
    listing = client.get("/admin/mail")
    assert listing.status_code == 200 and f"/admin/mail/{name}" in listing.text and "failed" in listing.text
    shown = client.get(f"/admin/mail/{name}")
    assert shown.status_code == 200 and "out of memory" in shown.text
    assert client.get("/admin/mail/..%2Fsecret.key").status_code == 404
    assert client.get("/admin/mail/nosuch").status_code == 404
    signed_in(world.a.owner_key)
    assert client.get("/admin/mail").status_code == 403
    assert client.get(f"/admin/mail/{name}").status_code == 403


def test_a_server_that_is_away_is_tried_again_and_a_refusal_fails_for_good(
    world: World, db: Any, runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with smtp_server() as box:
        port = box.port
    # Nothing listens there now: a temporary failure, tried again later.
    monkeypatch.setenv("IPUCLOUD_SMTP_URL", f"smtp://127.0.0.1:{port}")
    monkeypatch.setenv("IPUCLOUD_SMTP_TIMEOUT_S", "2")
    services.reload_settings(runtime)
    _failed_job(db, world.a.id)
    assert send_due_mail(db) == ["pending", "pending"]
    with db.read() as s:
        rows = list(s.execute(select(MailMessage)).scalars())
        assert all(r.attempts == 1 and r.next_attempt_at > utcnow() and r.last_error for r in rows)
    assert send_due_mail(db) == [], "not due yet"
    with db.write() as s:
        for row in s.execute(select(MailMessage)).scalars():
            row.next_attempt_at = utcnow()
    with smtp_server() as box:
        monkeypatch.setenv("IPUCLOUD_SMTP_URL", f"smtp://127.0.0.1:{box.port}")
        services.reload_settings(runtime)
        assert send_due_mail(db) == ["sent", "sent"]
        assert len(box.wait_for(2)) == 2
        # A 5xx refusal is permanent: no retry.
        box.refuse.add("nobody@example.org")
        with db.write() as s:
            mail.enqueue(
                s,
                key="refused",
                kind="test",
                to_addr="nobody@example.org",
                to_name="",
                body=mail.Body("hello", ["hi"]),
                link_base="http://x",
            )
        assert send_due_mail(db) == ["failed"]
        with db.read() as s:
            row = s.execute(select(MailMessage).where(MailMessage.key == "refused")).scalar_one()
            assert row.attempts == 1 and "nobody@example.org" in (row.last_error or "")


def test_settings_api_defaults_changes_and_refusals(client: Any, world: World) -> None:
    r = client.get(SETTINGS, headers=auth(world.a.member_key))
    assert r.status_code == 200
    assert r.json() == {
        "member_id": world.a.member_id,
        "job_events": ["job.failed"],
        "budget_thresholds": [50, 80, 100],
        "budget_kinds": ["actual", "forecast"],
        "trial_mail": True,
        "session_mail": True,
        "webhook_mail": True,
    }
    r = client.put(
        SETTINGS,
        json={"budget_thresholds": [90, 10, 90], "session_mail": False},
        headers=auth(world.a.member_key),
    )
    assert r.status_code == 200 and r.json()["budget_thresholds"] == [10, 90]
    assert r.json()["session_mail"] is False and r.json()["job_events"] == ["job.failed"]
    # Each member has their own; the owner's and the other tenant's are untouched.
    assert client.get(SETTINGS, headers=auth(world.a.owner_key)).json()["session_mail"] is True
    assert client.get(SETTINGS, headers=auth(world.b.member_key)).json()["budget_thresholds"] == [50, 80, 100]
    for body in (
        {"budget_thresholds": list(range(1, 12))},
        {"budget_thresholds": [0]},
        {"budget_thresholds": [101]},
        {"budget_kinds": ["guess"]},
        {"job_events": ["job.exploded"]},
        {"trial_mail": "yes please"},
        {"unknown": 1},
    ):
        assert_problem(client.put(SETTINGS, json=body, headers=auth(world.a.member_key)), 422)
    # A read-only key reads, never changes; an admin key has no member.
    assert client.get(SETTINGS, headers=auth(world.a.read_key)).status_code == 200
    assert_problem(client.put(SETTINGS, json={}, headers=auth(world.a.read_key)), 403)
    assert_problem(client.get(SETTINGS, headers=auth(world.admin_key)), 403)
    assert_problem(client.get(SETTINGS), 401)


def test_settings_page_in_the_dashboard(client: Any, world: World) -> None:
    login = client.get("/login")
    token = FORM_TOKEN.search(login.text).group(1)  # type: ignore[union-attr]
    client.post("/login", data={"form_token": token, "api_key": world.a.member_key})
    page = client.get("/settings/notifications")
    assert page.status_code == 200 and 'value="50, 80, 100"' in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    r = client.post(
        "/settings/notifications",
        data={"csrf": csrf, "job:job.succeeded": "on", "budget_thresholds": "25 75", "kind:forecast": "on"},
    )
    assert r.status_code in (200, 303)
    got = client.get(SETTINGS, headers=auth(world.a.member_key)).json()
    assert got["job_events"] == ["job.succeeded"] and got["budget_thresholds"] == [25, 75]
    assert got["budget_kinds"] == ["forecast"] and got["trial_mail"] is False
    r = client.post("/settings/notifications", data={"csrf": csrf, "budget_thresholds": "lots"})
    assert r.status_code == 422
    assert client.post("/settings/notifications", data={"budget_thresholds": "5"}).status_code == 403


def test_member_names_with_line_breaks_are_never_mailed(world: World, db: Any) -> None:
    """A name that reached the database another way is still refused when a message is built."""
    with db.write() as s:
        s.execute(
            select(Member).where(Member.id == world.a.member_id)
        ).scalar_one().name = "Mia\r\nBcc: x@y.z"
    _failed_job(db, world.a.id)
    send_due_mail(db)
    with db.read() as s:
        rows = list(s.execute(select(MailMessage)).scalars())
    assert [r.to_addr for r in rows] == ["o@alpha.example.org"]


def test_a_composed_message_has_text_html_and_no_injected_header() -> None:
    out = mail_wire.Outgoing(
        to_addr="a@example.org",
        to_name="Ann",
        subject="Job x failed",
        text="plain",
        html="<p>html</p>",
        unsubscribe_url="http://x/unsubscribe/t",
        message_key="1.job.failed",
    )
    msg = mail_wire.compose(out, sender="ipucloud <c@example.org>")
    assert isinstance(msg, EmailMessage) and msg["List-Unsubscribe"] == "<http://x/unsubscribe/t>"
    assert [p.get_content_type() for p in msg.iter_parts()] == ["text/plain", "text/html"]
    with pytest.raises(mail_wire.HeaderInjection):
        mail_wire.compose(
            mail_wire.Outgoing(**{**out.__dict__, "subject": "x\nBcc: b@example.org"}), sender="c@example.org"
        )


def test_a_session_ending_soon_mail_names_the_clock_of_each_figure() -> None:
    """`ends_in_s` counts cluster seconds and `ends_at` is a wall instant: the mail says so (#33)."""
    ev = Event(
        type="session.ending_soon",
        data={
            "id": "ses_1",
            "reason": "idle_timeout",
            "ends_in_s": 120.0,
            "ends_at": "2026-12-07T13:00:00+00:00",
        },
    )
    body = mail._body(ev, "https://cloud.example")
    assert body is not None
    assert body.subject == "Session ses_1 ends in 120 s of cluster time"
    assert "2026-12-07T13:00:00+00:00 (wall clock; idle_timeout)" in body.paragraphs[0]
