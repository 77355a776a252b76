"""Webhooks over the API: who may manage and read them, what URLs are refused, the plan's limit, the
signed test ping to a real receiver (pytest-httpserver), rotation's two signatures, and events."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from standardwebhooks import Webhook as Verifier
from werkzeug import Request, Response

from scheduler.models import Plan
from tests.support import services
from tests.tenancy.conftest import World, assert_problem, auth

HOOKS = "/api/v1/webhooks"


@pytest.fixture
def private_ok(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver runs on this machine: let webhooks reach loopback, as `ipucloud up` does."""
    monkeypatch.setenv("IPUCLOUD_WEBHOOK_ALLOW_PRIVATE", "1")
    services.reload_settings(runtime)


def create(client: Any, key: str, url: str, **fields: Any) -> Any:
    return client.post(HOOKS, json={"url": url, **fields}, headers=auth(key))


def test_owner_manages_member_reads_other_tenant_sees_nothing(
    client: Any, world: World, private_ok: None, httpserver: HTTPServer
) -> None:
    url = httpserver.url_for("/hook")
    r = create(client, world.a.owner_key, url, events=["job.failed", "job.succeeded"], description="ci")
    assert r.status_code == 201, r.text
    hook = r.json()
    assert hook["secret"].startswith("whsec_") and hook["events"] == ["job.failed", "job.succeeded"]
    assert r.headers["location"] == f"{HOOKS}/{hook['id']}"

    # The secret is shown once: no read gives it back.
    got = client.get(f"{HOOKS}/{hook['id']}", headers=auth(world.a.member_key))
    assert got.status_code == 200 and "secret" not in got.json() and hook["secret"] not in got.text
    listed = client.get(HOOKS, headers=auth(world.a.member_key)).json()
    assert [h["id"] for h in listed["items"]] == [hook["id"]] and hook["secret"] not in json.dumps(listed)

    # Members read, never manage.
    assert_problem(create(client, world.a.member_key, url), 403, "forbidden")
    r = client.patch(f"{HOOKS}/{hook['id']}", json={"enabled": False}, headers=auth(world.a.member_key))
    assert_problem(r, 403, "forbidden")
    assert_problem(client.delete(f"{HOOKS}/{hook['id']}", headers=auth(world.a.member_key)), 403)
    r = client.post(f"{HOOKS}/{hook['id']}/rotate-secret", headers=auth(world.a.member_key))
    assert_problem(r, 403)

    # Another tenant neither sees nor touches it.
    for method, path in [
        ("GET", f"{HOOKS}/{hook['id']}"),
        ("PATCH", f"{HOOKS}/{hook['id']}"),
        ("DELETE", f"{HOOKS}/{hook['id']}"),
        ("POST", f"{HOOKS}/{hook['id']}/test"),
        ("POST", f"{HOOKS}/{hook['id']}/rotate-secret"),
        ("GET", f"{HOOKS}/{hook['id']}/deliveries"),
    ]:
        body = {"description": "x"} if method == "PATCH" else None
        r = client.request(method, path, json=body, headers=auth(world.b.owner_key))
        assert_problem(r, 404, "not-found")
    assert client.get(HOOKS, headers=auth(world.b.owner_key)).json()["items"] == []

    r = client.patch(
        f"{HOOKS}/{hook['id']}", json={"events": [], "description": "all"}, headers=auth(world.a.owner_key)
    )
    assert r.status_code == 200 and r.json()["events"] == [] and r.json()["description"] == "all"
    r = client.patch(f"{HOOKS}/{hook['id']}", json={"enabled": False}, headers=auth(world.a.owner_key))
    assert r.json()["enabled"] is False and r.json()["disabled_reason"] == "disabled by its owner"
    r = client.patch(f"{HOOKS}/{hook['id']}", json={"enabled": True}, headers=auth(world.a.owner_key))
    assert r.json()["enabled"] is True and r.json()["disabled_reason"] is None
    assert client.delete(f"{HOOKS}/{hook['id']}", headers=auth(world.a.owner_key)).status_code == 200
    assert_problem(client.get(f"{HOOKS}/{hook['id']}", headers=auth(world.a.owner_key)), 404)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.org/hook", "http"),
        ("http://", "no host"),
        ("http://127.0.0.1:9/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://192.168.0.7/hook", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://localhost/hook", "loopback"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://0.0.0.0/hook", "private"),
    ],
)
def test_urls_refused_name_the_field(client: Any, world: World, url: str, why: str) -> None:
    body = assert_problem(create(client, world.a.owner_key, url), 422)
    text = json.dumps(body)
    assert "url" in text and why in text.lower(), body


