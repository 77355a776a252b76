"""The partition invariants through the admin API under 50 concurrent create/remove requests.

Two API processes share the database, so requests race between threads of one process (its
in-memory allocator) and between processes (only the database's unique indexes arbitrate). The
fleet is two POD64s and the creates ask for far more than 128 IPUs, so some must be refused.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text

from scheduler.errors import Conflict, NoCapacity
from scheduler.models import IpuAssignment, Partition
from scheduler.services.capacity import fleet, partitions
from tests.support.cloud import RunningCloud, free_port
from vipu.partitions import validate_partition

ADMIN_PARTITIONS = "/api/v1/admin/partitions"
# Sizes of the concurrent creates: 520 IPUs asked of a 128-IPU fleet.
CREATE_SIZES = [64] * 3 + [32] * 4 + [16] * 6 + [8] * 8 + [4] * 7 + [2] * 4 + [1] * 4
# Made one by one before the burst, so that the burst's removes have something to free.
EXISTING = {"old-16": 16, "old-8a": 8, "old-8b": 8, "old-4": 4, "old-2": 2, "old-1": 1}


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/problem+json"), (r.status_code, r.text)
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"], body
    assert body["type"].startswith("/problems/"), body
    return body


def start_second_api(cloud: RunningCloud) -> str:
    port = free_port()
    proc = cloud.spawn("api2", "--port", str(port), "--host", "127.0.0.1", component="api")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        assert proc.alive(), proc.tail()
        time.sleep(0.1)
    raise AssertionError(f"the second API process did not become ready:\n{proc.tail()}")


def live_rows(db: Any) -> tuple[dict[str, Partition], dict[str, int], dict[int, str]]:
    """Live partitions by name, the assignment table (IPU -> partition pk), and live pk -> name."""
    with db.read() as s:
        fleet.ensure_no_overlap(session=s)  # raises Conflict on any IPU in two live partitions
        parts = {
            p.name: p for p in s.execute(select(Partition).where(Partition.released_at.is_(None))).scalars()
        }
        assignments = dict(s.execute(select(IpuAssignment.ipu_id, IpuAssignment.partition_pk)).tuples().all())
        shape = fleet.fleet_shape(session=s)
    for part in parts.values():
        checked = validate_partition(shape, part.ipu_ids, gcds=part.gcds, reconfigurable=part.reconfigurable)
        assert checked.size == part.size == len(part.ipu_ids), part.name
    return parts, assignments, {p.pk: name for name, p in parts.items()}


def test_fifty_concurrent_creates_and_removes_never_overlap(cloud: RunningCloud, db: Any) -> None:
    urls = [cloud.url, start_second_api(cloud)]
    headers = {"Authorization": f"Bearer {cloud.admin_key}"}
    with httpx.Client(base_url=cloud.url, headers=headers, timeout=60) as c:
        for name, size in EXISTING.items():
            r = c.post(ADMIN_PARTITIONS, json={"id": name, "size": size})
            assert r.status_code == 201, r.text

    rng = random.Random(3)
    requests: list[tuple[str, str, int]] = []  # (verb, name, size)
    for index, size in enumerate(CREATE_SIZES):
        requests.append(("create", f"new-{index}", size))
    requests.append(("create", "twin", 4))  # two creates of one name: at most one may win
    requests.append(("create", "twin", 1))
    requests += [("remove", name, 0) for name in EXISTING]
    # Removes of partitions the burst itself creates (200 or 404, depending on who is first) and of
    # names that never exist (404).
    requests += [("remove", f"new-{index}", 0) for index in (5, 15, 25, 35)]
    requests += [("remove", "never-made", 0), ("remove", "new-999", 0)]
    assert len(requests) == 50
    rng.shuffle(requests)

    responses: list[tuple[str, str, int, httpx.Response]] = [None] * len(requests)  # type: ignore[list-item]
    start = threading.Barrier(len(requests))

    def fire(slot: int) -> None:
        verb, name, size = requests[slot]
        with httpx.Client(base_url=urls[slot % 2], headers=headers, timeout=120) as client:
            start.wait()
            if verb == "create":
                r = client.post(ADMIN_PARTITIONS, json={"id": name, "size": size})
            else:
                r = client.delete(f"{ADMIN_PARTITIONS}/{name}")
        responses[slot] = (verb, name, size, r)

    threads = [threading.Thread(target=fire, args=(slot,)) for slot in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert all(response is not None for response in responses), "a request never came back"

    outcomes: Counter[tuple[str, int]] = Counter()
    created: dict[str, list[str]] = {}
    removed: set[str] = set()
    for verb, name, size, r in responses:
        outcomes[(verb, r.status_code)] += 1
        if verb == "create":
            assert r.status_code in (201, 409), (name, r.status_code, r.text, cloud.logs())
            if r.status_code == 201:
                body = r.json()
                assert body["id"] == name and body["size"] == size == len(body["ipus"]), body
                assert name not in created, f"two creates of {name!r} both succeeded"
                created[name] = body["ipus"]
            else:
                assert_problem(r, 409)
        else:
            assert r.status_code in (200, 404), (name, r.status_code, r.text, cloud.logs())
            if r.status_code == 200:
                assert r.json()["state"] == "released", r.text
                removed.add(name)
            else:
                assert_problem(r, 404)
    assert removed >= set(EXISTING), "removing an idle partition that exists must succeed"
    assert outcomes[("remove", 404)] >= 2, outcomes
    refusals = [r for verb, _, _, r in responses if verb == "create" and r.status_code == 409]
    assert any(r.json()["type"] == "/problems/no-capacity" for r in refusals), outcomes
    assert sum(1 for verb, name, _, r in responses if name == "twin" and r.status_code == 201) <= 1

    # The database agrees with itself and with what the API said.
    parts, assignments, names_by_pk = live_rows(db)
    assert set(parts) == set(created) - removed, (sorted(parts), sorted(created), sorted(removed))
    for name, part in parts.items():
        assert list(part.ipu_ids) == created[name]
    assert {ipu: names_by_pk.get(pk) for ipu, pk in assignments.items()} == {
        ipu: name for name, part in parts.items() for ipu in part.ipu_ids
    }
    with httpx.Client(base_url=urls[1], headers=headers, timeout=60) as c:
        listed = c.get(ADMIN_PARTITIONS, params={"limit": 1000}).json()["items"]
    assert {p["id"]: p["ipus"] for p in listed} == {name: list(p.ipu_ids) for name, p in parts.items()}

    # Removing everything leaves no assignment, and both processes see the whole fleet free again:
    # each can carve one 128-IPU partition out of the two POD64s.
    with httpx.Client(base_url=cloud.url, headers=headers, timeout=60) as c:
        for name in parts:
            assert c.delete(f"{ADMIN_PARTITIONS}/{name}").status_code == 200
    parts, assignments, _ = live_rows(db)
    assert parts == {} and assignments == {}
    for url in urls:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            r = c.post(ADMIN_PARTITIONS, json={"id": "everything", "size": 128})
            assert r.status_code == 201, r.text
            assert len(set(r.json()["ipus"])) == 128
            assert c.delete(f"{ADMIN_PARTITIONS}/everything").status_code == 200
    with db.read() as s:
        assert fleet.assignment_count(session=s) == 0


def test_a_create_that_loses_a_race_for_its_name_is_told_so(seeded: Any, db: Any) -> None:
    """Two creates of one name in flight together: the second waits on the first, then hears the name
    is taken (not that the fleet is changing, and without five reloads of the allocator)."""
    outcome: list[BaseException | None] = []

    def second() -> None:
        try:
            with db.write() as s:
                partitions.create_partition(session=s, name="twin", size=4, machine_type=None, tenant_id=None)
            outcome.append(None)
        except BaseException as exc:  # handed to the test thread to assert on
            outcome.append(exc)

    with db.write() as first:
        partitions.create_partition(session=first, name="twin", size=4, machine_type=None, tenant_id=None)
        racer = threading.Thread(target=second)
        racer.start()
        wait_until_blocked_on_a_lock(db)
    racer.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], Conflict), outcome
    assert not isinstance(outcome[0], NoCapacity)
    assert "already exists" in outcome[0].detail, outcome[0].detail


def wait_until_blocked_on_a_lock(db: Any) -> None:
    """On PostgreSQL, until some backend waits on a lock (the racer, on the first's name); SQLite
    serialises writers at BEGIN, so there the racer simply waits for the first to commit."""
    if db.sqlite:
        time.sleep(0.3)
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with db.read() as s:
            waiting = s.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the second create never reached the database")


def test_a_rolled_back_create_leaves_no_phantom_in_the_index(seeded: Any, db: Any) -> None:
    """A create registers its IPUs in this process's index before its transaction commits. If that
    transaction rolls back and another process then commits a partition under the same primary key
    (SQLite hands out the highest rowid again; PostgreSQL never does), the index must still drop
    the phantom and take in the real one."""
    with pytest.raises(RuntimeError), db.write() as s:
        partitions.create_partition(session=s, name="ghost", size=64, machine_type=None, tenant_id=None)
        raise RuntimeError("the request failed after its partition was placed")
    elsewhere = fleet.AllocatorSync("default")  # another API process, with its own index
    with db.write() as s:
        placement = elsewhere.refresh(s).find(32)
        assert placement is not None
        real = fleet.insert_partition(
            session=s, name="real", kind="reserved", placement=placement, tenant_id=None
        )
    taken = set(real.ipu_ids)
    # 128 IPUs, 32 of them live: a 64 and a 32 still fit, and neither may touch the real partition.
    for name, size in (("second", 64), ("third", 32)):
        with db.write() as s:
            part = partitions.create_partition(
                session=s, name=name, size=size, machine_type=None, tenant_id=None
            )
        assert taken.isdisjoint(part.ipu_ids), name
        taken |= set(part.ipu_ids)
    with db.read() as s:
        fleet.ensure_no_overlap(session=s)
        assert fleet.assignment_count(session=s) == 128
