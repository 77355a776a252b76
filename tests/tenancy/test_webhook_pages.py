"""The dashboard's webhook pages over HTTP: an owner registers a receiver (its secret shown once), changes
it, pings a real receiver (pytest-httpserver) and sees its answer, pauses and enables it, rotates its
secret, filters its deliveries and sends one again, and removes it; a member reads and changes nothing,
another tenant sees nothing, and forged or cross-site forms store nothing."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pytest_httpserver import HTTPServer
from standardwebhooks import Webhook as Verifier
from werkzeug import Request, Response

from scheduler.notify_models import Webhook, WebhookDelivery
from tests.browser.test_dashboard_http import check_page
from tests.support import services
from tests.tenancy.conftest import World, auth

FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
SECRET = re.compile(r'id="secret" class="mono key" readonly value="(whsec_[^"]+)"')
HOOKS = "/api/v1/webhooks"


@pytest.fixture
def private_ok(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver runs on this machine: let webhooks reach loopback, as `ipucloud up` does."""
    monkeypatch.setenv("IPUCLOUD_WEBHOOK_ALLOW_PRIVATE", "1")
    services.reload_settings(runtime)


def signed_in(app_client: TestClient, key: str) -> str:
    """Sign the client in with `key`; returns the session's CSRF token."""
    app_client.cookies.clear()
    token = FORM_TOKEN.search(app_client.get("/login").text).group(1)  # type: ignore[union-attr]
    r = app_client.post("/login", data={"form_token": token, "api_key": key}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return CSRF.search(app_client.get("/webhooks").text).group(1)  # type: ignore[union-attr]


def hooks_of(db: Any, tenant_id: str) -> list[Webhook]:
    with db.read() as s:
        return [h for h in s.query(Webhook).filter(Webhook.tenant_id == tenant_id)]


def test_an_owner_manages_a_webhook_from_the_dashboard(
    client: TestClient, world: World, db: Any, private_ok: None, httpserver: HTTPServer
) -> None:
    csrf = signed_in(client, world.a.owner_key)
    page = client.get("/webhooks")
    check_page(page)
    assert "No webhooks yet." in page.text and "Register a receiver" in page.text
    assert 'href="/webhooks" aria-current="page"' in page.text, "the nav links the page"

    # Forged, cross-site and bad forms store nothing.
    url = httpserver.url_for("/hook")
    form = {"url": url, "description": "ci", "event:job.failed": "on"}
    assert client.post("/webhooks", data=form).status_code == 403
    assert client.post("/webhooks", data={**form, "csrf": "forged"}).status_code == 403
    cross = client.post("/webhooks", data={**form, "csrf": csrf}, headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403 and "another site" in cross.text
    bad = client.post("/webhooks", data={**form, "url": "ftp://example.org/hook", "csrf": csrf})
    assert bad.status_code == 422 and "http" in bad.text and 'value="ci"' in bad.text, "the form keeps it"
    assert hooks_of(db, world.a.id) == []

    # Registered: the secret is on this page and no other.
    made = client.post("/webhooks", data={**form, "csrf": csrf})
    assert made.status_code == 200, made.text
    check_page(made)
    assert "shown once" in made.text and made.headers["cache-control"] == "no-store"
    secret = SECRET.search(made.text).group(1)  # type: ignore[union-attr]
    (hook,) = hooks_of(db, world.a.id)
    assert hook.url == url and hook.events == ["job.failed"] and hook.description == "ci"
    listing = client.get("/webhooks")
    assert url in listing.text and "job.failed" in listing.text and secret not in listing.text
    detail = client.get(f"/webhooks/{hook.id}")
    check_page(detail)
    assert secret not in detail.text and "No deliveries yet." in detail.text

    # Change its URL, description and events.
    changed = client.post(
        f"/webhooks/{hook.id}",
        data={
            "csrf": csrf,
            "url": url + "?v=2",
            "description": "ci 2",
            "event:job.succeeded": "on",
            "event:job.failed": "on",
        },
        follow_redirects=False,
    )
    assert changed.status_code == 303 and changed.headers["location"] == f"/webhooks/{hook.id}"
    got = client.get(f"{HOOKS}/{hook.id}", headers=auth(world.a.owner_key)).json()
    assert got["url"] == url + "?v=2" and got["description"] == "ci 2"
    assert got["events"] == ["job.succeeded", "job.failed"]
    refused = client.post(f"/webhooks/{hook.id}", data={"csrf": csrf, "url": "http://", "description": ""})
    assert refused.status_code == 422 and 'value="http://"' in refused.text
    assert client.get(f"{HOOKS}/{hook.id}", headers=auth(world.a.owner_key)).json()["url"] == url + "?v=2"

    # A signed ping to the receiver; the page shows its status, latency and answer.
    seen: list[Any] = []

    def answer(request: Request) -> Response:
        seen.append(Verifier(secret).verify(request.get_data(), dict(request.headers)))
        return Response("pong from the receiver", status=202)

    httpserver.expect_request("/hook", method="POST").respond_with_handler(answer)
    pinged = client.post(f"/webhooks/{hook.id}/test", data={"csrf": csrf})
    assert pinged.status_code == 200, pinged.text
    check_page(pinged)
    assert "Test ping: delivered" in pinged.text and '<dd id="test-status">202</dd>' in pinged.text
    assert re.search(r'<dd id="test-latency">\d+ ms</dd>', pinged.text)
    assert "pong from the receiver" in pinged.text
    assert len(seen) == 1 and seen[0]["type"] == "webhook.ping", "signed with the secret shown once"
    httpserver.clear()
    httpserver.expect_request("/hook", method="POST").respond_with_data("down", status=503)
    failed = client.post(f"/webhooks/{hook.id}/test", data={"csrf": csrf})
    assert "Test ping: failed" in failed.text and '<dd id="test-status">503</dd>' in failed.text

    # Pause and enable.
    r = client.post(f"/webhooks/{hook.id}/disable", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303
    got = client.get(f"{HOOKS}/{hook.id}", headers=auth(world.a.owner_key)).json()
    assert got["enabled"] is False and got["disabled_reason"] == "disabled by its owner"
    assert "Webhook disabled" in client.get(f"/webhooks/{hook.id}").text
    r = client.post(f"/webhooks/{hook.id}/enable", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get(f"{HOOKS}/{hook.id}", headers=auth(world.a.owner_key)).json()["enabled"] is True

    # Rotate: a new secret, shown once; the old one signs for the hour chosen.
    bad_overlap = client.post(f"/webhooks/{hook.id}/rotate-secret", data={"csrf": csrf, "overlap_s": "lots"})
    assert bad_overlap.status_code == 422 and "overlap_s" in bad_overlap.text
    with db.read() as s:
        assert s.get(Webhook, hook.id).secret == secret, "a refused rotation changes nothing"
    rotated = client.post(f"/webhooks/{hook.id}/rotate-secret", data={"csrf": csrf, "overlap_s": "3600"})
    assert rotated.status_code == 200 and "keeps signing beside it until" in rotated.text
    new_secret = SECRET.search(rotated.text).group(1)  # type: ignore[union-attr]
    assert new_secret != secret
    with db.read() as s:
        row = s.get(Webhook, hook.id)
        assert row.secret == new_secret and row.previous_secret == secret

    # Deliveries: filtered by status; a failed one is sent again with the same webhook-id.
    with db.write() as s:
        for n, status in enumerate(("failed", "succeeded", "failed")):
            s.add(
                WebhookDelivery(
                    webhook_id=hook.id,
                    tenant_id=world.a.id,
                    event_id=f"job.failed:job_x{n}:1",
                    event_type="job.failed",
                    status=status,
                    attempts=10 if status == "failed" else 1,
                    last_status=500 if status == "failed" else 200,
                    response_excerpt="boom" if status == "failed" else "ok",
                )
            )
    every = client.get(f"/webhooks/{hook.id}").text
    assert all(f"job.failed:job_x{n}:1" in every for n in range(3))
    only_failed = client.get(f"/webhooks/{hook.id}?status=failed").text
    assert "job_x0" in only_failed and "job_x2" in only_failed and "job_x1" not in only_failed
    assert client.get(f"/webhooks/{hook.id}?status=lost").status_code == 422
    with db.read() as s:
        first = s.query(WebhookDelivery).filter(WebhookDelivery.event_id == "job.failed:job_x0:1").one()
    r = client.post(
        f"/webhooks/{hook.id}/deliveries/{first.id}/redeliver", data={"csrf": csrf}, follow_redirects=False
    )
    assert r.status_code == 303
    pending = client.get(f"/webhooks/{hook.id}?status=pending")
    assert "job.failed:job_x0:1 queued again" in pending.text and "job_x0" in pending.text
    assert "job_x2" not in pending.text
    r = client.post(f"/webhooks/{hook.id}/deliveries/999999/redeliver", data={"csrf": csrf})
    assert r.status_code == 404

    # Removed, with its deliveries.
    r = client.post(f"/webhooks/{hook.id}/delete", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/webhooks"
    assert hooks_of(db, world.a.id) == []
    assert "No webhooks yet." in client.get("/webhooks").text


def test_members_read_other_tenants_see_nothing(
    client: TestClient, world: World, db: Any, private_ok: None, httpserver: HTTPServer
) -> None:
    url = httpserver.url_for("/hook")
    r = client.post(HOOKS, json={"url": url, "description": "ours"}, headers=auth(world.a.owner_key))
    assert r.status_code == 201, r.text
    hook_id = r.json()["id"]

    # A member of the tenant reads it, with no forms to change it, and every change is refused.
    csrf = signed_in(client, world.a.member_key)
    listing = client.get("/webhooks")
    assert url in listing.text and "Register a receiver" not in listing.text
    page = client.get(f"/webhooks/{hook_id}")
    assert page.status_code == 200 and "ours" in page.text
    assert "Rotate" not in page.text and "Send a test ping" not in page.text
    for path, data in [
        ("/webhooks", {"url": url}),
        (f"/webhooks/{hook_id}", {"url": url, "description": "theirs"}),
        (f"/webhooks/{hook_id}/disable", {}),
        (f"/webhooks/{hook_id}/rotate-secret", {"overlap_s": "0"}),
        (f"/webhooks/{hook_id}/test", {}),
        (f"/webhooks/{hook_id}/delete", {}),
    ]:
        refused = client.post(path, data={**data, "csrf": csrf})
        assert refused.status_code == 403, (path, refused.text)
        assert "owner" in refused.text
    (hook,) = hooks_of(db, world.a.id)
    assert hook.enabled and hook.description == "ours" and hook.previous_secret is None

    # A read-only key reads; it may not change anything.
    csrf = signed_in(client, world.a.read_key)
    assert client.get(f"/webhooks/{hook_id}").status_code == 200
    assert client.post(f"/webhooks/{hook_id}/disable", data={"csrf": csrf}).status_code == 403

    # Another tenant's owner: not found, and nothing listed.
    csrf = signed_in(client, world.b.owner_key)
    assert url not in client.get("/webhooks").text
    assert client.get(f"/webhooks/{hook_id}").status_code == 404
    for path in (f"/webhooks/{hook_id}/disable", f"/webhooks/{hook_id}/test", f"/webhooks/{hook_id}/delete"):
        assert client.post(path, data={"csrf": csrf}).status_code == 404, path
    (hook,) = hooks_of(db, world.a.id)
    assert hook.enabled