def test_too_long_and_unknown_events_are_422(client: Any, world: World) -> None:
    body = assert_problem(create(client, world.a.owner_key, "https://example.org/" + "a" * 2000), 422)
    assert "url" in json.dumps(body)
    body = assert_problem(
        create(client, world.a.owner_key, "https://example.org/", events=["job.exploded"]), 422
    )
    assert "events" in json.dumps(body)


def test_the_plan_limits_webhooks(client: Any, world: World, db: Any, private_ok: None) -> None:
    with db.write() as s:
        s.get(Plan, "standard").max_webhooks = 2
    for _ in range(2):
        assert create(client, world.a.owner_key, "http://127.0.0.1:9/hook").status_code == 201
    body = assert_problem(create(client, world.a.owner_key, "http://127.0.0.1:9/hook"), 409, "limit-exceeded")
    assert body["limit"] == "max_webhooks"
    # Another tenant on the same plan has its own count.
    assert create(client, world.b.owner_key, "http://127.0.0.1:9/hook").status_code == 201


def test_an_admin_key_has_no_tenant_to_own_a_webhook(client: Any, world: World, private_ok: None) -> None:
    assert_problem(create(client, world.admin_key, "http://127.0.0.1:9/hook"), 403)


def test_private_receivers_refused_by_default_even_if_allowed_at_creation(
    client: Any, world: World, runtime: Any, monkeypatch: pytest.MonkeyPatch, httpserver: HTTPServer
) -> None:
    """The address is checked again at connect time: a webhook made while private addresses were
    allowed reaches nothing once they are not."""
    monkeypatch.setenv("IPUCLOUD_WEBHOOK_ALLOW_PRIVATE", "1")
    services.reload_settings(runtime)
    hook = create(client, world.a.owner_key, httpserver.url_for("/hook")).json()
    monkeypatch.setenv("IPUCLOUD_WEBHOOK_ALLOW_PRIVATE", "0")
    services.reload_settings(runtime)
    r = client.post(f"{HOOKS}/{hook['id']}/test", headers=auth(world.a.owner_key))
    assert r.status_code == 200 and r.json()["ok"] is False and "loopback" in r.json()["error"]
    assert r.json()["status"] is None
    assert len(httpserver.log) == 0


def test_ping_is_signed_and_answers_what_the_receiver_said(
    client: Any, world: World, private_ok: None, httpserver: HTTPServer
) -> None:
    hook = create(client, world.a.owner_key, httpserver.url_for("/hook")).json()
    seen: list[dict[str, Any]] = []

    def receive(request: Request) -> Response:
        seen.append(Verifier(hook["secret"]).verify(request.get_data(), dict(request.headers)))
        return Response("thanks, got it", status=202)

    httpserver.expect_request("/hook", method="POST").respond_with_handler(receive)
    r = client.post(f"{HOOKS}/{hook['id']}/test", headers=auth(world.a.owner_key))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["ok"] is True and answer["status"] == 202 and answer["body_excerpt"] == "thanks, got it"
    assert answer["latency_ms"] >= 0 and answer["webhook_id_header"].startswith("ping_")
    assert seen and seen[0]["type"] == "webhook.ping" and seen[0]["data"]["webhook_id"] == hook["id"]
    assert httpserver.log[0][0].headers["webhook-id"] == answer["webhook_id_header"]


@pytest.mark.parametrize(
    ("status", "location", "error"), [(500, None, "answered 500"), (302, "http://example.org/", "redirect")]
)
def test_ping_to_a_failing_receiver_says_so(
    client: Any,
    world: World,
    private_ok: None,
    httpserver: HTTPServer,
    status: int,
    location: str | None,
    error: str,
) -> None:
    hook = create(client, world.a.owner_key, httpserver.url_for("/hook")).json()
    headers = {"Location": location} if location else {}
    httpserver.expect_request("/hook").respond_with_data("nope" * 1000, status=status, headers=headers)
    answer = client.post(f"{HOOKS}/{hook['id']}/test", headers=auth(world.a.owner_key)).json()
    assert answer["ok"] is False and answer["status"] == status and error in answer["error"]
    assert len(answer["body_excerpt"]) == 500


