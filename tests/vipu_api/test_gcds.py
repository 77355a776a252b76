"""Reserved partitions and their graph compile domains (GCDs), as V-IPU has them.

A partition with N GCDs runs up to N jobs at once, each on its GCD's IPUs with IPUOF_VIPU_API_GCD_ID
set to it; a job there holds (and is reserved and billed for) its GCD's IPUs, on the partition's machine
type only; a reconfigurable partition is split anew by `reset --gcds` once idle.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import Attempt, JobEvent, MeterEvent, Tenant
from scheduler.services.capacity import machines
from tests.faults.harness import leader_loop
from tests.support import agentkit

JOB = {"workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 2000}, "ipus": "auto"}


def admin(seeded: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {seeded.admin_key}"}


def tenant_key(client: Any, seeded: Any, name: str) -> tuple[str, str]:
    r = client.post(
        "/api/v1/admin/tenants",
        json={"name": name, "plan": "internal", "quota_ipu_hours": 10_000},
        headers=admin(seeded),
    )
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["api_key"]


def reserve(client: Any, seeded: Any, tenant: str, name: str, size: int, gcds: int, **extra: Any) -> dict:
    r = client.post(
        "/api/v1/admin/partitions",
        json={"id": name, "size": size, "tenant": tenant, "gcds": gcds, **extra},
        headers=admin(seeded),
    )
    assert r.status_code == 201, r.text
    return r.json()


def submit(client: Any, key: str, name: str, **over: Any) -> Any:
    return client.post(
        "/api/v1/jobs", json={**JOB, "name": name, **over}, headers={"Authorization": f"Bearer {key}"}
    )


def test_a_partition_of_four_gcds_runs_four_jobs_at_once_each_on_its_own_ipus(
    db: Any, seeded: Any, client: Any
) -> None:
    tenant, key = tenant_key(client, seeded, "gcd")
    part = reserve(client, seeded, tenant, "quad", 16, 4)
    ids = []
    for i in range(5):
        r = submit(client, key, f"in-gcd-{i}", ipus=4, partition="quad")
        assert r.status_code == 202, r.text
        assert r.json()["ipus"] == 4, "a job holds one GCD: 4 of the 16 IPUs"
        ids.append(r.json()["id"])
    loop = leader_loop(db)
    assert loop.schedule_pass() == 4, "one job per graph compile domain"
    with db.read() as s:
        placed = (
            s.execute(select(Attempt).where(Attempt.state == "placed").order_by(Attempt.gcd)).scalars().all()
        )
        fifth = s.execute(select(Attempt).where(Attempt.job_id == ids[4])).scalar_one_or_none()
    assert fifth is None
    assert [(a.gcd, a.size) for a in placed] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    r = client.get(f"/api/v1/jobs/{ids[4]}", headers={"Authorization": f"Bearer {key}"})
    assert r.json()["wait"]["reason"] == "partition-busy"
    agent = agentkit.lease(db)
    taken = [agentkit.take(db, a.id, agent=agent) for a in placed]
    for gcd, t in enumerate(taken):
        assert t is not None and t.gcd == gcd
        assert t.partition_ipus == part["ipus"][4 * gcd : 4 * gcd + 4], "its own GCD's IPUs"
    view = client.get("/api/v1/admin/partitions/quad", headers=admin(seeded)).json()
    assert sorted(view["jobs"]) == sorted(ids[:4]) and view["job"] in ids[:4]
    for a in placed:
        agentkit.bill(db, a.id, 1, 10.0, agent=agent)
    with db.read() as s:
        assert s.get(Tenant, tenant).used_ipu_ms == 4 * 4 * 10_000, "each is billed its GCD's 4 IPUs"
        ticks = s.execute(select(MeterEvent.partition_size).where(MeterEvent.kind == "tick")).scalars().all()
    assert set(ticks) == {4}


def test_the_agent_hands_each_job_its_gcd_id(db: Any, seeded: Any, client: Any) -> None:
    from tests.faults.test_agent import FakeClock, make_agent

    tenant, key = tenant_key(client, seeded, "gcd-env")
    reserve(client, seeded, tenant, "pair", 8, 2)
    for i in range(2):
        assert submit(client, key, f"env-{i}", partition="pair").status_code == 202
    assert leader_loop(db).schedule_pass() == 2
    with db.read() as s:
        placed = s.execute(select(Attempt).order_by(Attempt.gcd)).scalars().all()
    clock = FakeClock()
    agent = make_agent(db, clock)
    deliveries = [agent.deliver(a.id, 0) for a in placed]
    agent.step()
    assert [d.outcome for d in deliveries] == ["taken", "taken"]
    clock.now += 2.0
    agent.step()
    with db.read() as s:
        envs = {
            e.job_id: e.data["env"]
            for e in s.execute(
                select(JobEvent).where(JobEvent.message.like("attached to partition%"))
            ).scalars()
        }
    assert {env["IPUOF_VIPU_API_PARTITION_ID"] for env in envs.values()} == {"pair"}
    assert sorted(env["IPUOF_VIPU_API_GCD_ID"] for env in envs.values()) == ["0", "1"]
    # Each attempt's own IPUoF configuration, in its own directory: nothing of another's.
    paths = {env["IPUOF_CONFIG_PATH"] for env in envs.values()}
    assert len(paths) == 2 and all(p.endswith("/ipuof.conf") for p in paths)


def test_a_job_in_a_one_gcd_partition_is_reserved_and_billed_for_all_it_holds(
    db: Any, seeded: Any, client: Any
) -> None:
    tenant, key = tenant_key(client, seeded, "whole")
    reserve(client, seeded, tenant, "sixteen", 16, 1)
    r = submit(client, key, "small-in-big", ipus=4, partition="sixteen")
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["ipus"] == 16, "it holds the whole partition"
    with db.read() as s:
        reserved = s.get(Tenant, tenant).reserved_ipu_ms
    assert reserved == pytest.approx(16 * job["predicted_runtime_s"] * 1000, abs=16)


def test_bad_jobs_for_a_reserved_partition_are_refused(db: Any, seeded: Any, client: Any) -> None:
    tenant, key = tenant_key(client, seeded, "picky")
    reserve(client, seeded, tenant, "quad2", 16, 4, machine_type="m2000")
    too_big = submit(client, key, "too-big", ipus=8, partition="quad2")
    assert too_big.status_code == 409 or too_big.status_code == 422, too_big.text
    assert "graph compile domain" in too_big.json()["detail"]
    wrong_type = submit(client, key, "wrong-type", ipus=4, partition="quad2", machine="bow")
    assert wrong_type.status_code == 422, wrong_type.text
    assert "m2000" in wrong_type.json()["detail"]
    with db.read() as s:
        assert s.get(Tenant, tenant).reserved_ipu_ms == 0


def test_a_reconfigurable_partition_is_split_anew_only_while_idle(db: Any, seeded: Any, client: Any) -> None:
    tenant, key = tenant_key(client, seeded, "resplit")
    reserve(client, seeded, tenant, "fixed", 8, 1)
    reserve(client, seeded, tenant, "flexible", 8, 1, reconfigurable=True)
    r = client.post("/api/v1/admin/partitions/fixed/reset", json={"gcds": 2}, headers=admin(seeded))
    assert r.status_code == 409 and "not reconfigurable" in r.json()["detail"]
    r = client.post("/api/v1/admin/partitions/flexible/reset", json={"gcds": 3}, headers=admin(seeded))
    assert r.status_code == 422, r.text
    r = client.post("/api/v1/admin/partitions/flexible/reset", json={"gcds": 4}, headers=admin(seeded))
    assert r.status_code == 200, r.text
    assert r.json()["partition"]["gcds"] == 4
    assert submit(client, key, "in-flexible", ipus=2, partition="flexible").status_code == 202
    assert leader_loop(db).schedule_pass() == 1
    r = client.post("/api/v1/admin/partitions/flexible/reset", json={"gcds": 2}, headers=admin(seeded))
    assert r.status_code == 409 and "runs" in r.json()["detail"]


@pytest.mark.parametrize("health", ["failed", "draining"])
def test_a_reserved_partition_on_a_machine_that_is_not_up_starts_nothing(
    db: Any, seeded: Any, client: Any, health: str
) -> None:
    tenant, key = tenant_key(client, seeded, f"sick-{health}")
    part = reserve(client, seeded, tenant, "sick", 4, 1)
    machine = part["ipus"][0].rsplit("-", 1)[0]
    with db.write() as s:
        machines.set_health(session=s, machine=machine, health=health, reason="test", max_attempts=3)
    job = submit(client, key, "waits", partition="sick").json()["id"]
    assert leader_loop(db).schedule_pass() == 0
    wait = client.get(f"/api/v1/jobs/{job}", headers={"Authorization": f"Bearer {key}"}).json()["wait"]
    assert wait["reason"] == "partition-unhealthy", wait
