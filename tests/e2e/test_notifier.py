"""Webhook delivery by a real `ipucloud notifier` process (Celery, Redis, the test database) to a real
receiver (pytest-httpserver) that verifies every signature with the `standardwebhooks` package: retries
after 500s with the same webhook-id, 410 disables, redelivery, and no event lost while the notifier
is down and the broker's queue is gone."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pytest_httpserver import HTTPServer
from standardwebhooks import Webhook as Verifier
from werkzeug import Request, Response

from tests.support import services
from tests.support.cloud import Proc
from tests.tenancy.conftest import JOB, TenantWorld, auth, make_tenant

pytestmark = [pytest.mark.e2e]

HOOKS = "/api/v1/webhooks"
NOTIFIER_ENV = {
    "IPUCLOUD_WEBHOOK_ALLOW_PRIVATE": "1",
    # The retry schedule (5 s, 5 min, ...) in cluster seconds, compressed as `ipucloud up` does.
    "IPUCLOUD_TIME_SCALE": "1000",
    "IPUCLOUD_NOTIFIER_POLL_S": "0.1",
    "IPUCLOUD_WEBHOOK_TIMEOUT_S": "2",
    "IPUCLOUD_STARTUP_WAIT_S": "20",
}


@pytest.fixture
def tenant(db: Any, seeded: Any, runtime: Any, monkeypatch: pytest.MonkeyPatch) -> TenantWorld:
    for k, v in NOTIFIER_ENV.items():
        monkeypatch.setenv(k, v)
    services.reload_settings(runtime)
    return make_tenant(db, "hooked")


class Notifier:
    """`ipucloud notifier`, or (`in_worker`) a host agent that delivers too, as `ipucloud up` runs it."""

    def __init__(self, env: dict[str, str], workdir: Path, in_worker: bool = False) -> None:
        self.env = {**os.environ, **env, **NOTIFIER_ENV}
        self.workdir = workdir
        self.proc: Proc | None = None
        self.runs = 0
        self.in_worker = in_worker
        if in_worker:
            self.env["IPUCLOUD_NOTIFIER_CONCURRENCY"] = "4"

    def start(self) -> None:
        self.runs += 1
        argv = [sys.executable, "-m", "ipucloud"]
        if self.in_worker:
            argv += ["worker", "--with-notifier", "--hostname", f"agent-hooks-{self.runs}@%h"]
        else:
            argv += ["notifier", "--concurrency", "4", "--hostname", "notifier@%h"]
        self.proc = Proc("notifier", argv, self.env, self.workdir / f"notifier{self.runs}.log").start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def tail(self) -> str:
        return self.proc.tail(60) if self.proc is not None else ""


@pytest.fixture(params=["notifier", "worker --with-notifier"])
def notifier(
    request: pytest.FixtureRequest, env: dict[str, str], tmp_path: Path, tenant: TenantWorld
) -> Iterator[Notifier]:
    n = Notifier(env, tmp_path, in_worker=request.param != "notifier")
    n.start()
    try:
        yield n
    finally:
        n.stop()


class Receiver:
    """Answers each request with the next status of `script` (the last one repeats), after checking
    its signature; keeps what it received."""

    def __init__(self, server: HTTPServer, path: str, script: list[int]) -> None:
        self.script = script
        self.secret = ""
        self.got: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()
        server.expect_request(path, method="POST").respond_with_handler(self.handle)

    def handle(self, request: Request) -> Response:
        headers = dict(request.headers)
        payload = Verifier(self.secret).verify(request.get_data(), headers)
        with self.lock:
            self.got.append(({k.lower(): v for k, v in headers.items()}, payload))
            status = self.script[min(len(self.got) - 1, len(self.script) - 1)]
        return Response(f"answer {status}", status=status)


def wait_for(what: str, check: Callable[[], Any], notifier: Notifier, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s\n{notifier.tail()}")


def hook_for(
    client: Any, tenant: TenantWorld, receiver: Receiver, url: str, events: list[str]
) -> dict[str, Any]:
    r = client.post(HOOKS, json={"url": url, "events": events}, headers=auth(tenant.owner_key))
    assert r.status_code == 201, r.text
    receiver.secret = r.json()["secret"]
    return dict(r.json())


def deliveries(client: Any, tenant: TenantWorld, hook_id: str, **params: Any) -> list[dict[str, Any]]:
    r = client.get(f"{HOOKS}/{hook_id}/deliveries", params=params, headers=auth(tenant.member_key))
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def cancel(client: Any, tenant: TenantWorld, job_id: str) -> None:
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth(tenant.owner_key)).status_code == 202


def test_retries_after_500s_with_one_webhook_id_then_redelivers(
    client: Any, tenant: TenantWorld, notifier: Notifier, httpserver: HTTPServer
) -> None:
    receiver = Receiver(httpserver, "/hook", [500, 500, 200])
    hook = hook_for(client, tenant, receiver, httpserver.url_for("/hook"), ["job.cancelled"])
    cancel(client, tenant, tenant.job_id)

    done = wait_for(
        "the third try's success",
        lambda: deliveries(client, tenant, hook["id"], status="succeeded"),
        notifier,
    )
    assert done[0]["attempts"] == 3 and done[0]["last_status"] == 200
    assert done[0]["response_excerpt"] == "answer 200"
    assert len(receiver.got) == 3
    ids = {h["webhook-id"] for h, _ in receiver.got}
    assert ids == {done[0]["event_id"]} and done[0]["event_id"] == f"job.cancelled:{tenant.job_id}:0"
    payload = receiver.got[-1][1]
    assert payload["type"] == "job.cancelled" and payload["data"]["id"] == tenant.job_id

    r = client.post(
        f"{HOOKS}/{hook['id']}/deliveries/{done[0]['id']}/redeliver", headers=auth(tenant.owner_key)
    )
    assert r.status_code == 202, r.text
    wait_for("the redelivery", lambda: len(receiver.got) == 4, notifier)
    assert receiver.got[-1][0]["webhook-id"] == done[0]["event_id"]
    assert_member_cannot_redeliver(client, tenant, hook["id"], done[0]["id"])


def assert_member_cannot_redeliver(client: Any, tenant: TenantWorld, hook_id: str, delivery_id: int) -> None:
    r = client.post(f"{HOOKS}/{hook_id}/deliveries/{delivery_id}/redeliver", headers=auth(tenant.member_key))
    assert r.status_code == 403


def test_410_disables_the_webhook_and_says_so(
    client: Any, tenant: TenantWorld, notifier: Notifier, httpserver: HTTPServer
) -> None:
    gone = Receiver(httpserver, "/gone", [410])
    hook = hook_for(client, tenant, gone, httpserver.url_for("/gone"), [])
    cancel(client, tenant, tenant.job_id)
    failed = wait_for("the 410", lambda: deliveries(client, tenant, hook["id"], status="failed"), notifier)
    assert failed[0]["attempts"] == 1 and failed[0]["last_status"] == 410
    after = client.get(f"{HOOKS}/{hook['id']}", headers=auth(tenant.owner_key)).json()
    assert after["enabled"] is False and "410" in after["disabled_reason"]
    events = client.get("/api/v1/events", params={"type": "webhook.disabled"}, headers=auth(tenant.owner_key))
    assert [e["data"]["id"] for e in events.json()["items"]] == [hook["id"]]
    # Disabled, it gets nothing more.
    r = client.post("/api/v1/jobs", json=JOB, headers=auth(tenant.owner_key))
    cancel(client, tenant, r.json()["id"])
    time.sleep(1.0)
    assert len(gone.got) == 1


def test_no_event_lost_while_the_notifier_is_down_and_the_queue_is_gone(
    client: Any, tenant: TenantWorld, notifier: Notifier, httpserver: HTTPServer, redis_url: str
) -> None:
    receiver = Receiver(httpserver, "/hook", [200])
    hook = hook_for(client, tenant, receiver, httpserver.url_for("/hook"), ["job.cancelled"])
    notifier.stop()
    cancel(client, tenant, tenant.job_id)
    second = client.post("/api/v1/jobs", json=JOB, headers=auth(tenant.owner_key)).json()["id"]
    cancel(client, tenant, second)
    # Whatever the broker held is gone (a Redis restart without its data).
    redis.Redis.from_url(redis_url).flushdb()
    notifier.start()
    wait_for(
        "both deliveries",
        lambda: len(deliveries(client, tenant, hook["id"], status="succeeded")) == 2,
        notifier,
    )
    assert {p["data"]["id"] for _, p in receiver.got} == {tenant.job_id, second}
    assert deliveries(client, tenant, hook["id"], status="pending") == []


@pytest.mark.parametrize("in_worker", [False, True], ids=["notifier", "worker --with-notifier"])
def test_the_notifier_process_mails_members_over_smtp_and_loses_none_while_down(
    client: Any, tenant: TenantWorld, env: dict[str, str], tmp_path: Path, in_worker: bool
) -> None:
    from tests.support.smtp import smtp_server

    with smtp_server() as inbox:
        mailer = Notifier({**env, "IPUCLOUD_SMTP_URL": f"smtp://127.0.0.1:{inbox.port}"}, tmp_path, in_worker)
        r = client.put(
            "/api/v1/notification-settings",
            json={"job_events": ["job.cancelled"]},
            headers=auth(tenant.member_key),
        )
        assert r.status_code == 200, r.text
        # The notifier is down when the job is cancelled: the event waits in the outbox.
        cancel(client, tenant, tenant.job_id)
        mailer.start()
        try:
            got = wait_for("the member's mail", lambda: inbox.to("m@hooked.example.org"), mailer)
            (message,) = got
            assert tenant.job_id in message.text and "cancelled" in message.message["Subject"]
            assert message.message["List-Unsubscribe"]
        finally:
            mailer.stop()
