"""`ipucloud jobs submit --array/--dependency` and `ipucloud arrays ...` through Typer's runner, and the
SDK's array calls, against a cloud in real processes (API, scheduler, a Celery host agent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipucloud.sdk import Client, NotFoundError
from tests.cli.test_cli_client import Cli
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home" / "ipucloud" / "config.json")


class TestOneCloud:
    """Both tests on one running cloud (`shared_cloud`), each as tenants of its own."""

    def test_arrays_from_the_cli_and_the_sdk(
        self, shared_cloud: RunningCloud, cli: Cli, tmp_path: Path
    ) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("array-cli")
        _, other = cloud.create_tenant("array-other")
        assert cli("login", "--url", cloud.url, "--key", key).exit_code == 0
        base = ("jobs", "submit", "--model", "resnet50", "--steps", "10", "--ipus", "1")
        array = cli.json(*base, "--name", "bs", "--array", "0-3%2")
        assert array["id"].startswith("arr_") and array["size"] == 4 and array["max_running"] == 2
        after = cli.json(*base, "--name", "after", "--dependency", f"afterok:{array['id']}")
        assert after["depends_on"] == {
            "mode": "all",
            "on": [{"job": array["id"], "type": "afterok"}],
            "on_unsatisfiable": "cancel",
        }
        # Held for good: it waits for the array to fail, which it will not, and is kept (not cancelled).
        gate = cli.json(
            *base, "--name", "gate", "--dependency", f"afternotok:{array['id']}", "--hold-unsatisfiable"
        )
        bad = cli(*base, "--array", "0-3%x")
        assert bad.exit_code != 0
        spec = tmp_path / "sweep.yaml"
        spec.write_text(
            "name: grid\nworkload: {model: resnet50, steps: 10}\nipus: 1\n"
            "sweep:\n  method: grid\n  parameters:\n    workload.batch_size: {values: [16, 32]}\n"
            "    ipus: {values: [1, 2]}\n"
            # Held behind the gate: its elements are still queued when two are cancelled below.
            f"depends_on: {{all: [{{job: {gate['id']}, type: afterok}}]}}\n"
        )
        grid = cli.json("jobs", "submit", "-f", str(spec))
        assert grid["size"] == 4 and grid["sweep"]["method"] == "grid"
        assert cli("arrays", "show", grid["id"]).exit_code == 0
        listed = cli.json("arrays", "list")
        assert {a["id"] for a in listed} == {array["id"], grid["id"]}
        elements = cli.json("arrays", "jobs", grid["id"])
        assert [(e["params"]["workload.batch_size"], e["ipus"]) for e in elements] == [
            (16, 1),
            (16, 2),
            (32, 1),
            (32, 2),
        ]
        cancelled = cli.json("arrays", "cancel", grid["id"], "--indices", "2-3")
        assert len(cancelled["job_ids"]) == 2

        with Client(cloud.url, key) as c:
            final = cloud.wait_jobs(key, [after["id"]], timeout=180)
            assert final[after["id"]]["state"] == "succeeded"
            done = c.get_array(array["id"])
            assert done.state == "succeeded" and done.completed_indices == "0-3"
            assert c.get_job(gate["id"]).wait.reason == "dependency-never"
            retried = c.retry_array(grid["id"])  # a retry runs them now, dependencies or not
            assert len(retried.job_ids) == 2
            grid_ids = {e.array_index: e.id for e in c.iter_array_jobs(grid["id"])}
            ran = cloud.wait_jobs(key, [grid_ids[2], grid_ids[3]], timeout=180)
            assert {j["state"] for j in ran.values()} == {"succeeded"}
            c.cancel_job(gate["id"])  # the rest can no longer start: cancelled, saying why
            rest = cloud.wait_jobs(key, [grid_ids[0], grid_ids[1]], timeout=60)
            assert all(
                j["state"] == "cancelled" and "never be satisfied" in j["reason"] for j in rest.values()
            )
            throttled = c.update_array(grid["id"], max_running=1)
            assert throttled.max_running == 1
            sweep = c.submit_array(name="more", model="resnet50", steps=10, ipus=1, array={"indices": "0-9"})
            page = c.list_jobs(state="queued")
            folded = [j for j in page.items if j.folded is not None and j.array_id == sweep.id]
            assert folded and folded[0].folded.count >= 1
            c.cancel_array(sweep.id)
        with Client(cloud.url, other) as c, pytest.raises(NotFoundError):
            c.get_array(array["id"])

    def test_a_dry_run_of_an_array_or_sweep_shows_each_element_and_the_whole(
        self, shared_cloud: RunningCloud, cli: Cli, tmp_path: Path
    ) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("array-dry-run")
        assert cli("login", "--url", cloud.url, "--key", key).exit_code == 0
        base = (
            "jobs",
            "submit",
            "--model",
            "resnet50",
            "--steps",
            "500",
            "--ipus",
            "4",
            "--machine",
            "m2000",
        )
        shown = cli(*base, "--array", "0-5%2", "--dry-run")
        assert shown.exit_code == 0, shown.stdout + shown.stderr
        for text in ("index", "IPU-hours", "at most running", "last ends in", "6 (6 fit)"):
            assert text in shown.stdout, shown.stdout
        out = cli.json(*base, "--array", "0-5%2", "--dry-run")
        assert [e["index"] for e in out["elements"]] == list(range(6))
        assert out["totals"]["elements"] == 6 and out["totals"]["max_running"] == 2
        waits = sorted(e["expected_wait_s"] for e in out["elements"])
        assert waits[:2] == [0.0, 0.0] and waits[2] > 0, "two at a time, as max_running says"
        spec = tmp_path / "sweep.yaml"
        spec.write_text(
            "name: grid\nworkload: {model: resnet50, steps: 500}\nipus: 4\nmachine: m2000\n"
            "sweep:\n  parameters:\n    workload.batch_size: {values: [16, 64, 256]}\n"
        )
        grid = cli.json("jobs", "submit", "-f", str(spec), "--dry-run")
        assert [e["params"] for e in grid["elements"]] == [{"workload.batch_size": b} for b in (16, 64, 256)]
        with Client(cloud.url, key) as c:
            est = c.estimate(
                model="resnet50", steps=500, ipus=4, machine="m2000", array={"indices": "0-99"}, max_rows=5
            )
            assert [e.index for e in est.elements] == [0, 1, 2, 3, 4] and est.elements_truncated
            assert est.totals.elements == 100
            assert est.totals.charged_ipu_hours == pytest.approx(
                100 * est.elements[0].charged_ipu_hours, abs=1e-3
            )
            assert c.list_arrays().items == [], "a dry run stores nothing"
