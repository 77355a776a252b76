"""The `ipucloud` client commands through Typer's runner, against a cloud in real processes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from ipucloud.cli import app
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e

R50 = ["--model", "resnet50", "--batch-size", "64", "--steps", "200", "--ipus", "4"]


class Cli:
    """Runs `ipucloud ...` in-process with its own config file and no IPUCLOUD_URL/KEY inherited."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.runner = CliRunner()

    def __call__(self, *args: str, key: str | None = None, url: str | None = None) -> Result:
        env = {"IPUCLOUD_CONFIG": str(self.config), "IPUCLOUD_URL": url, "IPUCLOUD_API_KEY": key}
        return self.runner.invoke(app, list(args), env=env, catch_exceptions=False)

    def json(self, *args: str, key: str | None = None, url: str | None = None) -> Any:
        result = self(*args, "--json", key=key, url=url)
        assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
        return json.loads(result.stdout)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home" / "ipucloud" / "config.json")


class TestOneCloud:
    """Tenants and a read-only admin against one running cloud (`shared_cloud`); the tests that
    change the fleet, partitions and plans below start clouds of their own."""

    def test_tenant_logs_in_runs_follows_and_cancels_jobs(
        self, shared_cloud: RunningCloud, cli: Cli, tmp_path: Path
    ) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("cli-tenant", quota_ipu_hours=1000)

        login = cli("login", "--url", cloud.url, "--key", key)
        assert login.exit_code == 0, login.stderr
        assert "tenant" in login.stdout
        saved = json.loads(cli.config.read_text())
        assert saved == {"url": cloud.url, "api_key": key}
        assert stat.S_IMODE(os.stat(cli.config).st_mode) == 0o600

        # From here on the saved config is the only source of URL and key.
        follow = cli("jobs", "submit", *R50, "--name", "cli-r50", "--follow")
        assert follow.exit_code == 0, (follow.stdout, follow.stderr)
        assert "succeeded" in follow.stderr
        assert "running" in follow.stdout  # the state changes, streamed as log lines

        jobs = cli.json("jobs", "list")
        assert [j["name"] for j in jobs] == ["cli-r50"]
        job = jobs[0]
        assert job["state"] == "succeeded" and job["ipus"] == 4

        shown = cli("jobs", "show", job["id"])
        assert shown.exit_code == 0 and job["id"] in shown.stdout and "succeeded" in shown.stdout

        entries = cli.json("jobs", "logs", job["id"])
        states = [
            e["data"]["state"] for e in entries if e["kind"] == "state" and e.get("data", {}).get("state")
        ]
        assert states[0] == "queued" and states[-1] == "succeeded"

        replay = cli("jobs", "logs", job["id"], "--follow", "--json")
        assert replay.exit_code == 0
        events = [json.loads(line) for line in replay.stdout.splitlines()]
        assert events[-1] == {"event": "end", "id": events[-1]["id"], "state": "succeeded"}

        usage = cli.json("usage")
        assert usage["used_ipu_hours"] > 0
        assert usage["remaining_ipu_hours"] < usage["quota_ipu_hours"]
        header, *csv_rows = cli("usage", "--csv").stdout.splitlines()
        assert {"job_id", "ipu_hours"} <= set(header.split(",")) and job["id"] in csv_rows[0]

        # A YAML spec, overridden by a flag; a long job is cancelled (queued or running: under load
        # 5,000 steps finished before the cancel arrived, so it is long enough never to end first).
        spec = tmp_path / "job.yaml"
        spec.write_text(
            "name: from-yaml\nworkload:\n  model: bert-large\n  steps: 100000\nipus: 16\npriority: 1\n"
        )
        queued = cli.json("jobs", "submit", "-f", str(spec), "--name", "yaml-override")
        assert queued["name"] == "yaml-override" and queued["workload"]["model"] == "bert-large"
        assert queued["ipus"] == 16 and queued["priority"] >= 1
        cancelled = cli.json("jobs", "cancel", queued["id"])
        assert cancelled["cancel_requested"] is True
        ended = cli("jobs", "logs", queued["id"], "--follow")
        assert ended.exit_code == 1, "a followed job that was cancelled exits 1"
        assert "cancelled" in ended.stderr

        # Exit codes scripts rely on.
        assert cli("jobs", "show", "job_doesnotexist").exit_code == 4
        bad = cli("jobs", "submit", "--model", "gpt-17", "--steps", "3")
        assert bad.exit_code == 2 and "gpt-17" in bad.stderr
        assert cli("jobs", "submit", "--model", "resnet50", "--ipus", "three").exit_code == 2
        assert cli("jobs", "list", "--key", "ipuc_" + "A" * 61).exit_code == 3
        assert cli("admin", "tenants", "list").exit_code == 3, "a tenant key on an admin route"
        unreachable = cli("jobs", "list", "--url", "http://127.0.0.1:9")
        assert unreachable.exit_code == 6 and "127.0.0.1:9" in unreachable.stderr
        problem = cli("jobs", "show", "job_doesnotexist", "--json")
        assert problem.exit_code == 4 and json.loads(problem.stderr)["type"] == "/problems/not-found"

        # Dry run, and a job bigger than what is left of a grant (exit 5).
        _, poor = cloud.create_tenant("cli-poor", quota_ipu_hours=0.001)
        est = cli.json("jobs", "submit", *R50, "--dry-run", key=poor)
        assert est["fits"] is True and est["ipu_hours"] > 0 and est["expected_wait_s"] == 0
        big = cli("jobs", "submit", "--model", "bert-large", "--steps", "100000", "--ipus", "16", key=poor)
        assert big.exit_code == 5 and "quota-exceeded" in big.stderr, (big.stdout, big.stderr)

        assert cli("logout").exit_code == 0
        assert not cli.config.exists()
        assert cli("jobs", "list").exit_code == 3, "no key anywhere is an authentication error"

    def test_admin_logs_in_as_the_docs_say_and_a_wrong_key_is_refused(
        self, shared_cloud: RunningCloud, cli: Cli
    ) -> None:
        cloud = shared_cloud
        login = cli("login", "--url", cloud.url, "--key", cloud.admin_key)
        assert login.exit_code == 0, (login.stdout, login.stderr)
        assert "as admin" in login.stdout
        # The saved key alone now runs admin commands.
        assert "pod0000" in cli("admin", "fleet").stdout
        wrong = cli("login", "--url", cloud.url, "--key", "ipuc_" + "x" * 60)
        assert wrong.exit_code == 3, (wrong.stdout, wrong.stderr)
        assert json.loads(cli.config.read_text())["api_key"] == cloud.admin_key, "a refused key is not saved"

    def test_preemptible_jobs_with_checkpoints_and_resume_after_the_time_limit(
        self, shared_cloud: RunningCloud, cli: Cli
    ) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("cli-ckpt", quota_ipu_hours=1000)
        at = {"key": key, "url": cloud.url}
        # About 1,850 cluster seconds of ResNet-50 with a limit of 1,500: stopped at about 80%.
        args = ["--model", "resnet50", "--batch-size", "64", "--steps", "100000", "--ipus", "4"]
        job = cli.json(
            "jobs", "submit", *args, "--name", "cli-ckpt", "--max-runtime", "1500", "--preemptible",
            "--checkpoint-every", "120", **at,
        )  # fmt: skip
        assert job["preemptible"] is True and job["checkpoint_every_s"] == 120
        assert cloud.wait_jobs(key, [job["id"]], timeout=60)[job["id"]]["state"] == "failed"
        shown = cli("jobs", "show", job["id"], **at)
        assert shown.exit_code == 0, shown.stderr
        assert (
            "checkpoints" in shown.stdout
            and "time_limit" in shown.stdout
            and "resumable until" in shown.stdout
        )
        resumed = cli.json("jobs", "resume", job["id"], **at)
        assert resumed["state"] == "queued" and resumed["checkpoints"][0]["reason"] == "time_limit"
        assert cloud.wait_jobs(key, [job["id"]], timeout=60)[job["id"]]["state"] == "succeeded"
        again = cli("jobs", "resume", job["id"], **at)
        assert again.exit_code != 0 and "time limit" in (again.stdout + again.stderr)
        too_often = cli("jobs", "submit", *args, "--checkpoint-every", "5", **at)
        assert too_often.exit_code != 0 and "checkpoint_every_s" in (too_often.stdout + too_often.stderr)
        kept = cli.json("jobs", "submit", *args, "--name", "cli-kept", "--never-preempt", **at)
        assert kept["never_preempt"] is True and kept["preemptible"] is False
        assert "never preempted" in cli("jobs", "show", kept["id"], **at).stdout
        both = cli("jobs", "submit", *args, "--never-preempt", "--preemptible", **at)
        assert both.exit_code != 0 and "not both" in (both.stdout + both.stderr)


