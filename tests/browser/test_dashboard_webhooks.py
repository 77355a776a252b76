"""The webhook pages in Debian's Chromium (Playwright), against a cloud in real processes (API, scheduler, a
host agent, the notifier): an owner registers a receiver (pytest-httpserver) from the form and copies the
secret the page shows once, pings it and reads its answer, runs a job whose events reach the receiver
signed with that secret, sees the deliveries on the page, filters them, sends one again, pauses and
enables the webhook; a member of the tenant reads the pages with no form to change anything. Every page
runs under the dashboard's Content Security Policy with no error, and fits a phone's screen.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from ipucloud.sdk import Client
from ipucloud.sdk.webhooks import WebhookVerificationError, verify
from tests.browser.test_dashboard_browser import PHONE, Watch, fits_the_screen, poll, shot, sign_in
from tests.browser.test_dashboard_browser import browser as browser  # the fixture, shared
from tests.support import services
from tests.support.cloud import RunningCloud

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture
def hooked_cloud(env: dict[str, str], db: Any, tmp_path: Path) -> Iterator[RunningCloud]:
    seeded = services.seed(db, pods=2)
    extra = {"IPUCLOUD_WEBHOOK_ALLOW_PRIVATE": "1", "IPUCLOUD_NOTIFIER_POLL_S": "0.1"}
    with RunningCloud.start(env, tmp_path, admin_key=seeded.admin_key, extra_env=extra) as cloud:
        cloud.spawn("notifier", "--concurrency", "4", component="notifier", extra_env=extra)
        yield cloud


def test_an_owner_runs_a_webhook_from_the_dashboard(
    hooked_cloud: RunningCloud, browser: Any, httpserver: HTTPServer
) -> None:
    cloud = hooked_cloud
    url = cloud.url
    tenant_id, key = cloud.create_tenant("hooks-ui")
    with cloud.admin() as admin:
        r = admin.post(
            f"/api/v1/admin/tenants/{tenant_id}/members",
            json={"email": "mia@hooks.example.org", "name": "Mia", "role": "member"},
        )
        assert r.status_code == 201, r.text
        member_id = r.json()["id"]
    with cloud.http(key) as c:
        r = c.post("/api/v1/keys", json={"name": "mia", "member_id": member_id})
        assert r.status_code == 201, r.text
        member_key = r.json()["api_key"]

    received: list[dict[str, Any]] = []
    secret: dict[str, str] = {}
    lock = threading.Lock()

    def receive(request: Request) -> Response:
        try:
            event = verify(secret["value"], request.get_data(), dict(request.headers))
        except (KeyError, WebhookVerificationError):
            return Response("bad signature", status=400)
        with lock:
            received.append(event)
        return Response("thanks from the receiver")

    httpserver.expect_request("/hook", method="POST").respond_with_handler(receive)

    watch = Watch()
    page = watch.attach(browser.new_context(viewport=PHONE)).new_page()
    sign_in(page, url, key)
    page.get_by_role("link", name="Webhooks").click()
    page.wait_for_url(f"{url}/webhooks")
    expect(page.get_by_text("No webhooks yet.")).to_be_visible()
    page.get_by_label("URL").fill(httpserver.url_for("/hook"))
    page.get_by_label("Description").fill("ci")
    page.get_by_label("job.started").check()
    page.get_by_label("job.succeeded").check()
    page.get_by_role("button", name="Register").click()
    expect(page.get_by_role("heading", name="Signing secret, shown once")).to_be_visible()
    secret["value"] = page.get_by_label(re.compile("Secret for")).input_value()
    assert secret["value"].startswith("whsec_")
    assert fits_the_screen(page)
    shot(page, "31-webhook-secret")

    page.get_by_role("link", name="Go to the webhook").click()
    page.wait_for_url(re.compile(r"/webhooks/wh_"))
    hook_url = page.url
    assert secret["value"] not in page.content(), "shown once: never on the webhook's page"
    page.get_by_role("button", name="Send a test ping").click()
    expect(page.get_by_role("heading", name="Test ping: delivered")).to_be_visible()
    expect(page.locator("#test-status")).to_have_text("200")
    expect(page.locator("#test-body")).to_have_text("thanks from the receiver")
    assert re.fullmatch(r"\d+ ms", page.locator("#test-latency").inner_text())
    assert received[0]["type"] == "webhook.ping"
    assert fits_the_screen(page)
    shot(page, "32-webhook-ping")

    # A job that really runs: its start and end reach the receiver, and the page lists both deliveries.
    with Client(url, key) as c:
        job = c.submit_job(model="resnet50", steps=20, ipus=2)
        assert c.wait_job(job.id, timeout=120, poll_s=0.2).state == "succeeded"
    poll(lambda: len(received) >= 3, 60)
    assert sorted(e["type"] for e in received[1:]) == ["job.started", "job.succeeded"]

    def listed() -> bool:
        page.goto(hook_url)
        return page.locator("td.delivery-status", has_text="succeeded").count() == 2

    poll(listed, 30)
    page.get_by_role("link", name="succeeded", exact=True).click()
    expect(page.get_by_role("table")).to_contain_text("job.succeeded")
    page.get_by_role("link", name="pending", exact=True).click()
    expect(page.get_by_text("No deliveries pending yet.")).to_be_visible()
    page.goto(hook_url + "?status=succeeded")
    page.get_by_role("button", name=re.compile(r"Redeliver job\.succeeded")).click()
    expect(page.get_by_role("status")).to_contain_text("queued again")
    poll(lambda: sum(e["type"] == "job.succeeded" for e in received) >= 2, 30)
    assert fits_the_screen(page)
    shot(page, "33-webhook-deliveries")

    page.get_by_role("button", name="Disable").click()
    expect(page.locator("#hook-state")).to_have_text("disabled (disabled by its owner)")
    page.get_by_role("button", name="Enable").click()
    expect(page.locator("#hook-state")).to_have_text("enabled")

    # A member reads the pages; no form to change anything is shown.
    reader = watch.attach(browser.new_context(viewport=PHONE)).new_page()
    sign_in(reader, url, member_key)
    reader.goto(hook_url)
    expect(reader.get_by_role("heading", name="Deliveries")).to_be_visible()
    assert reader.get_by_role("button", name="Send a test ping").count() == 0
    assert reader.get_by_role("button", name=re.compile("Redeliver")).count() == 0
    reader.goto(f"{url}/webhooks")
    assert reader.get_by_role("button", name="Register").count() == 0
    expect(reader.get_by_role("table")).to_contain_text(httpserver.url_for("/hook"))

    time.sleep(0.2)  # a last console message, if any, arrives
    assert not watch.problems, watch.problems
