"""`gc-info`, `gc-monitor` and `ipucloud vipu` against a V-IPU endpoint listening for real.

Their output is read back with small parsers written from Graphcore's published formats (the
`-+- Id: [n], target: [...]` device listing, gc-monitor's `+---+` boxed tables, the V-IPU CLI's
`|` tables), as scripts that wrap those tools read it.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ipucloud.cli import app
from tests.support import vipu as support
from tests.support.cloud import free_port

# Parsers of the published formats ---------------------------------------------------------------------

_PART = re.compile(r"^Partition: (\S+)(?: \(gcd:(\d+)\))?( \[active\])?$")
_DEV = re.compile(
    r"^-\+- Id: \[(\d+)\], target: \[([^\]]+)\](?:, (?:IPU-M host|host): \[([^\]]+)\], IPU#: \[(\d+)\])?$"
)
_CHILD = re.compile(
    r"^ \|--- Id: \[(\d+)\], DNC Id: \[(\d+)\], (?:IPU-M host|host): \[([^\]]+)\], IPU#: \[(\d+)\]$"
)


def parse_device_listing(text: str) -> list[dict[str, Any]]:
    lines = text.splitlines()
    assert lines[0] == "Graphcore device listing:", lines[:2]
    sections: list[dict[str, Any]] = []
    device: dict[str, Any] | None = None
    for line in lines[1:]:
        if m := _PART.match(line):
            sections.append({"id": m[1], "gcd": m[2] and int(m[2]), "active": bool(m[3]), "devices": {}})
        elif m := _DEV.match(line):
            device = {"target": m[2], "host": m[3], "ipu": m[4] and int(m[4]), "children": []}
            sections[-1]["devices"][int(m[1])] = device
        elif m := _CHILD.match(line):
            assert device is not None and device["target"] == "Multi IPU", line
            device["children"].append((int(m[1]), int(m[2]), m[3], int(m[4])))
        else:
            raise AssertionError(f"not a line of gc-info's device listing: {line!r}")
    return sections


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split("|")]


def parse_monitor(text: str) -> list[dict[str, Any]]:
    """gc-monitor's boxes: a partition table (title row, column row, IPU rows) and its processes."""
    blocks: list[dict[str, Any]] = []
    columns: list[str] | None = None
    target: str | None = None
    for line in text.splitlines():
        if line.startswith("+"):
            assert set(line) <= {"+", "-"}, line
            continue
        assert line.startswith("|") and line.endswith("|"), line
        cells = _cells(line)
        if cells[0] == "gc-monitor":
            blocks.append({"title": cells[1], "devices": [], "caption": None, "processes": []})
            columns, target = None, "devices"
        elif len(cells) == 1:
            blocks[-1]["caption"] = cells[0]
            columns, target = None, "processes"
        elif columns is None:
            columns = cells
        else:
            assert target is not None
            blocks[-1][target].append(dict(zip(columns, cells, strict=True)))
    return blocks


def parse_pipe_table(text: str) -> list[dict[str, str]]:
    """The V-IPU CLI's tables: dashed rules, a header row and data rows of `|`-separated cells."""
    rows = [line for line in text.splitlines() if line and not set(line) <= {"-"}]
    header = [c.strip() for c in rows[0].split("|")]
    return [dict(zip(header, [c.strip() for c in r.split("|")], strict=False)) for r in rows[1:]]


# The cloud under the tools --------------------------------------------------------------------------------


@pytest.fixture
def endpoint(runtime: Any, db: Any) -> Iterator[int]:
    with support.serve(runtime) as port:
        yield port


@pytest.fixture
def busy_pair(db: Any, seeded: Any, client: Any) -> dict[str, Any]:
    """Tenant `alpha` holds reserved partition `pair` (8 IPUs, 2 GCDs); a job of its runs on GCD 0."""
    tid, key = support.tenant(client, seeded.admin_key, "alpha")
    part = support.reserve(client, seeded.admin_key, tid, "pair", 8, gcds=2)
    attempt = support.running_job_in(db, client, key, "pair", name="train-r50")
    return {"key": key, "tenant": tid, "ipus": part["ipus"], "attempt": attempt}


def run(*args: str, env: dict[str, str]) -> Any:
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def machine(ipu: str) -> str:
    return ipu.rsplit("-i", 1)[0]


