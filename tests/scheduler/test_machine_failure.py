"""Failing a machine stops the work on it at once: interrupted, requeued, not billed from the failure on.

Before, `admin machines fail` only kept new work off the machine: a 16-IPU job on it kept running and was
billed minutes later.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from scheduler.models import Attempt, IpuAssignment, Job, MeterEvent, Partition, Tenant
from tests.faults.checker import check_cloud
from tests.faults.harness import leader_loop, make_tenant, submit
from tests.support import agentkit


def test_failing_a_machine_interrupts_every_attempt_on_it_and_requeues_them_unbilled(
    db: Any, seeded: Any, client: Any
) -> None:
    tenant = make_tenant(db, "victims", plan="internal")
    loop = leader_loop(db)
    big = submit(db, tenant, name="big", ipus=16, steps=100_000)
    small = submit(db, tenant, name="small", ipus=4, steps=100_000)
    assert loop.schedule_pass() == 2
    with db.read() as s:
        placed = {
            a.job_id: (a, p)
            for a, p in s.execute(
                select(Attempt, Partition).join(Partition, Partition.pk == Attempt.partition_pk)
            ).tuples()
        }
    agent = agentkit.lease(db)
    for attempt, _ in placed.values():
        assert agentkit.take(db, attempt.id, agent=agent) is not None
        agentkit.bill(db, attempt.id, 1, 30.0, agent=agent)
    attempt, partition = placed[big]
    machine = partition.ipu_ids[0].rsplit("-", 1)[0]
    other_ipus = set(placed[small][1].ipu_ids)
    assert not any(ipu.startswith(machine + "-") for ipu in other_ipus), "the test needs them apart"
    with db.read() as s:
        billed_before = s.get(Tenant, tenant).used_ipu_ms
    assert billed_before == (16 + 4) * 30_000

    r = client.post(
        f"/api/v1/admin/machines/{machine}/fail",
        json={"reason": "PSU fault"},
        headers={"Authorization": f"Bearer {seeded.admin_key}"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["health"] == "failed"

    with db.read() as s:
        hit = s.get(Attempt, attempt.id)
        job = s.get(Job, big)
        assert hit.state == "interrupted" and f"machine {machine} failed: PSU fault" in (hit.end_reason or "")
        assert job.state == "queued", "the job goes again"
        assert s.get(Partition, partition.pk).released_at is not None
        assert not s.execute(
            select(IpuAssignment).where(IpuAssignment.partition_pk == partition.pk)
        ).first(), "its IPUs are free (the failed ones are kept off by the machine's health)"
        refund = s.get(MeterEvent, f"att:{attempt.id}:settle")
        assert refund.ipu_ms == -16 * 30_000 and refund.outcome == "interrupted"
        assert s.get(Tenant, tenant).used_ipu_ms == 4 * 30_000, "nothing billed for the failed machine"
        assert s.get(Attempt, placed[small][0].id).state == "running", "work elsewhere carries on"
    # The agent driving it finds it gone at its next write.
    assert agentkit.bill(db, attempt.id, 2, 60.0, agent=agent).gone == {attempt.id}
    # It runs again, not on the failed machine, and an interruption does not count against its retries.
    assert loop.lead() and loop.schedule_pass() == 1
    with db.read() as s:
        again, where = s.execute(
            select(Attempt, Partition)
            .join(Partition, Partition.pk == Attempt.partition_pk)
            .where(Attempt.job_id == big, Attempt.number == 2)
        ).one()
    assert not any(ipu.startswith(machine + "-") for ipu in where.ipu_ids)
    agentkit.take(db, again.id, agent=agent)
    assert agentkit.finish(db, again.id, "succeeded", 50.0, agent=agent)  # type: ignore[arg-type]
    assert agentkit.finish(db, placed[small][0].id, "succeeded", 50.0, agent=agent)  # type: ignore[arg-type]
    outcome = check_cloud(db, [big, small])
    assert outcome.states == {"succeeded": 2}
    assert outcome.attempts == {"interrupted": 1, "succeeded": 2}
    # The fleet view (behind the dashboard's map) marks it failed.
    fleet = client.get("/api/v1/admin/fleet", headers={"Authorization": f"Bearer {seeded.admin_key}"}).json()
    shown = {m["id"]: m for pod in fleet["pods"] for m in pod["machines"]}
    assert shown[machine]["health"] == "failed" and shown[machine]["reason"] == "PSU fault"
