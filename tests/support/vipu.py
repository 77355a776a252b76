"""The V-IPU endpoint served for real (uvicorn on a free port, in a thread) and what tests set up on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from sqlalchemy import select

from scheduler.clock import UNSCALED
from scheduler.models import Attempt
from tests.faults.harness import leader_loop
from tests.support import agentkit
from tests.support.cloud import free_port

JOB = {"workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 2000}, "ipus": "auto"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def serve(runtime: Any) -> Iterator[int]:
    """`ipucloud vipu-server`'s app on the test's runtime, listening on 127.0.0.1; yields its port."""
    from api.vipu_server import create_vipu_app

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_vipu_app(runtime=runtime), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the V-IPU endpoint did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def tenant(client: Any, admin_key: str, name: str, plan: str = "internal") -> tuple[str, str]:
    r = client.post(
        "/api/v1/admin/tenants",
        json={"name": name, "plan": plan, "quota_ipu_hours": 10_000},
        headers=bearer(admin_key),
    )
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["api_key"]


def reserve(
    client: Any, admin_key: str, tenant_id: str, name: str, size: int, gcds: int = 1
) -> dict[str, Any]:
    r = client.post(
        "/api/v1/admin/partitions",
        json={"id": name, "size": size, "tenant": tenant_id, "gcds": gcds},
        headers=bearer(admin_key),
    )
    assert r.status_code == 201, r.text
    return r.json()


def running_job_in(
    db: Any, client: Any, key: str, partition: str, name: str = "in-part", ipus: int = 4
) -> Attempt:
    """A job submitted into a reserved partition, placed by a scheduling pass and taken: running."""
    r = client.post(
        "/api/v1/jobs", json={**JOB, "name": name, "ipus": ipus, "partition": partition}, headers=bearer(key)
    )
    assert r.status_code == 202, r.text
    leader_loop(db).schedule_pass()
    with db.read() as s:
        placed = s.execute(select(Attempt).where(Attempt.job_id == r.json()["id"])).scalar_one()
    assert agentkit.take(db, placed.id) is not None
    with db.read() as s:
        attempt = s.get(Attempt, placed.id)
    assert attempt is not None
    return attempt


def vipu_env(port: int, key: str, **extra: str) -> dict[str, str]:
    """What a shell pointed at the endpoint has: the V-IPU CLI's variables, and nothing of the cloud's."""
    return {
        "VIPU_CLI_API_HOST": "127.0.0.1",
        "VIPU_CLI_API_PORT": str(port),
        "VIPU_CLI_API_ACCESS_KEY": key,
        "IPUCLOUD_API_KEY": "",
        "IPUCLOUD_URL": "",
        **extra,
    }


def post(port: int, op: str, key: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/v1/{op}", json=body or {}, headers=bearer(key), timeout=10)


def fill_fleet(
    db: Any, *, tenants: int, partitions_per_tenant: int, size: int = 16, gcds: int = 4, batch: int = 512
) -> dict[str, Any]:
    """A busy fleet through the control plane's own services: `tenants` tenants, each with
    `partitions_per_tenant` reserved partitions of `size` IPUs in `gcds` GCDs, and a job running on
    every GCD (submitted, placed by scheduling passes, taken by one agent). Returns the first tenant's
    key and partitions, and counts."""
    from pydantic import TypeAdapter

    from scheduler.jobspec import JobSpec
    from scheduler.models import AttemptState
    from scheduler.services.batch import jobs
    from scheduler.services.capacity import fleet, partitions
    from scheduler.services.tenancy import tenants as tenant_service
    from scheduler.settings import get_settings

    settings = get_settings()
    allocators = fleet.Allocators()
    first_key = ""
    first_parts: list[str] = []
    requests = []
    spec = TypeAdapter(JobSpec)
    per_gcd = size // gcds
    for t in range(tenants):
        with db.write() as s:
            made = tenant_service.create_tenant(
                session=s,
                secret=settings.secret(),
                name=f"bench-{t:04d}",
                plan="internal",
                quota_ipu_hours=1e9,
            )
            names = [f"t{t:04d}-p{p:04d}" for p in range(partitions_per_tenant)]
            for name in names:
                partitions.create_partition(
                    session=s, name=name, size=size, machine_type="m2000", tenant_id=made.tenant.id,
                    gcds=gcds, allocators=allocators,
                )  # fmt: skip
        if t == 0:
            first_key, first_parts = made.api_key, names
        for name in names:
            for g in range(gcds):
                body = {**JOB, "name": f"{name}-g{g}", "ipus": per_gcd, "partition": name}
                requests.append(jobs.SubmitRequest(made.tenant.id, spec.validate_python(body)))
    for i in range(0, len(requests), batch):
        with db.write() as s:
            outcomes = jobs.submit_jobs(session=s, requests=requests[i : i + batch])
        refused = [o for o in outcomes if not isinstance(o, jobs.Submitted)]
        assert not refused, refused[:3]
    loop = leader_loop(db)
    agent = agentkit.lease(db)
    running = 0
    for _ in range(1000):
        loop.schedule_pass()
        with db.read() as s:
            placed = [
                (a, 0)
                for a in s.execute(select(Attempt.id).where(Attempt.state == AttemptState.PLACED)).scalars()
            ]
        if not placed:
            break
        for i in range(0, len(placed), batch):
            with db.write() as s:
                from scheduler.services.batch import attempts

                taken = attempts.take_many(
                    session=s, agent=agent, deliveries=placed[i : i + batch], lease_s=3600, clock=UNSCALED
                )
            running += len(taken.taken)
    return {
        "key": first_key,
        "partitions": first_parts,
        "running": running,
        "partitions_total": tenants * partitions_per_tenant,
    }
