"""Group-committed submissions judge every job exactly as a lone submission would."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from scheduler.errors import DoesNotFit, IdempotencyConflict, InvalidRequest, QuotaExceeded
from scheduler.models import Job, Tenant
from scheduler.services import jobs, tenants
from scheduler.services.jobs import SubmitRequest, Submitted
from scheduler.settings import get_settings
from tests.scheduler.test_lifecycle import spec


def make_tenant(db: Any, name: str, hours: float) -> str:
    with db.write() as s:
        return tenants.create_tenant(
            session=s, secret=get_settings().secret(), name=name, plan="standard", quota_ipu_hours=hours
        ).tenant.id


def test_a_batch_mixes_outcomes_and_keeps_every_rule(db: Any, seeded: Any) -> None:
    rich = make_tenant(db, "rich", 1000)
    one = spec()
    with db.write() as s:
        cost = jobs.submit_job(session=s, tenant_id=rich, spec=one).job.reserved_ipu_ms
    # A tenant whose grant covers exactly two such jobs.
    poor = make_tenant(db, "poor", 2 * cost / 3.6e6)
    requests = [
        SubmitRequest(poor, one),
        SubmitRequest(poor, spec(workload={"model": "gpt-17", "steps": 1})),
        SubmitRequest(poor, one, "k"),
        SubmitRequest(poor, one, "k"),  # the same key and body again in the same batch: a replay
        SubmitRequest(poor, spec(name="other"), "k"),  # the same key, another body
        SubmitRequest(poor, one),  # the grant is spent by now
        SubmitRequest(
            rich,
            spec(
                ipus=1,
                workload={
                    "model": "bert-large",
                    "batch_size": 4096,
                    "seq_len": 512,
                    "precision": "fp32",
                    "steps": 1,
                },
            ),
        ),
        SubmitRequest(rich, one),
    ]
    with db.write() as s:
        out = jobs.submit_jobs(session=s, requests=requests)
    kinds = [type(o).__name__ for o in out]
    assert kinds == [
        "Submitted",
        "InvalidRequest",
        "Submitted",
        "Submitted",
        "IdempotencyConflict",
        "QuotaExceeded",
        "DoesNotFit",
        "Submitted",
    ]
    assert isinstance(out[1], InvalidRequest) and isinstance(out[4], IdempotencyConflict)
    assert isinstance(out[5], QuotaExceeded) and isinstance(out[6], DoesNotFit)
    first, again = out[2], out[3]
    assert isinstance(first, Submitted) and isinstance(again, Submitted)
    assert again.replayed and again.job.id == first.job.id
    with db.read() as s:
        p = s.get(Tenant, poor)
        assert p.reserved_ipu_ms == 2 * cost <= p.quota_ipu_ms
        assert s.execute(select(func.count()).select_from(Job).where(Job.tenant_id == poor)).scalar_one() == 2
        assert s.get(Tenant, rich).reserved_ipu_ms == 2 * cost