def test_admin_and_vipu_commands(cloud: RunningCloud, cli: Cli) -> None:
    admin = {"key": cloud.admin_key, "url": cloud.url}

    created = cli.json("admin", "tenants", "create", "acme", "--plan", "standard", "--quota", "10", **admin)
    assert created["api_key"].startswith("ipuc_") and created["quota_ipu_hours"] == 10
    tenant = created["id"]
    assert tenant in [t["id"] for t in cli.json("admin", "tenants", "list", **admin)]
    updated = cli.json(
        "admin", "tenants", "update", tenant, "--quota", "20", "--status", "suspended", **admin
    )
    assert updated["quota_ipu_hours"] == 20 and updated["status"] == "suspended"
    assert cli.json("admin", "tenants", "show", tenant, **admin)["status"] == "suspended"
    assert cli("admin", "tenants", "update", tenant, **admin).exit_code == 2
    assert cli("admin", "tenants", "show", "ten_nope", **admin).exit_code == 4

    made = cli("vipu", "create", "partition", "p1", "--size", "16", "--tenant", tenant, **admin)
    assert made.exit_code == 0 and made.stdout.strip() == "create partition (p1): success."
    listing = cli("vipu", "list", "partitions", **admin)
    assert listing.exit_code == 0
    lines = listing.stdout.splitlines()
    assert lines[0].startswith("---") and "Partition ID" in lines[1] and "|" in lines[1]
    row = [c.strip() for c in next(line for line in lines if line.startswith(" p1 ")).split("|")]
    assert row[:4] == ["p1", "reserved", "16", "1"] and row[6] == tenant and row[-1] == "ACTIVE"
    got = cli("vipu", "get", "partition", "p1", **admin)
    assert got.exit_code == 0 and got.stdout.count("-i") >= 16
    part = cli.json("vipu", "get", "partition", "p1", **admin)
    assert part["size"] == 16 and len(part["ipus"]) == 16 and part["tenant"] == tenant
    assert cli("vipu", "create", "partition", "p1", "--size", "16", **admin).exit_code == 5
    assert cli("vipu", "create", "partition", "p3", "--size", "3", **admin).exit_code == 2

    fleet = cli("admin", "fleet", **admin)
    assert fleet.exit_code == 0
    assert "AAAA AAAA AAAA AAAA" in fleet.stdout and "p1" in fleet.stdout

    assert cli("vipu", "reset", "partition", "p1", **admin).stdout.strip() == "reset partition (p1): success."
    assert (
        cli("vipu", "remove", "partition", "p1", **admin).stdout.strip() == "remove partition (p1): success."
    )
    assert cli("vipu", "get", "partition", "p1", **admin).exit_code == 4

    machine = cli.json("admin", "machines", "drain", "pod0001-m03", "--reason", "fan", **admin)
    assert machine["health"] == "draining" and machine["reason"] == "fan"
    assert cli.json("admin", "machines", "fail", "pod0001-m04", **admin)["health"] == "failed"
    fleet = cli("admin", "fleet", **admin)
    assert "showing" not in fleet.stdout, "the whole fleet is on screen"
    part = cli("admin", "fleet", "--pod-from", "1", "--pods", "1", **admin).stdout
    assert "showing pod0001 to pod0001 of 2 PODs and servers" in part and "pod0000" not in part
    pod1 = next(line for line in fleet.stdout.splitlines() if line.startswith("pod0001"))
    assert "~~~~ xxxx" in pod1
    assert cli.json("admin", "machines", "restore", "pod0001-m03", **admin)["health"] == "up"
    assert cli("admin", "machines", "drain", "pod9999-m00", **admin).exit_code == 4

    # Trials: apply without a key, approve handing the key over (printed once, works), reject another.
    # (By default no key is printed: the applicant's claim link mints it; see tests/tenancy/test_mail.py.)
    applied = cli.json(
        "trial",
        "apply",
        "--name",
        "Ada",
        "--email",
        "ada@example.org",
        "--organisation",
        "-",
        "--category",
        "individual",
        "--use",
        "Fine-tune BERT on my notes",
        url=cloud.url,
    )
    assert applied["status"] == "pending"
    other = cli.json(
        "trial",
        "apply",
        "--name",
        "Bob",
        "--email",
        "bob@example.org",
        "--organisation",
        "Bob Ltd",
        "--category",
        "business",
        "--use",
        "Evaluate ResNet-50 training",
        url=cloud.url,
    )
    pending = cli.json("admin", "trials", "list", "--status", "pending", **admin)
    assert [a["id"] for a in pending] == [applied["id"], other["id"]]
    decision = cli.json("admin", "trials", "approve", applied["id"], "--hand-over-key", **admin)
    assert decision["tenant"]["plan"] == "trial" and decision["api_key"].startswith("ipuc_")
    assert cli("jobs", "list", key=decision["api_key"], url=cloud.url).exit_code == 0
    assert cli("admin", "trials", "approve", applied["id"], **admin).exit_code == 5, "decided already"
    rejected = cli.json("admin", "trials", "reject", other["id"], "--reason", "Use a work address.", **admin)
    assert rejected["status"] == "rejected" and rejected["reason"] == "Use a work address."
    # Without --hand-over-key the admin sees no key: the applicant's mailed claim link mints the first.
    bob = (
        "--name",
        "Bob",
        "--email",
        "bob@example.org",
        "--organisation",
        "Bob Ltd",
        "--category",
        "business",
    )
    again = cli.json("trial", "apply", *bob, "--use", "Evaluate ResNet-50 training", url=cloud.url)
    shown = cli("admin", "trials", "approve", again["id"], **admin)
    assert (
        shown.exit_code == 0
        and "claim link" in " ".join(shown.output.split())
        and "ipuc_" not in shown.output
    )

    # Plans and a tenant's keys.
    plan = cli.json("admin", "plans", "update", "trial", "--quota", "150", **admin)
    assert plan["quota_ipu_hours"] == 150
    assert {"trial", "standard"} <= {p["name"] for p in cli.json("admin", "plans", "list", **admin)}
    made_key = cli.json("admin", "keys", "create", "ci", "--tenant", tenant, "--scope", "read", **admin)
    assert made_key["api_key"].startswith("ipuc_") and made_key["scopes"] == ["read"]
    listed = cli.json("admin", "keys", "list", "--tenant", tenant, **admin)
    assert made_key["id"] in [k["id"] for k in listed] and all("api_key" not in k for k in listed)
    assert (
        cli.json("admin", "keys", "revoke", made_key["id"], "--tenant", tenant, **admin)["state"] == "revoked"
    )
    assert cli("jobs", "list", key=made_key["api_key"], url=cloud.url).exit_code == 3

    usage = cli.json("admin", "usage", **admin)
    assert "acme" in [t["name"] for t in usage["tenants"]]
    assert "tenant_id" in cli("admin", "usage", "--csv", **admin).stdout.splitlines()[0].split(",")