def test_a_huge_answer_is_cut_off(
    client: Any, world: World, runtime: Any, monkeypatch: pytest.MonkeyPatch, httpserver: HTTPServer
) -> None:
    monkeypatch.setenv("IPUCLOUD_WEBHOOK_ALLOW_PRIVATE", "1")
    monkeypatch.setenv("IPUCLOUD_WEBHOOK_MAX_RESPONSE_BYTES", "4096")
    services.reload_settings(runtime)
    hook = create(client, world.a.owner_key, httpserver.url_for("/hook")).json()
    httpserver.expect_request("/hook").respond_with_data(b"x" * 1_000_000)
    answer = client.post(f"{HOOKS}/{hook['id']}/test", headers=auth(world.a.owner_key)).json()
    assert answer["ok"] is False and "larger than 4096 bytes" in answer["error"]


def test_rotation_sends_both_signatures_during_the_overlap(
    client: Any, world: World, private_ok: None, httpserver: HTTPServer
) -> None:
    hook = create(client, world.a.owner_key, httpserver.url_for("/hook")).json()
    old = hook["secret"]
    r = client.post(
        f"{HOOKS}/{hook['id']}/rotate-secret", json={"overlap_s": 3600}, headers=auth(world.a.owner_key)
    )
    assert r.status_code == 200, r.text
    new = r.json()["secret"]
    assert new != old and new.startswith("whsec_") and r.json()["previous_secret_until"] is not None
    httpserver.expect_request("/hook").respond_with_data("ok")
    assert client.post(f"{HOOKS}/{hook['id']}/test", headers=auth(world.a.owner_key)).json()["ok"]
    request = httpserver.log[-1][0]
    signatures = request.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2
    for secret in (old, new):  # a receiver holding either verifies
        Verifier(secret).verify(request.get_data(), dict(request.headers))

    # Without an overlap the old secret stops at once.
    newest = client.post(
        f"{HOOKS}/{hook['id']}/rotate-secret", json={"overlap_s": 0}, headers=auth(world.a.owner_key)
    ).json()["secret"]
    client.post(f"{HOOKS}/{hook['id']}/test", headers=auth(world.a.owner_key))
    request = httpserver.log[-1][0]
    assert len(request.headers["webhook-signature"].split(" ")) == 1
    Verifier(newest).verify(request.get_data(), dict(request.headers))
    with pytest.raises(Exception, match="signature"):
        Verifier(new).verify(request.get_data(), dict(request.headers))
    assert_problem(
        client.post(
            f"{HOOKS}/{hook['id']}/rotate-secret", json={"overlap_s": 10**9}, headers=auth(world.a.owner_key)
        ),
        422,
    )


def test_events_are_the_tenants_own_and_one_per_state_change(client: Any, world: World) -> None:
    r = client.post(f"/api/v1/jobs/{world.a.job_id}/cancel", headers=auth(world.a.owner_key))
    assert r.status_code == 202, r.text
    # A second cancel changes nothing, and writes no second event.
    client.post(f"/api/v1/jobs/{world.a.job_id}/cancel", headers=auth(world.a.owner_key))
    events = client.get("/api/v1/events", headers=auth(world.a.member_key)).json()["items"]
    cancelled = [e for e in events if e["type"] == "job.cancelled"]
    assert len(cancelled) == 1, events
    assert cancelled[0]["data"]["id"] == world.a.job_id
    assert cancelled[0]["data"]["url"] == f"/api/v1/jobs/{world.a.job_id}"
    assert client.get("/api/v1/events", headers=auth(world.b.owner_key)).json()["items"] == []
    only = client.get(
        "/api/v1/events", params={"type": "job.succeeded"}, headers=auth(world.a.owner_key)
    ).json()
    assert only["items"] == []
    # The admin sees every tenant's.
    everything = client.get("/api/v1/events", headers=auth(world.admin_key)).json()["items"]
    assert {e["id"] for e in everything} >= {e["id"] for e in events}
