"""#32 items 9, 10 and 17 at the terminal: `jobs submit --dry-run` honours `--prefer` and names the
type, shows what the grant is charged beside the raw IPU-hours, and "does not fit" exits with one
documented code from the dry run and the offline estimate alike. The CLI runs in-process (Typer's
runner) against the API served for real (uvicorn on a free port) on the test database."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from ipucloud.cli import app as cli_app
from ipucloud.exit_codes import EXIT_CODES_HELP, Exit
from tests.policy.test_live_pass import new_tenant
from tests.support import services
from tests.support.cloud import free_port

BERT = ["--model", "bert-base", "--seq-len", "128", "--batch-size", "32", "--steps", "200", "--ipus", "4"]
TOO_BIG = [
    "--model",
    "bert-large",
    "--seq-len",
    "384",
    "--batch-size",
    "64",
    "--ipus",
    "1",
    "--machine",
    "c2",
]


@pytest.fixture
def api(db: Any, runtime: Any) -> Iterator[str]:
    """The API on the test's runtime, listening on 127.0.0.1; yields its URL."""
    from api.app import create_app

    services.seed(db, fleet_description="2xm2000,1xbow,1xdss8440")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(runtime=runtime), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def cli(tmp_path: Path, url: str | None, key: str | None, *args: str) -> Any:
    env = {"IPUCLOUD_CONFIG": str(tmp_path / "config.json"), "IPUCLOUD_URL": url, "IPUCLOUD_API_KEY": key}
    return CliRunner().invoke(cli_app, list(args), env=env, catch_exceptions=False)


def test_a_dry_run_honours_prefer_names_the_type_and_shows_the_grant_charged(
    db: Any, api: str, tmp_path: Path
) -> None:
    _, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    cheapest = cli(tmp_path, api, key, "jobs", "submit", *BERT, "--prefer", "cost", "--dry-run", "--json")
    assert cheapest.exit_code == 0, cheapest.stderr
    est = json.loads(cheapest.stdout)
    options = est["machine_options"]
    assert est["prefer"] == "cost"
    assert est["machine"] == min(options, key=lambda k: options[k]["charged_ipu_hours"]) == "c2"
    fastest = json.loads(cli(tmp_path, api, key, "jobs", "submit", *BERT, "--dry-run", "--json").stdout)
    assert fastest["machine"] != "c2" and fastest["prefer"] == "time"
    shown = cli(tmp_path, api, key, "jobs", "submit", *BERT, "--prefer", "cost", "--dry-run")
    assert shown.exit_code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "machine type c2 (where it spends least of 3 types)" in text
    assert (
        f"charged {est['charged_ipu_hours']:,.4f} IPU-hours of the grant ({est['ipu_hours']:,.4f} IPU-hours "
        f"on c2 at rate 0.5)"
    ) in text


def test_does_not_fit_is_one_documented_exit_code_online_and_offline(
    db: Any, api: str, tmp_path: Path
) -> None:
    _, key = new_tenant(db, "acme", quota_ipu_hours=1000)
    dry = cli(tmp_path, api, key, "jobs", "submit", *TOO_BIG, "--dry-run")
    offline = cli(tmp_path, None, None, "estimate", *TOO_BIG)
    offline_json = cli(tmp_path, None, None, "estimate", *TOO_BIG, "--json")
    anywhere = cli(tmp_path, api, key, "jobs", "submit", *TOO_BIG[:-2], "--machine", "any", "--dry-run")
    codes = [r.exit_code for r in (dry, offline, offline_json, anywhere)]
    assert codes == [Exit.DOES_NOT_FIT] * 4, [(r.exit_code, r.stdout, r.stderr) for r in (dry, offline)]
    assert "Out of memory" in dry.stderr and "Out of memory" in offline.stderr
    assert (
        f"{int(Exit.DOES_NOT_FIT)} usage error, invalid request, or the workload does not fit"
        in EXIT_CODES_HELP
    )
    doc = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    assert (
        f"| {int(Exit.DOES_NOT_FIT)} | usage error" in doc
        and "does not fit" in doc.split("## Exit codes")[1][:900]
    )