def test_gc_info_lists_the_single_ipus_then_the_groups_of_the_active_gcd(
    busy_pair: dict[str, Any], endpoint: int
) -> None:
    env = support.vipu_env(
        endpoint, busy_pair["key"], IPUOF_VIPU_API_PARTITION_ID="pair", IPUOF_VIPU_API_GCD_ID="1"
    )
    done = run("gc-info", "--list-devices", env=env)
    assert done.exit_code == 0, done.output
    (section,) = parse_device_listing(done.stdout)
    assert (section["id"], section["gcd"], section["active"]) == ("pair", 1, True)
    gcd1 = busy_pair["ipus"][4:]
    devices = section["devices"]
    assert sorted(devices) == list(range(7))
    for n, ipu in enumerate(gcd1):
        assert devices[n] == {"target": "Fabric", "host": machine(ipu), "ipu": int(ipu[-1]), "children": []}
    assert [c[0] for c in devices[4]["children"]] == [0, 1] and [c[0] for c in devices[5]["children"]] == [
        2,
        3,
    ]
    assert [(c[0], c[1]) for c in devices[6]["children"]] == [(0, 0), (1, 1), (2, 2), (3, 3)]

    every = run("gc-info", "-l", "--all-partitions", env=support.vipu_env(endpoint, busy_pair["key"]))
    assert [(s["id"], s["gcd"]) for s in parse_device_listing(every.stdout)] == [("pair", 0), ("pair", 1)]

    info = run("gc-info", "-i", "-d", "0", env=env)
    assert info.exit_code == 0, info.output
    attrs = dict(line.strip().split(": ", 1) for line in info.stdout.splitlines()[1:])
    assert attrs["id"] == "0" and attrs["board type"] == "M2000" and attrs["ipu"] == gcd1[0]
    assert run("gc-info", "--ipu-count", env=env).stdout.strip() == "4"


def test_gc_monitor_shows_the_partition_and_the_attempts_attached_to_it(
    busy_pair: dict[str, Any], endpoint: int
) -> None:
    done = run("gc-monitor", "--partition", "pair", env=support.vipu_env(endpoint, busy_pair["key"]))
    assert done.exit_code == 0, done.output
    first, second = parse_monitor(done.stdout)
    assert first["title"] == "Partition: pair (gcd:0) has 4 IPUs"
    assert [d["IPU-M"] for d in first["devices"]] == [machine(i) for i in busy_pair["ipus"][:4]]
    assert [d["ID"] for d in first["devices"]] == ["0", "1", "2", "3"]
    assert {d["Type"] for d in first["devices"]} == {"M2000"} and {d["Serial"] for d in first["devices"]} == {
        "n/a"
    }
    assert first["caption"] == "Attached processes in partition pair"
    (proc,) = first["processes"]
    attempt = busy_pair["attempt"]
    assert proc["PID"] == str(attempt.id) and proc["Command"] == "train-r50" and proc["User"] == "alpha"
    assert proc["Job"] == attempt.job_id and proc["GCD"] == "0" and proc["ID"] == "6", proc
    assert re.match(r"^(\d+\.\d% step \d+/2000|compile \(\d+\.\d%\))$", proc["Progress"]), proc
    assert second["title"] == "Partition: pair (gcd:1) has 4 IPUs"
    assert second["caption"] == "No attached processes in partition pair" and second["processes"] == []

    # Inside the attempt, with the key its host agent wrote: its own GCD, marked active.
    inside = run(
        "gc-monitor",
        env=support.vipu_env(
            endpoint, busy_pair["key"], IPUOF_VIPU_API_PARTITION_ID="pair", IPUOF_VIPU_API_GCD_ID="0"
        ),
    )
    (only,) = parse_monitor(inside.stdout)
    assert only["title"] == "Partition: pair (gcd:0) [active] has 4 IPUs" and len(only["processes"]) == 1


def test_the_tools_answer_within_two_seconds_or_say_why(busy_pair: dict[str, Any], endpoint: int) -> None:
    key = busy_pair["key"]
    closed = free_port()
    started = time.monotonic()
    refused = run("gc-monitor", env=support.vipu_env(closed, key))
    assert refused.exit_code == 6 and time.monotonic() - started < 2.5
    assert f"nothing answers at 127.0.0.1:{closed}" in refused.stderr and "vipu-server" in refused.stderr

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        started = time.monotonic()
        hung = run("gc-info", env=support.vipu_env(silent.getsockname()[1], key))
        waited = time.monotonic() - started
    assert hung.exit_code == 6 and "did not answer within 2 s" in hung.stderr, hung.stderr
    # The tools keep their own deadline; what passes 2 s here is a loaded machine's scheduling.
    assert 1.9 < waited < 5, waited

    missing = run("gc-monitor", "--partition", "nowhere", env=support.vipu_env(endpoint, key))
    assert missing.exit_code == 4
    assert "no partition nowhere for this tenant (NOT_FOUND, partition-missing)" in missing.stderr
    bad_key = run("gc-info", env=support.vipu_env(endpoint, "ipuc_nonsense"))
    assert bad_key.exit_code == 3 and "UNAUTHENTICATED" in bad_key.stderr


