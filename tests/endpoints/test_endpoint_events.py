"""An endpoint's events (`endpoint.ready`, `endpoint.scaled`, `endpoint.failed`) against the scheduler's
own transactions: written by the serve pass and by a change of replicas, one per state change however
often a pass is replayed, none while nothing changes, and delivered to a webhook that asks for them
(not mailed: the mail settings have no place for them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from scheduler.endpointspec import EndpointChange
from scheduler.models import Attempt, AttemptState, Job, JobState
from scheduler.notify_models import Event, MailMessage, Webhook, WebhookDelivery
from scheduler.services import endpoints
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import finalize_job
from scheduler.services.tenancy import deliveries, mail, webhooks
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.endpoints.test_serve_pass import BUSY, CALM, IDLE, Window, at, create, endpoint, run_placed, serve
from tests.faults.harness import leader_loop, make_tenant


def events(db: Any, ep: str, type_: str | None = None) -> list[Event]:
    with db.read() as s:
        stmt = select(Event).where(Event.type.like("endpoint.%")).order_by(Event.seq)
        if type_ is not None:
            stmt = stmt.where(Event.type == type_)
        rows = [e for e in s.execute(stmt).scalars() if e.data.get("id") == ep]
        for row in rows:
            s.expunge(row)
        return rows


def kinds(db: Any, ep: str) -> list[tuple[str, Any]]:
    """Each event's type and what changed: the state it left (ready), the counts (scaled), the reason."""
    out: list[tuple[str, Any]] = []
    for e in events(db, ep):
        if e.type == "endpoint.ready":
            out.append((e.type, e.data["previous_state"]))
        elif e.type == "endpoint.scaled":
            out.append((e.type, (e.data["from"], e.data["to"])))
        else:
            out.append((e.type, None))
    return out


def lose_the_replica(db: Any) -> None:
    with db.write() as s:
        (live,) = s.execute(select(Attempt.id).where(Attempt.state == "running")).scalars()
        attempts.stop_running(
            session=s, attempt_ids=[live], outcome=AttemptState.LOST, reason="agent lapsed", max_attempts=3
        )


def test_ready_is_written_once_each_time_the_endpoint_becomes_ready(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "readier")
    loop = leader_loop(db)
    ep = create(db, tenant)
    serve(db, at(0))
    assert events(db, ep) == []  # provisioning: nothing to say yet
    loop.schedule_pass()
    run_placed(db, ep, started=at(0))
    serve(db, at(105))  # loading
    assert events(db, ep) == []
    serve(db, at(110))
    # The same pass replayed (a leader that lost its commit's answer and ran it again), then later
    # passes while it stays ready: still one.
    serve(db, at(110))
    serve(db, at(150))
    serve(db, at(200))
    (ready,) = events(db, ep)
    assert ready.id == f"endpoint.ready:{ep}:provisioning:{at(110).isoformat()}"
    assert ready.tenant_id == tenant
    assert ready.data == {
        "id": ep,
        "name": "bert",
        "state": "ready",
        "previous_state": "provisioning",
        "url": f"/api/v1/endpoints/{ep}",
    }
    # Lost, degraded, replaced and ready again: a second event, from degraded.
    lose_the_replica(db)
    serve(db, at(201))
    assert endpoint(db, ep).state == "degraded" and len(events(db, ep)) == 1
    loop.schedule_pass()
    run_placed(db, ep, started=at(202), compile_s=0.0)
    serve(db, at(220))
    serve(db, at(230))
    assert kinds(db, ep) == [("endpoint.ready", "provisioning"), ("endpoint.ready", "degraded")]


def test_scaled_is_written_once_per_change_of_the_wanted_replicas(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "scaler")
    loop = leader_loop(db)
    ep = create(
        db,
        tenant,
        replicas={"min": 1, "max": 3},
        autoscaling={"scale_up_delay_s": 10, "scale_down_delay_s": 60},
    )
    loop.schedule_pass()
    run_placed(db, ep, started=at(0))
    serve(db, at(200), {ep: BUSY})  # ready; above target, the delay not yet waited
    serve(db, at(210), {ep: BUSY})  # 1 -> 2
    serve(db, at(210), {ep: BUSY})  # replayed: nothing more
    (up,) = events(db, ep, "endpoint.scaled")
    assert up.id == f"endpoint.scaled:{ep}:1-2:{at(210).isoformat()}"
    assert up.data["from"] == 1 and up.data["to"] == 2 and up.data["state"] == "ready"
    assert "queue delay" in up.data["reason"] and up.data["url"] == f"/api/v1/endpoints/{ep}"
    loop.schedule_pass()
    run_placed(db, ep, started=at(210))
    serve(db, at(400), {ep: CALM})
    serve(db, at(460), {ep: CALM})  # 2 -> 1
    serve(db, at(470), {ep: CALM})
    # A PATCH that leaves the wanted count where it is writes nothing; one that moves it does.
    for replicas in ({"min": 1, "max": 4}, {"min": 3, "max": 4}):
        with db.write() as s:
            endpoints.change_endpoint(
                session=s,
                endpoint_id=ep,
                scope=OneTenant(tenant),
                change=EndpointChange.model_validate({"replicas": replicas}),
            )
    scaled = events(db, ep, "endpoint.scaled")
    assert [(e.data["from"], e.data["to"]) for e in scaled] == [(1, 2), (2, 1), (1, 3)]
    assert "load fits in 1" in scaled[1].data["reason"]
    assert scaled[2].data["reason"] == "replicas set to 3..4"
    assert kinds(db, ep)[0] == ("endpoint.ready", "provisioning")  # and no other ready: it stayed so


