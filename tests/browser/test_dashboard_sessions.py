"""The dashboard's session pages over HTTP: start a session with a plain form, see it on its page and in
the list, give it more time, end it with its button; bad values and forged forms change nothing."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from scheduler.models import IpuSession
from tests.browser.test_dashboard_http import csrf_of, make_tenant, sign_in
from tests.support.services import Seeded


def count(db: Any) -> int:
    with db.read() as s:
        return int(s.execute(select(func.count()).select_from(IpuSession)).scalar_one())


def test_start_see_and_end_a_session(client: TestClient, seeded: Seeded, db: Any) -> None:
    _, key = make_tenant(db, "acme", plan="trial")
    assert sign_in(client, key).status_code == 303
    csrf = csrf_of(client, "/sessions")
    assert 'href="/sessions"' in client.get("/").text  # linked from the tenant's nav

    for bad, why in (
        ({"ipus": "3"}, "power of two"),
        ({"ipus": "4", "max_duration_s": "99999"}, "six hours"),
    ):
        r = client.post("/sessions", data={"csrf": csrf, **bad}, follow_redirects=False)
        assert r.status_code in (409, 422) and "form-error" in r.text, r.text
        assert why in r.text or "21600" in r.text
    forged = client.post("/sessions", data={"csrf": "forged", "ipus": "1"}, follow_redirects=False)
    assert forged.status_code == 403
    assert count(db) == 0

    r = client.post(
        "/sessions",
        data={
            "csrf": csrf,
            "ipus": "1",
            "machine": "m2000",
            "idle_timeout_s": "600",
            "max_duration_s": "3600",
            "name": "notebook",
        },
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    page = client.get(r.headers["location"])
    assert page.status_code == 200 and "notebook" in page.text and "starting" in page.text
    assert "waiting for IPUs" in page.text and "End the session" in page.text
    sid = r.headers["location"].rsplit("/", 1)[1]
    assert f'href="/sessions/{sid}"' in client.get("/sessions").text

    assert "More time (cluster seconds)" in page.text
    for add, status, why in (
        ("soon", 422, "whole number"),
        ("-5", 422, "1 or more"),
        ("0", 422, "1 or more"),
        ("20000", 409, "21600"),  # past the trial plan's six hours
    ):
        r = client.post(f"/sessions/{sid}/extend", data={"csrf": csrf, "add_s": add}, follow_redirects=False)
        assert r.status_code == status and "form-error" in r.text and why in r.text, r.text
        assert f'value="{add}"' in r.text  # kept for a retry
    forged = client.post(f"/sessions/{sid}/extend", data={"csrf": "forged", "add_s": "60"})
    assert forged.status_code == 403
    r = client.post(f"/sessions/{sid}/extend", data={"csrf": csrf, "add_s": "1800"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    page = client.get(f"/sessions/{sid}")
    assert "of 5400 s" in page.text and "1800 s longer" in page.text, page.text

    ended = client.post(f"/sessions/{sid}/end", data={"csrf": csrf}, follow_redirects=False)
    assert ended.status_code == 303
    page = client.get(f"/sessions/{sid}")
    assert "ended" in page.text and "End the session" not in page.text
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert row.state == "ended" and row.ended_reason == "owner" and row.idle_timeout_s == 600


def test_the_submit_form_offers_only_the_tenants_live_sessions(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    _, other_key = make_tenant(db, "neighbour", plan="trial")
    theirs = client.post(
        "/api/v1/sessions", json={"ipus": 1}, headers={"Authorization": f"Bearer {other_key}"}
    )
    assert theirs.status_code == 202, theirs.text
    other_sid = theirs.json()["id"]

    _, key = make_tenant(db, "acme", plan="trial")
    assert sign_in(client, key).status_code == 303
    csrf = csrf_of(client, "/sessions")
    r = client.post("/sessions", data={"csrf": csrf, "ipus": "4", "name": "nb"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    sid = r.headers["location"].rsplit("/", 1)[1]

    form = client.get("/jobs/new")
    assert f'<option value="{sid}">nb: 4 IPUs (starting)</option>' in form.text, form.text
    assert other_sid not in form.text
    assert '<option value="cost">' in form.text  # the `prefer` choice for machine `any`

    def send(**fields: str) -> Any:
        data = {"csrf": csrf, "action": "submit", "model": "resnet50", "steps": "10", "ipus": "1", **fields}
        return client.post("/jobs/new", data=data, follow_redirects=False)

    def jobs() -> int:
        return len(client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {key}"}).json()["items"])

    bad = send(prefer="fastest")
    assert bad.status_code == 422 and "Choose finishing first or spending least." in bad.text
    bad = send(session="not-a-session")
    assert bad.status_code == 422 and 'id="session-error"' in bad.text, bad.text
    # Another tenant's session is as missing as one that never was; one still starting runs nothing.
    foreign = send(session=other_sid)
    assert foreign.status_code == 404 and "form-error" in foreign.text and other_sid in foreign.text
    starting = send(session=sid)
    assert starting.status_code == 409 and "form-error" in starting.text, starting.text
    assert f'<option value="{sid}" selected>' in starting.text  # the choice is kept for a retry
    assert jobs() == 0


def test_session_forms_take_ascii_digits_only(client: TestClient, seeded: Seeded, db: Any) -> None:
    """Issue 32 item 1: `²`, `①` or 5,000 digits were a 500 and Arabic-Indic digits started a session;
    every number field of both forms is refused with the form's own error, and nothing is stored."""
    _, key = make_tenant(db, "acme", plan="trial")
    assert sign_in(client, key).status_code == 303
    csrf = csrf_of(client, "/sessions")
    odd = ("\u00b2", "\u2460", "9" * 5000, "\u0664", "\uff14", "4\u0660", "1_0", "+4", " 4 \u00a0")
    for field in ("ipus", "max_duration_s", "idle_timeout_s", "gcds"):
        for raw in odd:
            data = {"csrf": csrf, "ipus": "1", field: raw}
            r = client.post("/sessions", data=data, follow_redirects=False)
            assert r.status_code == 422 and "form-error" in r.text, (field, raw[:8], r.status_code)
    assert count(db) == 0

    r = client.post("/sessions", data={"csrf": csrf, "ipus": "1"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    sid = r.headers["location"].rsplit("/", 1)[1]
    with db.read() as s:
        before = s.get(IpuSession, sid).max_duration_s
    for raw in odd:
        r = client.post(f"/sessions/{sid}/extend", data={"csrf": csrf, "add_s": raw}, follow_redirects=False)
        assert r.status_code == 422 and "whole number" in r.text, (raw[:8], r.status_code)
    with db.read() as s:
        assert s.get(IpuSession, sid).max_duration_s == before
