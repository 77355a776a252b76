"""The seeds' three kinds of hardware side by side, on real processes (API, scheduler, Celery worker,
Redis; SQLite or PostgreSQL): jobs of every kind run to a metered finish on IPU-M2000 POD64s, a Bow
POD16 and C2 servers, while admins add a server and drain and retire another under load. No partition
ever overlaps another or lands on retired hardware, and every job's bill names the type it ran on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import Attempt, Machine, MeterEvent, Partition
from scheduler.services.capacity import fleet
from tests.support import services
from tests.support.cloud import RunningCloud
from vipu.partitions import validate_partition

pytestmark = pytest.mark.e2e

WORKLOAD = {"model": "resnet50", "batch_size": 64, "steps": 20}


@pytest.fixture
def mixed_cloud(env: dict[str, str], db: Any, tmp_path: Path) -> Iterator[RunningCloud]:
    seeded = services.seed(db, fleet_description="2xm2000,1xbow/pod16,2xdss8440")
    with RunningCloud.start(env, tmp_path, admin_key=seeded.admin_key) as running:
        yield running


def test_three_kinds_of_hardware_run_side_by_side_while_the_fleet_changes(
    mixed_cloud: RunningCloud, db: Any
) -> None:
    cloud = mixed_cloud
    _, key = cloud.create_tenant("seeds")
    kinds = [
        {"machine": "c2", "ipus": 4},
        {"machine": "c2", "ipus": 16},
        {"machine": "bow", "ipus": 8},
        {"machine": "m2000", "ipus": 64},
        {"machine": "any", "ipus": 2},
        {"machine": "any", "ipus": 4, "prefer": "cost"},
    ]
    ids: dict[str, dict[str, Any]] = {}
    with cloud.http(key) as c:
        for i in range(18):
            body = {"name": f"j{i}", "workload": WORKLOAD, **kinds[i % len(kinds)]}
            r = c.post("/api/v1/jobs", json=body)
            assert r.status_code == 202, r.text
            ids[r.json()["id"]] = body

    with cloud.admin() as admin:
        added = admin.post("/api/v1/admin/fleet/servers", json={"model": "nf5568m5"})
        assert added.status_code == 201, added.text
        new_server = added.json()["servers"][0]["id"]
        assert (
            admin.post("/api/v1/admin/machines/srv0004/drain", json={"reason": "retiring"}).status_code == 200
        )
        # Retiring waits for what runs there to end: refused (409) until then, never a strand.
        deadline = time.monotonic() + 120
        while True:
            r = admin.delete("/api/v1/admin/fleet/units/srv0004")
            if r.status_code == 200:
                break
            assert r.status_code == 409, r.text
            assert time.monotonic() < deadline, cloud.logs()
            time.sleep(0.2)
        retired_at = time.time()

    final = cloud.wait_jobs(key, list(ids), timeout=240)
    assert {j["state"] for j in final.values()} == {"succeeded"}, final
    for job_id, body in ids.items():
        job = final[job_id]
        if body["machine"] != "any":
            assert job["machine"] == body["machine"], job
        else:
            assert job["machine"] in {"m2000", "bow", "c2"} and set(job["machine_options"]) >= {"m2000", "c2"}
        assert job["used_ipu_hours"] > 0

    with db.read() as s:
        fleet.ensure_no_overlap(session=s)
        shape = fleet.fleet_shape(session=s)
        retired = s.execute(select(Machine.retired_at).where(Machine.id == "srv0004")).scalar_one()
        assert retired is not None and not shape.has_pod(4)
        for part in s.execute(select(Partition)).scalars():
            if part.created_at.timestamp() > retired_at:
                assert not any(i.startswith("srv0004-") for i in part.ipu_ids), part.name
            if part.released_at is None:
                validate_partition(shape, part.ipu_ids)
        attempt_types = dict(s.execute(select(Attempt.id, Attempt.machine_type)).tuples().all())
        for attempt_id, kind in s.execute(select(MeterEvent.attempt_id, MeterEvent.machine_type)).tuples():
            assert kind == attempt_types[attempt_id]
        used_types = set(attempt_types.values())
    assert used_types == {"m2000", "bow", "c2"}
    with cloud.http(key) as c:
        usage = c.get("/api/v1/usage").json()
    by_type = {row["machine_type"]: row for row in usage["by_machine_type"]}
    assert set(by_type) == {"m2000", "bow", "c2"}
    assert by_type["c2"]["charged_ipu_hours"] == pytest.approx(
        by_type["c2"]["ipu_hours"] * usage["rates"]["c2"], rel=1e-3
    )
    assert by_type["bow"]["charged_ipu_hours"] > by_type["bow"]["ipu_hours"]  # Bow costs more per hour
    with cloud.admin() as admin:
        view = admin.get("/api/v1/admin/fleet").json()
    assert new_server in {p["id"] for p in view["pods"]} and "srv0004" not in {p["id"] for p in view["pods"]}
