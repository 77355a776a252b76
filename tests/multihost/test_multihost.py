"""Four hosts, one cloud: jobs run on both worker hosts, and when one worker host's link is cut its
jobs move to the other and nothing is lost. Costs about 40 s (pass 2 only)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler import routing
from scheduler.models import Attempt, IpuAssignment, Job, MeterEvent, Partition
from tests.multihost.conftest import MultiHostCloud
from vipu.topology import pods_of

# serial: a PostgreSQL of its own and five hosts, with leases of a few seconds: alone on the machine.
pytestmark = [pytest.mark.needs_services, pytest.mark.netns, pytest.mark.slow, pytest.mark.serial]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
# 8 jobs of 16 IPUs fill both POD64s; each lasts about 11 s of wall time uncompiled, 6 s cached.
JOBS = 8
JOB = {"workload": {"model": "resnet50", "batch_size": 64, "steps": 80_000}, "ipus": 16}


def _attempts(cloud: MultiHostCloud) -> list[Any]:
    with cloud.engine().connect() as conn:
        return list(
            conn.execute(
                select(
                    Attempt.id,
                    Attempt.job_id,
                    Attempt.number,
                    Attempt.state,
                    Attempt.worker,
                    Attempt.started_at,
                    Attempt.ended_at,
                    Attempt.end_reason,
                    Partition.ipu_ids,
                ).join(Partition, Partition.pk == Attempt.partition_pk)
            )
        )


def _host_of(worker: str | None, hosts: dict[str, str]) -> str | None:
    # An attempt records the host agent that ran it, named by its Celery node name.
    for role, ns in hosts.items():
        if worker == f"worker@{ns}":
            return role
    return None


def test_jobs_run_on_both_worker_hosts_and_move_when_a_link_is_cut(multihost: MultiHostCloud) -> None:
    c = multihost
    w1, w2 = c.net.hosts["w1"], c.net.hosts["w2"]
    hosts = {"w1": w1.ns, "w2": w2.ns}

    # The production path, command by command: schema, fleet and admin key, then the services.
    c.run_ipucloud(c.ctl, "migrate")
    key_file = c.workdir / "admin.key"
    c.run_ipucloud(c.ctl, "bootstrap", "--pods", "2", "--admin-key-file", str(key_file))
    c.admin_key = key_file.read_text().strip()
    c.ipucloud(c.ctl, "api", "api", "--host", c.ctl.ip, "--port", "8000")
    c.ipucloud(c.ctl, "scheduler", "scheduler")
    for host, queues in ((w1, "pod0000,ipucloud"), (w2, "pod0001,ipucloud")):
        c.ipucloud(
            host,
            host.role,
            "worker",
            "--queues",
            queues,
            "--concurrency",
            "8",
            "--hostname",
            f"worker@{host.ns}",
        )
    c.wait("the API to be ready", lambda: c.request("GET", "/readyz").status_code == 200)
    c.wait(
        "both worker hosts to register their queues",
        lambda: {"pod0000", "pod0001"} <= set(routing.live_registrations(c.redis())),
    )

    r = c.request(
        "POST", "/api/v1/admin/tenants", json={"name": "far", "plan": "standard", "quota_ipu_hours": 500}
    )
    assert r.status_code in (200, 201), r.text
    key = r.json()["api_key"]
    ids = []
    for i in range(JOBS):
        r = c.request("POST", "/api/v1/jobs", key, json={**JOB, "name": f"far-{i}"})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])

    def running_on(role: str) -> int:
        return sum(1 for a in _attempts(c) if a.state == "running" and _host_of(a.worker, hosts) == role)

    c.wait("attempts to run on both worker hosts", lambda: running_on("w1") >= 2 and running_on("w2") >= 2)
    before = _attempts(c)
    for a in before:
        if a.worker:
            # Routing: each attempt ran on the worker beside its POD64.
            expected = {0: "w1", 1: "w2"}[pods_of(a.ipu_ids)[0]]
            assert _host_of(a.worker, hosts) == expected, (a.worker, a.ipu_ids)

    cut_at = time.time()
    c.net.cut(w2)
    interrupted = {
        a.job_id: a.number for a in _attempts(c) if a.state == "running" and _host_of(a.worker, hosts) == "w2"
    }
    assert interrupted, "w2 ran nothing when its link was cut"

    final: dict[str, dict[str, Any]] = {}

    def all_finished() -> bool:
        for jid in ids:
            body = c.request("GET", f"/api/v1/jobs/{jid}", key).json()
            final[jid] = body
            if body["state"] not in ("succeeded", "failed", "cancelled"):
                return False
        return True

    c.wait("every job to finish", all_finished, timeout=150)
    done_at = time.time()
    assert {j["state"] for j in final.values()} == {"succeeded"}, {j: b["state"] for j, b in final.items()}

    after = _attempts(c)
    lost = [a for a in after if a.job_id in interrupted and a.number == interrupted[a.job_id]]
    assert {a.state for a in lost} == {"lost"}, [(a.state, a.end_reason) for a in lost]
    assert all("lease expired" in (a.end_reason or "") for a in lost)
    successors = {}
    for a in after:
        if a.job_id in interrupted and a.number > interrupted[a.job_id] and a.started_at is not None:
            successors[a.job_id] = min(a.started_at.timestamp(), successors.get(a.job_id, float("inf")))
    assert set(successors) == set(interrupted), "every interrupted job ran again"
    for a in after:
        if a.started_at is not None and a.started_at.timestamp() > cut_at + 0.5:
            assert _host_of(a.worker, hosts) == "w1", f"attempt {a.id} started after the cut on {a.worker}"
    assert {_host_of(a.worker, hosts) for a in after if a.worker} == {"w1", "w2"}
    # The healthy host lost nothing: a dead host's open transaction must not cost it its leases.
    assert not [a.id for a in after if a.state == "lost" and _host_of(a.worker, hosts) == "w1"]

    with c.engine().connect() as conn:
        attempt_ids = conn.execute(select(Attempt.id)).scalars().all()
        settles = (
            conn.execute(select(MeterEvent.attempt_id).where(MeterEvent.kind == "settle")).scalars().all()
        )
        assert sorted(settles) == sorted(attempt_ids), "exactly one settle meter event per attempt"
        assert conn.execute(select(func.count()).select_from(IpuAssignment)).scalar_one() == 0, "IPUs held"
        live = conn.execute(
            select(func.count()).select_from(Partition).where(Partition.released_at.is_(None))
        )
        assert live.scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(Job)).scalar_one() == JOBS
    assert "pod0001" not in routing.live_registrations(c.redis()), "the cut host's queues lapsed"

    figures = {
        "jobs": JOBS,
        "hosts": {
            "db": "postgres+redis",
            "ctl": "api+scheduler",
            "w1": "pod0000,ipucloud",
            "w2": "pod0001,ipucloud",
        },
        "cut": "w2 link down at the switch",
        "attempts_interrupted": len(interrupted),
        "lost_detected_s": round(max(a.ended_at.timestamp() for a in lost) - cut_at, 2),
        "recovered_s": round(max(successors.values()) - cut_at, 2),
        "all_done_s": round(done_at - cut_at, 2),
        "attempts_total": len(attempt_ids),
    }
    print("multihost:", json.dumps(figures))
    if ARTIFACTS.is_dir():
        (ARTIFACTS / "multihost.json").write_text(json.dumps(figures, indent=2) + "\n")