def test_vipu_speaks_to_the_endpoint_with_the_v_ipu_clis_flags_and_config(
    busy_pair: dict[str, Any], endpoint: int, tmp_path: Path, db: Any, seeded: Any, client: Any
) -> None:
    key = busy_pair["key"]
    shell = {"IPUCLOUD_API_KEY": "", "IPUCLOUD_URL": ""}
    flags = ["--api-host", "127.0.0.1", "--api-port", str(endpoint), "--api-access-key", key]
    listed = run("vipu", *flags, "list", "partitions", env=shell)
    assert listed.exit_code == 0, listed.output
    (row,) = parse_pipe_table(listed.stdout)
    assert row["Partition ID"] == "pair" and row["Num. IPUs"] == "8" and row["Num. GCDs"] == "2"
    assert row["State"] == "PS_ACTIVE" and row["Jobs"] == busy_pair["attempt"].job_id
    after = run("vipu", "list", "partitions", *flags, env=shell)
    assert after.stdout == listed.stdout, "the global flags go anywhere on the line, as vipu's do"

    config = tmp_path / "vipu-cli.hcl"
    config.write_text(f'api-host = "127.0.0.1"\napi-port = {endpoint}\napi-access-key = "{key}"\n')
    allocations = run("vipu", "--config", str(config), "list", "allocations", env=shell)
    assert allocations.exit_code == 0, allocations.output
    (alloc,) = parse_pipe_table(allocations.stdout)
    assert alloc["Allocation ID"] == "pair" and alloc["Agents"].split() == sorted(
        {machine(i) for i in busy_pair["ipus"]}
    )

    via_env = support.vipu_env(endpoint, key)
    conf = run("vipu", "get", "partition", "pair", "--ipu-configs", "--gcd", "1", env=via_env)
    assert conf.exit_code == 0 and json.loads(conf.stdout)["ipus"][0]["ipu_id"] == busy_pair["ipus"][4]
    busy = run("vipu", "get", "partition", "pair", "--ipu-configs", env=via_env)
    assert busy.exit_code == 5 and "(FAILED_PRECONDITION, partition-busy)" in busy.stderr, busy.stderr
    missing = run("vipu", "get", "partition", "nowhere", env=via_env)
    assert missing.exit_code == 4 and "partition-missing" in missing.stderr
    theirs = run("vipu", "remove", "partition", "pair", env=via_env)
    assert theirs.exit_code == 3 and "only an admin removes it" in theirs.stderr
    attrs = parse_pipe_table(run("vipu", "list", "ipu-attrs", "--partition", "pair", env=via_env).stdout)
    assert [r["Attribute"] for r in attrs if r["Agent"]][:1] == ["board ipu index"] and len(attrs) > 8 * 10
    assert run("vipu", "version", env=via_env).stdout.startswith("version: 1.18.0")

    _, trial_key = support.tenant(client, seeded.admin_key, "trialist", plan="trial")
    big = run("vipu", "create", "partition", "big", "--size", "64", env=support.vipu_env(endpoint, trial_key))
    assert (
        big.exit_code == 3 and "outside your allocation" in big.stderr and "outside-allocation" in big.stderr
    )
    made = run(
        "vipu", "create", "partition", "mine", "--size", "4", env=support.vipu_env(endpoint, trial_key)
    )
    assert made.exit_code == 0 and made.stdout.startswith("create partition (ses"), made.output
    assert "PS_PENDING" in made.stdout
    gone = run("vipu", "remove", "partition", "mine", env=support.vipu_env(endpoint, trial_key))
    assert gone.exit_code == 0 and gone.stdout.startswith("remove partition ("), gone.output


def test_the_installed_gc_monitor_command_answers(busy_pair: dict[str, Any], endpoint: int) -> None:
    import os

    tool = Path(sys.executable).parent / "gc-monitor"
    env = {**os.environ, **support.vipu_env(endpoint, busy_pair["key"], IPUOF_VIPU_API_PARTITION_ID="pair")}
    done = subprocess.run([str(tool)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    titles = [block["title"] for block in parse_monitor(done.stdout)]
    assert titles == [
        "Partition: pair (gcd:0) [active] has 4 IPUs",
        "Partition: pair (gcd:1) [active] has 4 IPUs",
    ]


def test_gc_monitor_answers_within_its_two_seconds_on_a_busy_fleet(db: Any, runtime: Any, env: Any) -> None:
    """The benchmark's shape on 32 POD64s (benchmarks/gc_monitor.py runs 1,024): every IPU in a
    reserved partition of 4 GCDs, a job on every GCD; the installed gc-monitor, with its 2 s limit,
    shows a tenant's."""
    import os

    from tests.support import services

    services.seed(db, pods=32)
    filled = support.fill_fleet(db, tenants=8, partitions_per_tenant=16)
    assert filled["running"] == 8 * 16 * 4
    tool = Path(sys.executable).parent / "gc-monitor"
    with support.serve(runtime) as port:
        env_ = {**os.environ, **support.vipu_env(port, filled["key"])}
        done = subprocess.run([str(tool)], env=env_, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    blocks = parse_monitor(done.stdout)
    assert len(blocks) == 16 * 4, "each of the tenant's 16 partitions, GCD by GCD"
    assert all(len(b["processes"]) == 1 and len(b["devices"]) == 4 for b in blocks)
    assert {b["processes"][0]["User"] for b in blocks} == {"bench-0000"}
