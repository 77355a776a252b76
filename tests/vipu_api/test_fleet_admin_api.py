"""Fleet administration over HTTP while the cloud runs: racks and servers added, drained and retired;
bad requests refused with problems that change nothing; the fleet's figures on /metrics."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from scheduler.models import Machine
from scheduler.services.tenancy import tenants
from scheduler.settings import get_settings
from tests.support import services

ADMIN = "/api/v1/admin"


@pytest.fixture
def admin(client: Any, db: Any, env: Any) -> dict[str, str]:
    seeded = services.seed(db, fleet_description="2xm2000,1xdss8440")
    return {"Authorization": f"Bearer {seeded.admin_key}"}


def problem(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    return r.json()


def machines(db: Any) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(Machine)).scalar_one()


def test_admins_grow_and_shrink_the_fleet_over_http(client: Any, db: Any, admin: dict[str, str]) -> None:
    racks = client.get(f"{ADMIN}/fleet/racks", headers=admin).json()["racks"]
    assert [(r["id"], [u["id"] for u in r["units"]]) for r in racks] == [
        ("rack0000", ["pod0000", "pod0001"]),
        ("rack0001", ["srv0002"]),
    ]
    server = racks[1]["units"][0]
    assert (server["machine_type"], server["layout"], server["model"], server["ipus"]) == (
        "c2",
        "server",
        "dss8440",
        16,
    )

    added = client.post(f"{ADMIN}/fleet/racks", json={"machine_type": "bow", "pods": 2}, headers=admin)
    assert added.status_code == 201, added.text
    assert [u["id"] for u in added.json()["units"]] == ["pod0003", "pod0004"]
    servers = client.post(f"{ADMIN}/fleet/servers", json={"model": "nf5568m5", "count": 2}, headers=admin)
    assert servers.status_code == 201 and [u["id"] for u in servers.json()["servers"]] == [
        "srv0005",
        "srv0006",
    ]

    view = client.get(f"{ADMIN}/fleet", headers=admin).json()
    kinds = {p["id"]: (p["machine_type"], p["layout"]) for p in view["pods"]}
    assert kinds["srv0005"] == ("c2", "server") and kinds["pod0003"] == ("bow", "pod64")
    srv = next(p for p in view["pods"] if p["id"] == "srv0005")
    assert [i["id"] for i in srv["machines"][0]["ipus"]][:2] == ["srv0005-i00", "srv0005-i01"]
    by_type = {t["machine_type"]: t for t in view["summary"]["by_machine_type"]}
    assert by_type["c2"]["ipus"] == 48 and by_type["bow"]["largest_free"] == 128

    # Retiring needs a drained rack.
    refused = problem(client.delete(f"{ADMIN}/fleet/racks/rack0002", headers=admin), 409)
    assert "Drain" in refused["detail"]
    drained = client.post(f"{ADMIN}/fleet/racks/rack0002/drain", json={"reason": "lease ends"}, headers=admin)
    assert drained.status_code == 200 and len(drained.json()["machines"]) == 32
    retired = client.delete(f"{ADMIN}/fleet/racks/rack0002", headers=admin)
    assert retired.status_code == 200 and retired.json()["retired"] == ["pod0003", "pod0004"]
    assert client.post(f"{ADMIN}/machines/srv0005/drain", headers=admin).status_code == 200
    assert client.delete(f"{ADMIN}/fleet/units/srv0005", headers=admin).json()["retired"] == ["srv0005"]
    ids = [p["id"] for p in client.get(f"{ADMIN}/fleet", headers=admin).json()["pods"]]
    assert ids == ["pod0000", "pod0001", "srv0002", "srv0006"]
    problem(client.delete(f"{ADMIN}/fleet/units/srv0005", headers=admin), 404)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/fleet/racks", {"machine_type": "c2"}),  # a c2 comes in servers, not racks
        ("/fleet/racks", {"machine_type": "m2000", "layout": "pod16", "pods": 2}),
        ("/fleet/racks", {"machine_type": "m2000", "pods": 3}),
        ("/fleet/racks", {"machine_type": "tpu"}),
        ("/fleet/racks", {"machine_type": "m2000", "layout": "server"}),
        ("/fleet/servers", {"model": "dgx-a100"}),
        ("/fleet/servers", {"model": "dss8440", "count": 0}),
        ("/fleet/servers", {"model": "dss8440", "count": "2"}),
    ],
)
def test_bad_fleet_requests_are_problems_that_change_nothing(
    client: Any, db: Any, admin: dict[str, str], path: str, body: dict[str, Any]
) -> None:
    before = machines(db)
    r = client.post(f"{ADMIN}{path}", json=body, headers=admin)
    problem(r, 422)
    assert machines(db) == before


def test_unknown_racks_and_units_are_404(client: Any, admin: dict[str, str]) -> None:
    for method, path in [
        ("DELETE", "/fleet/racks/rack0099"),
        ("DELETE", "/fleet/racks/shelf-3"),
        ("DELETE", "/fleet/units/srv0099"),
        ("DELETE", "/fleet/units/not-a-unit"),
        ("POST", "/fleet/racks/rack0042/drain"),
    ]:
        problem(client.request(method, f"{ADMIN}{path}", headers=admin), 404)


def test_tenants_cannot_change_the_fleet(client: Any, db: Any, admin: dict[str, str]) -> None:
    with db.write() as s:
        key = tenants.create_tenant(
            session=s, secret=get_settings().secret(), name="t", plan="standard", quota_ipu_hours=1
        ).api_key
    before = machines(db)
    r = client.post(
        f"{ADMIN}/fleet/servers", json={"model": "dss8440"}, headers={"Authorization": f"Bearer {key}"}
    )
    problem(r, 403)
    assert machines(db) == before


def test_metrics_show_the_fleet_by_type_and_the_queue_wait(client: Any, admin: dict[str, str]) -> None:
    client.post(f"{ADMIN}/machines/srv0002/fail", json={"reason": "card"}, headers=admin)
    text = client.get("/metrics").text
    assert 'ipucloud_cluster_ipus{machine_type="c2"} 16.0' in text
    assert 'ipucloud_cluster_ipus{machine_type="m2000"} 128.0' in text
    assert 'ipucloud_cluster_ipus_free{machine_type="c2"} 0.0' in text
    assert 'ipucloud_cluster_ipus_free{machine_type="m2000"} 128.0' in text
    assert 'ipucloud_cluster_machines{health="failed",machine_type="c2"} 1.0' in text
    assert 'ipucloud_cluster_machines{health="up",machine_type="m2000"} 32.0' in text
    assert 'ipucloud_cluster_queue_wait_seconds_bucket{le="+Inf"} 0.0' in text
    assert "ipucloud_cluster_queue_wait_seconds_count 0.0" in text
