"""`ipucloud webhooks ...`, `ipucloud events` and the SDK's webhook calls against a cloud in real processes
(API, scheduler, a host agent, the notifier): a job that really runs reaches a real receiver as
`job.started` and `job.succeeded`, signed, verified with the SDK's re-exported verifier."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from ipucloud.sdk import AsyncClient, Client
from ipucloud.sdk.webhooks import WebhookVerificationError, verify
from tests.cli.test_cli_client import Cli
from tests.support import services
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e


@pytest.fixture
def hooked_cloud(env: dict[str, str], db: Any, tmp_path: Path) -> Iterator[RunningCloud]:
    seeded = services.seed(db, pods=2)
    extra = {"IPUCLOUD_WEBHOOK_ALLOW_PRIVATE": "1", "IPUCLOUD_NOTIFIER_POLL_S": "0.1"}
    with RunningCloud.start(env, tmp_path, admin_key=seeded.admin_key, extra_env=extra) as cloud:
        cloud.spawn("notifier", "--concurrency", "4", component="notifier", extra_env=extra)
        yield cloud


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home" / "ipucloud" / "config.json")


def test_a_real_jobs_events_reach_a_receiver_through_cli_and_sdk(
    hooked_cloud: RunningCloud, cli: Cli, httpserver: HTTPServer
) -> None:
    cloud = hooked_cloud
    _, key = cloud.create_tenant("hooked-cli")
    assert cli("login", "--url", cloud.url, "--key", key).exit_code == 0
    received: list[dict[str, Any]] = []
    secret: dict[str, str] = {}
    lock = threading.Lock()

    def receive(request: Request) -> Response:
        try:
            event = verify(secret["value"], request.get_data(), dict(request.headers))
        except WebhookVerificationError:
            return Response("bad signature", status=400)
        with lock:
            received.append(event)
        return Response("ok")

    httpserver.expect_request("/hook", method="POST").respond_with_handler(receive)
    hook = cli.json(
        "webhooks",
        "create",
        httpserver.url_for("/hook"),
        "--event",
        "job.started",
        "--event",
        "job.succeeded",
    )
    secret["value"] = hook["secret"]
    assert hook["events"] == ["job.started", "job.succeeded"]
    tested = cli.json("webhooks", "test", hook["id"])
    assert tested["ok"] and tested["status"] == 200 and tested["body_excerpt"] == "ok"
    assert received[0]["type"] == "webhook.ping"

    with Client(cloud.url, key) as c:
        job = c.submit_job(model="resnet50", steps=20, ipus=2)
        assert c.wait_job(job.id, timeout=120, poll_s=0.2).state == "succeeded"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(received) < 3:
            time.sleep(0.1)
        # Sent side by side, they may arrive in either order: each carries its time.
        assert sorted(e["type"] for e in received[1:]) == ["job.started", "job.succeeded"], cloud.logs()
        assert {e["data"]["id"] for e in received[1:]} == {job.id}
        # Received, and its outcome written a moment later.
        while (
            time.monotonic() < deadline and len(list(c.iter_deliveries(hook["id"], status="succeeded"))) < 2
        ):
            time.sleep(0.1)
        got = list(c.iter_deliveries(hook["id"], status="succeeded"))
        assert sorted(d.event_type for d in got) == ["job.started", "job.succeeded"]
        types = {e.type for e in c.iter_events()}
        assert {"job.started", "job.succeeded"} <= types
        assert c.get_webhook(hook["id"]).enabled

    listed = cli.json("webhooks", "deliveries", hook["id"], "--status", "succeeded")
    assert len(listed) == 2
    events = cli.json("events", "--type", "job.succeeded")
    assert [e["data"]["id"] for e in events] == [job.id]
    assert cli("webhooks", "show", hook["id"]).exit_code == 0
    assert hook["secret"] not in cli("webhooks", "list").stdout

    rotated = cli.json("webhooks", "rotate-secret", hook["id"], "--overlap", "0")
    assert rotated["secret"] != hook["secret"]
    secret["value"] = rotated["secret"]
    assert cli.json("webhooks", "test", hook["id"])["ok"]
    paused = cli.json("webhooks", "update", hook["id"], "--disable")
    assert paused["enabled"] is False

    async def run() -> None:
        async with AsyncClient(cloud.url, key) as a:
            page = await a.list_webhooks()
            assert [h.id for h in page.items] == [hook["id"]]
            again = await a.change_webhook(hook["id"], enabled=True)
            assert again.enabled

    asyncio.run(run())
    assert cli.json("webhooks", "delete", hook["id"])["id"] == hook["id"]
    assert cli("webhooks", "show", hook["id"]).exit_code == 4
    assert cli("webhooks", "create", "ftp://example.org/").exit_code == 2
