"""Usage reports: by day, job, workload and partition size; JSON and CSV; per tenant and across tenants."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from scheduler.models import AttemptState
from tests.tenancy.conftest import World, assert_problem, auth, bill, finish, start_attempt, submit


def run(db: Any, job_id: str, partition: str, cluster_s: float) -> None:
    attempt_id = start_attempt(db, job_id, partition)
    bill(db, attempt_id, 1, cluster_s / 2)
    assert finish(db, attempt_id, AttemptState.SUCCEEDED, cluster_s)


@pytest.fixture
def metered(db: Any, world: World) -> dict[str, str]:
    """A: three jobs (4, 4 and 1 IPUs, two workloads); B: one job."""
    jobs = {
        "a1": world.a.job_id,
        "a2": submit(db, world.a.id, name="second"),
        "a3": submit(
            db, world.a.id, name="mcmc", ipus=1, workload={"model": "mcmc", "task": "infer", "steps": 100}
        ),
    }
    run(db, jobs["a1"], "u1", 36.0)  # 4 x 36 s = 0.04 IPU-hours
    run(db, jobs["a2"], "u2", 72.0)  # 0.08
    run(db, jobs["a3"], "u3", 180.0)  # 0.05
    run(db, world.b.job_id, "u4", 360.0)  # 0.4
    return jobs


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_tenant_usage_by_every_grouping(client: Any, world: World, metered: dict[str, str]) -> None:
    r = client.get("/api/v1/usage", headers=auth(world.a.owner_key))
    assert r.status_code == 200
    u = r.json()
    assert u["used_ipu_hours"] == pytest.approx(0.17) and u["used_ipu_seconds"] == pytest.approx(612.0)
    assert u["remaining_ipu_hours"] == pytest.approx(1000 - 0.17 - u["reserved_ipu_hours"], abs=1e-5)
    assert [(j["job_id"], j["ipu_hours"]) for j in u["by_job"]] == [
        (metered["a3"], 0.05),
        (metered["a2"], 0.08),
        (metered["a1"], 0.04),
    ]
    assert {w["workload"]: w["ipu_hours"] for w in u["by_workload"]} == pytest.approx(
        {"resnet50": 0.12, "mcmc": 0.05}
    )
    assert {p["partition_size"]: p["ipu_hours"] for p in u["by_partition_size"]} == pytest.approx(
        {4: 0.12, 1: 0.05}
    )
    assert len(u["by_day"]) == 1 and u["by_day"][0]["ipu_hours"] == pytest.approx(0.17)
    assert world.b.job_id not in r.text, "never another tenant's usage"


def test_usage_csv_has_a_header_for_each_grouping(client: Any, world: World, metered: dict[str, str]) -> None:
    headers = auth(world.a.owner_key)
    r = client.get("/api/v1/usage?format=csv", headers=headers)
    assert r.headers["content-type"].startswith("text/csv")
    assert r.text.splitlines()[0] == (
        "job_id,tenant_id,name,workload,partition_size,machine_type,rate,raw_ipu_hours,charged_ipu_hours,"
        "ipu_hours"
    )
    assert [row["job_id"] for row in rows(r.text)] == [metered["a3"], metered["a2"], metered["a1"]]
    expected = {
        "day": "day,ipu_hours",
        "workload": "workload,ipu_hours",
        "partition_size": "partition_size,ipu_hours",
    }
    for group, header in expected.items():
        r = client.get(f"/api/v1/usage?format=csv&group={group}", headers=headers)
        assert r.text.splitlines()[0] == header and f"usage-{group}.csv" in r.headers["content-disposition"]
    by_size = rows(client.get("/api/v1/usage?format=csv&group=partition_size", headers=headers).text)
    assert by_size == [
        {"partition_size": "1", "ipu_hours": "0.05"},
        {"partition_size": "4", "ipu_hours": "0.12"},
    ]
    assert_problem(client.get("/api/v1/usage?format=csv&group=tenant", headers=headers), 422)


def test_usage_jobs_are_paged(client: Any, world: World, metered: dict[str, str]) -> None:
    headers = auth(world.a.owner_key)
    first = client.get("/api/v1/usage?limit=2", headers=headers).json()
    assert len(first["by_job"]) == 2 and first["next_cursor"]
    rest = client.get(f"/api/v1/usage?limit=2&cursor={first['next_cursor']}", headers=headers).json()
    assert [j["job_id"] for j in rest["by_job"]] == [metered["a1"]] and rest["next_cursor"] is None
    r = client.get("/api/v1/usage?format=csv&limit=2", headers=headers)
    assert len(rows(r.text)) == 2 and 'rel="next"' in r.headers["link"] and "cursor=" in r.headers["link"]


def test_usage_windows_are_validated(client: Any, world: World, metered: dict[str, str]) -> None:
    headers = auth(world.a.owner_key)
    assert (
        client.get(
            "/api/v1/usage?since=2000-01-01T00:00:00Z&until=2001-01-01T00:00:00Z", headers=headers
        ).json()["by_job"]
        == []
    )
    # A window that ends before it starts is simply empty.
    empty = client.get("/api/v1/usage?since=2030-01-01T00:00:00Z&until=2029-01-01T00:00:00Z", headers=headers)
    assert empty.status_code == 200 and empty.json()["by_day"] == []
    for query in (
        "since=0.5",
        "since=1700000000",
        "since=2030-01-01T00:00:00",  # no timezone
        "until=99999-01-01T00:00:00Z",
        "limit=0",
        "limit=100000",
        "format=xml",
        "days=0",
    ):
        assert_problem(client.get(f"/api/v1/usage?{query}", headers=headers), 422, "invalid-request")
    assert_problem(client.get("/api/v1/usage", headers=auth(world.admin_key)), 403, "forbidden")


def test_admin_usage_across_tenants(client: Any, world: World, metered: dict[str, str]) -> None:
    admin = auth(world.admin_key)
    u = client.get("/api/v1/admin/usage", headers=admin).json()
    used = {t["tenant_id"]: t["used_ipu_hours"] for t in u["tenants"]}
    assert used == pytest.approx({world.a.id: 0.17, world.b.id: 0.4})
    assert sum(d["ipu_hours"] for d in u["by_day"]) == pytest.approx(0.57)
    assert {j["tenant_id"] for j in u["by_job"]} == {world.a.id, world.b.id}
    only_b = client.get(f"/api/v1/admin/usage?tenant={world.b.id}", headers=admin).json()
    assert [j["job_id"] for j in only_b["by_job"]] == [world.b.job_id] and len(only_b["tenants"]) == 1
    page = client.get("/api/v1/admin/usage?tenants_limit=1", headers=admin).json()
    assert len(page["tenants"]) == 1 and page["tenants_next_cursor"]
    r = client.get("/api/v1/admin/usage?format=csv", headers=admin)
    assert r.text.splitlines()[0] == (
        "tenant_id,name,plan,status,quota_ipu_hours,used_ipu_hours,reserved_ipu_hours,remaining_ipu_hours,expires_at"
    )
    assert {row["name"] for row in rows(r.text)} == {"alpha", "beta"}
    jobs_csv = rows(client.get("/api/v1/admin/usage?format=csv&group=job", headers=admin).text)
    assert len(jobs_csv) == 4 and {row["tenant_id"] for row in jobs_csv} == {world.a.id, world.b.id}
    assert_problem(client.get("/api/v1/admin/usage?tenant=ten_missing", headers=admin), 404)


def test_usage_csv_never_hands_a_spreadsheet_a_formula(client: Any, db: Any, world: World) -> None:
    names = ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "plain -name"]
    for i, name in enumerate(names):
        run(db, submit(db, world.a.id, name=name), f"f{i}", 36.0)
    for path, headers in (
        ("/api/v1/usage?format=csv&group=job", auth(world.a.owner_key)),
        ("/api/v1/admin/usage?format=csv&group=job", auth(world.admin_key)),
    ):
        r = client.get(path, headers=headers)
        assert r.status_code == 200, r.text
        got = {row["name"] for row in rows(r.text)}
        assert {"'" + n for n in names[:4]} | {"plain -name"} <= got, got
