"""A live preemption's `job.preempted` says why and for whom, as the job's history does, in the signed
webhook (a real receiver, pytest-httpserver) and in the e-mail (a real SMTP server, aiosmtpd); another
tenant's job id is never shown."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from sqlalchemy import select, update
from standardwebhooks import Webhook as Verifier
from werkzeug import Request, Response

from scheduler.jobspec import JobSpec
from scheduler.loop import SchedulerLoop
from scheduler.models import Attempt, AttemptState, Job, JobEvent, utcnow
from scheduler.services.batch import jobs
from scheduler.services.tenancy import deliveries
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.scheduler.test_lifecycle import FakeCelery
from tests.support import agentkit, services
from tests.support.smtp import Inbox, send_due_mail
from tests.tenancy.conftest import TenantWorld, auth, make_tenant


@pytest.fixture
def inbox(inbox: Inbox, runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Inbox:
    # The webhook receiver runs on this machine, as a demo's does under `ipucloud up`.
    monkeypatch.setenv("IPUCLOUD_WEBHOOK_ALLOW_PRIVATE", "1")
    services.reload_settings(runtime)
    return inbox


def submit(db: Any, tenant: str, ipus: int, **extra: Any) -> str:
    workload = {"model": "resnet50", "task": "train", "batch_size": 1024, "steps": 100}
    spec = JobSpec.model_validate({"name": f"j{ipus}", "workload": workload, "ipus": ipus, **extra})
    with db.write() as s:
        return jobs.submit_job(session=s, tenant_id=tenant, spec=spec).job.id


def quiet(db: Any, *worlds: TenantWorld) -> None:
    """Cancel the job each test tenant is made with: only this test's jobs hold the fleet."""
    with db.write() as s:
        for w in worlds:
            jobs.request_cancel(session=s, job_id=w.job_id, scope=OneTenant(w.id))


@pytest.mark.parametrize("whose", ["own", "another tenant's"])
def test_job_preempted_webhook_and_mail_carry_the_reason_and_never_another_tenants_job(
    client: Any, db: Any, seeded: Any, inbox: Inbox, httpserver: HTTPServer, whose: str
) -> None:
    alpha, beta = make_tenant(db, "alpha"), make_tenant(db, "beta")
    quiet(db, alpha, beta)
    r = client.post(
        "/api/v1/webhooks",
        json={"url": httpserver.url_for("/hook"), "events": ["job.preempted"]},
        headers=auth(alpha.owner_key),
    )
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    got: list[dict[str, Any]] = []

    def receive(request: Request) -> Response:
        got.append(Verifier(secret).verify(request.get_data(), dict(request.headers)))
        return Response("ok", status=200)

    httpserver.expect_request("/hook", method="POST").respond_with_handler(receive)
    r = client.put(
        "/api/v1/notification-settings",
        json={"job_events": ["job.preempted"]},
        headers=auth(alpha.member_key),
    )
    assert r.status_code == 200, r.text

    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    assert loop.lead()
    spot = submit(db, alpha.id, 128, preemptible=True)  # the whole fleet
    assert loop.schedule_pass() == 1
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == spot)).scalar_one()
    agentkit.take(db, attempt.id)
    # Non-preemptible work preempts it: the owner's own, or another tenant's.
    urgent = submit(db, alpha.id if whose == "own" else beta.id, 64)
    assert loop.schedule_pass() == 0  # warned...
    with db.write() as s:  # ...and its agent never ends it: the warning runs out, the pass stops it
        row = s.get(Attempt, attempt.id)
        assert row.preempt_deadline is not None
        s.execute(
            update(Attempt)
            .where(Attempt.id == attempt.id)
            .values(preempt_deadline=row.preempt_deadline - timedelta(hours=1))
        )
    loop.schedule_pass()
    why = (
        f"preempted for your job {urgent}"
        if whose == "own"
        else "preempted for non-preemptible work of another tenant"
    )
    with db.read() as s:
        stopped = s.get(Attempt, attempt.id)
        assert stopped.state == AttemptState.PREEMPTED and s.get(Job, spot).state == "queued"
        history = [
            e.data["reason"]
            for e in s.execute(select(JobEvent).where(JobEvent.job_id == spot)).scalars()
            if (e.data or {}).get("requeued")
        ]
    assert len(history) == 1 and history[0].startswith(why), history

    # The webhook, delivered as the notifier does it (fan out, claim, send), to the real receiver.
    with db.write() as s:
        deliveries.fan_out(session=s)
    with db.write() as s:
        claimed = deliveries.claim_due(session=s, now=utcnow(), lease_s=60)
    assert len(claimed) == 1
    from workers.notifier import deliver  # its Celery app reads the test's settings at import

    assert deliver(claimed[0]) == "succeeded"
    (payload,) = got
    assert payload["type"] == "job.preempted" and payload["data"]["id"] == spot
    assert payload["data"]["reason"] == history[0], "the history's words, whole"
    # The e-mail to the member who asked for it.
    assert send_due_mail(db) == ["sent"]
    (mail,) = inbox.wait_for(1)
    assert mail.rcpt_tos == ["m@alpha.example.org"] and "preempted" in mail.message["Subject"]
    assert f"Reason: {history[0]}" in " ".join(mail.text.split())
    if whose != "own":
        assert urgent not in str(payload) and urgent not in mail.text + mail.html
