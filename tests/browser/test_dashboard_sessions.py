"""The dashboard's session pages over HTTP: start a session with a plain form, see it on its page and in
the list, end it with its button; bad values and forged forms start nothing."""

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
        data={"csrf": csrf, "ipus": "1", "machine": "m2000", "idle_timeout_s": "600", "name": "notebook"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    page = client.get(r.headers["location"])
    assert page.status_code == 200 and "notebook" in page.text and "starting" in page.text
    assert "waiting for IPUs" in page.text and "End the session" in page.text
    sid = r.headers["location"].rsplit("/", 1)[1]
    assert f'href="/sessions/{sid}"' in client.get("/sessions").text

    ended = client.post(f"/sessions/{sid}/end", data={"csrf": csrf}, follow_redirects=False)
    assert ended.status_code == 303
    page = client.get(f"/sessions/{sid}")
    assert "ended" in page.text and "End the session" not in page.text
    with db.read() as s:
        row = s.get(IpuSession, sid)
        assert row.state == "ended" and row.ended_reason == "owner" and row.idle_timeout_s == 600