def test_scaled_to_zero_and_back_writes_each_step(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "sleeper")
    loop = leader_loop(db)
    ep = create(db, tenant, replicas={"min": 0, "max": 2}, autoscaling={"scale_to_zero_after_s": 60})
    serve(db, at(0), {ep: IDLE})
    assert events(db, ep) == []
    serve(db, at(1), {ep: Window(queued=1)})  # a request waits: 0 -> 1
    loop.schedule_pass()
    run_placed(db, ep, started=at(1), compile_s=0.0, load_s=1.0)
    serve(db, at(5), {ep: Window(requests=1, answered=1)})
    serve(db, at(66), {ep: IDLE})
    serve(db, at(127), {ep: IDLE})  # idle 60 s: 1 -> 0
    assert endpoint(db, ep).state == "scaled-to-zero"
    assert kinds(db, ep) == [
        ("endpoint.scaled", (0, 1)),
        ("endpoint.ready", "provisioning"),
        ("endpoint.scaled", (1, 0)),
    ]
    first, _, last = events(db, ep)
    assert "cold start" in first.data["reason"] and "scaled to zero" in last.data["reason"]


def test_failed_is_written_once_with_its_reason(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "doomed")
    ep = create(db, tenant)
    for n in range(endpoints.FAILURE_LIMIT):
        with db.write() as s:
            job = s.execute(select(Job).where(Job.endpoint_id == ep, Job.state == "queued")).scalar_one()
            finalize_job(session=s, job=job, state=JobState.FAILED, reason="does not fit on the partition")
        serve(db, at(n + 1))
    serve(db, at(10))
    (failed,) = events(db, ep)
    assert failed.id == f"endpoint.failed:{ep}:failed" and failed.type == "endpoint.failed"
    assert failed.data["state"] == "failed" and failed.data["url"] == f"/api/v1/endpoints/{ep}"
    assert "3 replicas failed" in failed.data["reason"] and "does not fit" in failed.data["reason"]
    # Its replicas' jobs are the endpoint's machinery: no job.failed for them.
    with db.read() as s:
        assert s.execute(select(Event.type).where(Event.type.like("job.%"))).scalars().all() == []


def test_a_webhook_that_asks_gets_them_and_mail_does_not(db: Any, seeded: Any) -> None:
    tenant = make_tenant(db, "listener")
    with db.write() as s:
        s.add(
            Webhook(
                id="wh_endpoints",
                tenant_id=tenant,
                url="https://192.0.2.1/",
                description="",
                events=["endpoint.ready", "endpoint.failed"],
                enabled=True,
                secret=webhooks.new_secret(),
            )
        )
    loop = leader_loop(db)
    ep = create(db, tenant, replicas={"min": 1, "max": 2})
    loop.schedule_pass()
    run_placed(db, ep, started=at(0))
    serve(db, at(200))
    with db.write() as s:
        endpoints.change_endpoint(
            session=s,
            endpoint_id=ep,
            scope=OneTenant(tenant),
            change=EndpointChange.model_validate({"replicas": {"min": 2, "max": 2}}),
        )
    assert [e.type for e in events(db, ep)] == ["endpoint.ready", "endpoint.scaled"]
    with db.write() as s:
        assert deliveries.fan_out(session=s) == 2  # both events handled; one asked for
        # Handled too, and nothing mailed to the tenant's owner (who gets every mail category by default).
        assert mail.fan_out(session=s, secret=get_settings().secret(), link_base="http://x") == 2
    with db.read() as s:
        (delivery,) = s.execute(select(WebhookDelivery)).scalars()
        assert delivery.event_id == f"endpoint.ready:{ep}:provisioning:{at(200).isoformat()}"
        assert s.execute(select(MailMessage)).scalars().all() == []
