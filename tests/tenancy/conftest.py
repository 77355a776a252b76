"""A small world for the tenancy tests: an admin, two tenants (owner and member keys), a job each."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from scheduler.jobspec import JobSpec
from scheduler.models import ApiKey, AttemptState, Job, utcnow
from scheduler.services.batch import attempts, jobs
from scheduler.services.capacity import partitions
from scheduler.services.tenancy import keys, tenants
from scheduler.settings import get_settings
from tests.support import agentkit, services
from tests.support.smtp import Inbox, smtp_server

JOB: dict[str, Any] = {
    "name": "r50",
    "workload": {"model": "resnet50", "batch_size": 64, "steps": 20},
    "ipus": 4,
}


@dataclass
class TenantWorld:
    id: str
    owner_key: str
    owner_key_id: str
    member_id: str
    member_key: str
    member_key_id: str
    read_key: str
    job_id: str


@dataclass
class World:
    admin_key: str
    a: TenantWorld
    b: TenantWorld
    revoked_key: str
    expired_key: str


def make_tenant(db: Any, name: str, *, plan: str = "standard", quota: float = 1000) -> TenantWorld:
    secret = get_settings().secret()
    with db.write() as s:
        created = tenants.create_tenant(
            session=s,
            secret=secret,
            name=name,
            plan=plan,
            quota_ipu_hours=quota,
            owner_email=f"o@{name}.example.org",
        )
        tid = created.tenant.id
        member = tenants.add_member(
            session=s, tenant_id=tid, email=f"m@{name}.example.org", name="Mia", role="member"
        )
        mrow, mkey = keys.create_key(session=s, secret=secret, tenant_id=tid, name="m", member_id=member.id)
        _, rkey = keys.create_key(
            session=s,
            secret=secret,
            tenant_id=tid,
            name="ro",
            scopes=["read"],
            member_id=created.key.member_id,
        )
        job = jobs.submit_job(session=s, tenant_id=tid, spec=JobSpec.model_validate(JOB)).job
        return TenantWorld(
            id=tid,
            owner_key=created.api_key,
            owner_key_id=created.key.id,
            member_id=member.id,
            member_key=mkey,
            member_key_id=mrow.id,
            read_key=rkey,
            job_id=job.id,
        )


@pytest.fixture
def world(db: Any, seeded: Any) -> World:
    a = make_tenant(db, "alpha")
    b = make_tenant(db, "beta")
    secret = get_settings().secret()
    with db.write() as s:
        revoked_row, revoked = keys.create_key(session=s, secret=secret, tenant_id=a.id, name="old")
        keys.revoke_key(session=s, key_id=revoked_row.id, tenant_id=a.id)
        expiring_row, expired = keys.create_key(
            session=s, secret=secret, tenant_id=a.id, name="brief", expires_at=utcnow() + timedelta(hours=1)
        )
        # Expired an hour ago: written directly, since the API refuses to create a key already expired.
        s.get(ApiKey, expiring_row.id).expires_at = utcnow() - timedelta(hours=1)
    return World(admin_key=seeded.admin_key, a=a, b=b, revoked_key=revoked, expired_key=expired)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_problem(r: Any, status: int, slug: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"], body
    assert body["type"].startswith("/problems/"), body
    if slug is not None:
        assert body["type"] == f"/problems/{slug}", body
    return body


def place_attempt(db: Any, job_id: str, partition: str) -> int:
    """Place the job on a partition carved for it, as the scheduler does; returns the attempt id.

    The partition is a reserved one made with the admin verb, so these tests depend on the attempt
    and metering services only, not on the scheduling policy.
    """
    with db.write() as s:
        job = s.get(Job, job_id)
        part = partitions.create_partition(
            session=s, name=partition, size=job.ipus, machine_type=None, tenant_id=job.tenant_id
        )
        return attempts.place(session=s, job=job, partition=part, queue="ipucloud")


def start_attempt(db: Any, job_id: str, partition: str) -> int:
    """Place the job and take it as a host agent does; returns the attempt id."""
    attempt_id = place_attempt(db, job_id, partition)
    assert agentkit.take(db, attempt_id) is not None
    return attempt_id


def bill(db: Any, attempt_id: int, seq: int, cluster_s: float) -> attempts.TickResult:
    """The agent's meter tick number `seq` of the attempt, up to `cluster_s`."""
    return agentkit.bill(db, attempt_id, seq, cluster_s)


def finish(
    db: Any, attempt_id: int, outcome: AttemptState, cluster_s: float, reason: str | None = None
) -> bool:
    return agentkit.finish(db, attempt_id, outcome, cluster_s, reason)


def submit(db: Any, tenant_id: str, **over: Any) -> str:
    with db.write() as s:
        return jobs.submit_job(
            session=s, tenant_id=tenant_id, spec=JobSpec.model_validate({**JOB, **over})
        ).job.id


@pytest.fixture
def inbox(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Inbox]:
    """A real SMTP server (aiosmtpd) the cloud's mail goes to, with the settings pointing at it."""
    with smtp_server() as box:
        monkeypatch.setenv("IPUCLOUD_SMTP_URL", f"smtp://127.0.0.1:{box.port}")
        monkeypatch.setenv("IPUCLOUD_MAIL_FROM", "ipucloud <cloud@example.net>")
        monkeypatch.setenv("IPUCLOUD_PUBLIC_URL", "http://testserver")
        services.reload_settings(runtime)
        yield box
