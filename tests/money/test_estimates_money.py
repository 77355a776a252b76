"""#32 items 9-11: an estimate answers for the type a job's `prefer` would run it on and says so, shows
what the grant is charged beside the raw IPU-hours, and admission reserves what the estimate promised
(with the tenant's compile cache), truing up at the end. On the test database (SQLite, or PostgreSQL
in the services pass)."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler import billing, emulation
from scheduler.jobspec import WorkloadRequest
from scheduler.models import Attempt, AttemptState, Job, MeterEvent, Plan, Tenant
from scheduler.services.batch import executables
from tests.faults.harness import leader_loop
from tests.policy.test_live_pass import new_tenant
from tests.support import agentkit, services

FLEET = "2xm2000,1xbow,1xdss8440"
BERT = {"model": "bert-base", "task": "train", "batch_size": 32, "seq_len": 128, "steps": 200}
FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def mixed(db: Any, env: Any) -> services.Seeded:
    return services.seed(db, fleet_description=FLEET)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def estimate(client: Any, key: str, **body: Any) -> dict[str, Any]:
    r = client.post("/api/v1/estimates", json={"workload": BERT, "ipus": 4, **body}, headers=bearer(key))
    assert r.status_code == 200, r.text
    return r.json()


def test_an_estimate_answers_for_the_type_prefer_would_choose_and_names_it(
    db: Any, mixed: Any, client: Any
) -> None:
    _, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    fastest = estimate(client, key, machine="any")
    cheapest = estimate(client, key, machine="any", prefer="cost")
    options = cheapest["machine_options"]
    assert set(options) == {"m2000", "bow", "c2"}
    # Each answer names its type and what it was chosen for.
    assert (fastest["prefer"], cheapest["prefer"]) == ("time", "cost")
    assert cheapest["machine"] == min(options, key=lambda k: options[k]["charged_ipu_hours"])
    assert fastest["machine"] == min(
        options, key=lambda k: options[k]["expected_wait_s"] + options[k]["total_s"]
    )
    assert fastest["machine"] != cheapest["machine"], "this workload's fastest type is not its cheapest"
    # What the grant is charged is the type's rate x the raw IPU-hours, both given, with the rate.
    for out in (fastest, cheapest):
        assert out["charged_ipu_hours"] == pytest.approx(out["ipu_hours"] * out["rate"], abs=1e-6)
        assert out["rate"] == options[out["machine"]]["rate"]
        assert out["reserve_ipu_hours"] == pytest.approx(out["charged_ipu_hours"], rel=1e-3)


def test_the_dashboard_estimate_honours_prefer_and_shows_the_grant_charged(
    db: Any, mixed: Any, client: Any
) -> None:
    _, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    api = estimate(client, key, machine="any", prefer="cost")
    login = client.get("/login")
    token = FORM_TOKEN.search(login.text).group(1)  # type: ignore[union-attr]
    assert client.post("/login", data={"form_token": token, "api_key": key}).status_code in (200, 303)
    page = client.get("/jobs/new")
    csrf = CSRF.search(page.text).group(1)  # type: ignore[union-attr]
    form = {
        "csrf": csrf,
        "model": "bert-base",
        "task": "train",
        "batch_size": "32",
        "seq_len": "128",
        "steps": "200",
        "ipus": "4",
        "machine": "any",
        "prefer": "cost",
    }
    shown = client.post("/jobs/estimate", data=form, headers={"X-CSRF-Token": csrf})
    assert shown.status_code == 200, shown.text
    text = re.sub(r"<[^>]+>", " ", shown.text)
    text = re.sub(r"\s+", " ", text)
    assert f"Fits on 4 IPUs of {api['machine']}" in text and "spends least of your grant" in text
    assert f"{api['charged_ipu_hours']:,.4f} IPU-hours" in text  # charged, first
    assert f"({api['ipu_hours']:,.4f} IPU-hours on {api['machine']} at rate {api['rate']:g})" in text


def test_admission_reserves_what_the_estimate_promised_with_the_compile_cache(
    db: Any, mixed: Any, client: Any
) -> None:
    """Compiled before on one type only: the estimate (on `any`) is that type's cost without compile.
    A grant sized for 5.5 of those admits 5, not 1 (admission once reserved the dearest type's
    uncached cost)."""
    tenant_id, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    resolved = emulation.resolve(WorkloadRequest.model_validate(BERT), 4, "bow")
    with db.write() as s:  # as a host agent records it once it compiled there
        cache_key = executables.tenant_key(tenant_id=tenant_id, key=resolved.executable_key)
        executables.record(session=s, key=cache_key, machine_type="bow", compile_s=750.0)
    est = estimate(client, key, machine="any")
    assert est["machine"] == "bow" and est["cached"] is True
    promised = est["charged_ipu_hours"]
    with db.write() as s:
        s.get(Tenant, tenant_id).quota_ipu_ms = billing.ipu_ms_of_hours(5.5 * promised)
    answers = [
        client.post(
            "/api/v1/jobs", json={"name": f"bert-{n}", "workload": BERT, "ipus": 4}, headers=bearer(key)
        )
        for n in range(6)
    ]
    assert [r.status_code for r in answers] == [202] * 5 + [403], [r.text for r in answers]
    assert answers[-1].json()["type"].endswith("quota-exceeded")
    assert est["reserve_ipu_hours"] == pytest.approx(promised, rel=1e-3)  # and the estimate said so
    with db.read() as s:
        reserved = s.execute(select(func.sum(Job.reserved_ipu_ms)).where(Job.tenant_id == tenant_id)).scalar()
        assert billing.ipu_hours(reserved) == pytest.approx(5 * promised, rel=1e-3)
        assert s.get(Tenant, tenant_id).reserved_ipu_ms == reserved


def test_a_job_that_runs_past_its_reservation_is_billed_what_it_ran_and_the_ledger_stays_exact(
    db: Any, mixed: Any, client: Any
) -> None:
    tenant_id, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    r = client.post(
        "/api/v1/jobs",
        json={"name": "bert", "workload": BERT, "ipus": 4, "machine": "any", "prefer": "cost"},
        headers=bearer(key),
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    with db.read() as s:
        reserved = s.get(Job, job_id).reserved_ipu_ms
    leader_loop(db).schedule_pass()
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == job_id)).scalar_one()
    taken = agentkit.take(db, attempt.id)
    assert taken is not None
    # It ran three times as long as predicted (wherever it was placed): billed all of it.
    ran_s = 3 * taken.run.total_s
    agentkit.bill(db, attempt.id, 1, ran_s / 2)
    assert agentkit.finish(db, attempt.id, AttemptState.SUCCEEDED, ran_s)
    with db.read() as s:
        t = s.get(Tenant, tenant_id)
        billed = s.execute(
            select(func.sum(MeterEvent.ipu_ms)).where(MeterEvent.tenant_id == tenant_id)
        ).scalar()
        done = s.get(Attempt, attempt.id)
        assert t.used_ipu_ms == billed == billing.charged_ipu_ms(done.size, ran_s, done.rate)
        assert billed > reserved, "the true-up billed past the reservation"
        assert t.reserved_ipu_ms == 0 and s.get(Job, job_id).reserved_ipu_ms == 0


def test_the_usage_csv_gives_each_job_its_machine_type_rate_and_both_figures(
    db: Any, mixed: Any, client: Any
) -> None:
    _, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    r = client.post(
        "/api/v1/jobs",
        json={"name": "on-bow", "workload": BERT, "ipus": 4, "machine": "bow"},
        headers=bearer(key),
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    leader_loop(db).schedule_pass()
    with db.read() as s:
        attempt = s.execute(select(Attempt).where(Attempt.job_id == job_id)).scalar_one()
    assert agentkit.take(db, attempt.id) is not None
    assert agentkit.finish(db, attempt.id, AttemptState.SUCCEEDED, 3600.0)  # 4 IPU-hours at 1.4
    out = client.get("/api/v1/usage?format=csv", headers=bearer(key))
    assert out.status_code == 200 and out.headers["content-type"].startswith("text/csv")
    (row,) = list(csv.DictReader(io.StringIO(out.text)))
    assert row["job_id"] == job_id and row["machine_type"] == "bow" and float(row["rate"]) == 1.4
    assert float(row["raw_ipu_hours"]) == pytest.approx(4.0)
    assert float(row["charged_ipu_hours"]) == float(row["ipu_hours"]) == pytest.approx(5.6)
    (as_json,) = client.get("/api/v1/usage", headers=bearer(key)).json()["by_job"]
    assert (as_json["machine_type"], as_json["rate"], as_json["raw_ipu_hours"]) == ("bow", 1.4, 4.0)


def test_a_preemptible_estimate_is_at_the_plans_preemptible_rate_as_admission_reserves(
    db: Any, mixed: Any, client: Any
) -> None:
    tenant_id, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    full = estimate(client, key, machine="bow")
    cheap = estimate(client, key, machine="bow", preemptible=True)
    with db.read() as s:
        plan = s.get(Plan, s.get(Tenant, tenant_id).plan_name)
        discount = plan.preemptible_discount if plan.preemptible_discount is not None else 0.5
    assert 0 < discount < 1
    assert cheap["rate"] == pytest.approx(full["rate"] * (1 - discount))
    assert cheap["charged_ipu_hours"] == pytest.approx(full["charged_ipu_hours"] * (1 - discount), rel=1e-4)
    r = client.post(
        "/api/v1/jobs",
        json={"name": "cheap", "workload": BERT, "ipus": 4, "machine": "bow", "preemptible": True},
        headers=bearer(key),
    )
    assert r.status_code == 202, r.text
    with db.read() as s:
        reserved = s.get(Job, r.json()["id"]).reserved_ipu_ms
    assert billing.ipu_hours(reserved) == pytest.approx(cheap["reserve_ipu_hours"], rel=1e-4)