def test_admins_change_the_fleet_and_see_servers_beside_pods(cloud: RunningCloud, cli: Cli) -> None:
    admin = {"url": cloud.url, "key": cloud.admin_key}
    added = cli.json("admin", "servers", "add", "dss8440", "--count", "2", **admin)
    assert [u["id"] for u in added["servers"]] == ["srv0002", "srv0003"]
    rack = cli.json("admin", "racks", "add", "bow", "--layout", "pod16", **admin)
    assert rack["id"] == "rack0002" and [u["id"] for u in rack["units"]] == ["pod0004"]
    assert cli("admin", "racks", "add", "c2", **admin).exit_code == 2  # a c2 comes in servers

    listing = cli("admin", "racks", "list", **admin)
    assert listing.exit_code == 0 and "srv0003" in listing.stdout and "dss8440" in listing.stdout

    part = cli.json("vipu", "create", "partition", "on-c2", "--size", "4", "--machine", "c2", **admin)
    assert part["ipus"] == [f"srv0002-i{i:02d}" for i in range(4)]
    fleet = cli("admin", "fleet", **admin)
    assert fleet.exit_code == 0
    server = next(line for line in fleet.stdout.splitlines() if line.startswith("srv0002"))
    assert server.split()[1:] == ["dss8440", "AA", "AA", "..", "..", "..", "..", "..", ".."]
    pod16 = next(line for line in fleet.stdout.splitlines() if line.startswith("pod0004"))
    assert pod16.split()[1:] == ["bow", "....", "....", "....", "...."]
    assert "c2 32/32 free" not in fleet.stdout and "c2 28/32 free" in fleet.stdout

    # Retiring: refused while up, then while a partition lives, then done.
    assert cli("admin", "servers", "retire", "srv0002", **admin).exit_code == 5
    assert cli.json("admin", "machines", "drain", "srv0002", **admin)["health"] == "draining"
    assert cli("admin", "servers", "retire", "srv0002", **admin).exit_code == 5
    assert cli("vipu", "remove", "partition", "on-c2", **admin).exit_code == 0
    assert cli.json("admin", "servers", "retire", "srv0002", **admin)["retired"] == ["srv0002"]
    assert cli.json("admin", "racks", "drain", "rack0002", **admin)["health"] == "draining"
    assert cli.json("admin", "racks", "retire", "rack0002", **admin)["retired"] == ["pod0004"]
    after = cli("admin", "fleet", **admin).stdout
    assert "srv0002" not in after and "pod0004" not in after and "srv0003" in after
