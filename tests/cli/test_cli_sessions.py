"""`ipucloud sessions start|list|show|extend|end` and `ipucloud jobs submit --session`, through Typer's runner
against a cloud in real processes (API, scheduler, a Celery host agent), and the SDK's session calls."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ipucloud.sdk import AsyncClient, Client, ConflictError, NotFoundError
from tests.cli.test_cli_client import Cli
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home" / "ipucloud" / "config.json")


def test_start_run_in_list_and_end_a_session(cloud: RunningCloud, cli: Cli, db: Any) -> None:
    _, key = cloud.create_tenant("session-cli")
    assert cli("login", "--url", cloud.url, "--key", key).exit_code == 0
    # The cloud runs 2,000 cluster seconds a wall second: a long idle timeout keeps it for the test.
    started = cli.json(
        "sessions", "start", "--ipus", "2", "--idle-timeout", "1000000", "--max-duration", "80000", "--wait"
    )
    assert started["state"] == "active" and started["partition"]["size"] == 2
    sid = started["id"]
    # More time, up to the standard plan's day (86,400 s): then the plan-limit exit code.
    assert cli.json("sessions", "extend", sid, "--by", "6000")["max_duration_s"] == 86000
    assert cli("sessions", "extend", sid, "--by", "1000").exit_code == 5
    assert cli("sessions", "extend", sid).exit_code == 2
    assert cli("sessions", "extend", sid, "--by", "1", "--max-duration", "86001").exit_code == 2
    assert cli.json("sessions", "extend", sid, "--idle-timeout", "2000000")["idle_timeout_s"] == 2000000
    job = cli.json(
        "jobs", "submit", "--session", sid, "--model", "resnet50", "--steps", "20", "--ipus", "2", "--follow"
    )
    assert job["state"] == "succeeded" and job["session"] == sid
    listed = cli.json("sessions", "list", "--state", "active")["items"]
    assert [s["id"] for s in listed] == [sid] and listed[0]["jobs"][0]["id"] == job["id"]
    shown = cli("sessions", "show", sid)
    assert shown.exit_code == 0 and started["partition"]["id"] in shown.stdout
    assert "time left" in shown.stdout and "max duration" in shown.stdout
    # A job larger than the session: refused with the conflict exit code.
    assert cli("jobs", "submit", "--session", sid, "--model", "resnet50", "--ipus", "4").exit_code == 5
    ended = cli.json("sessions", "end", sid)
    assert ended["state"] == "ended" and ended["ended_reason"] == "owner"
    assert cli("sessions", "end", sid).exit_code == 5
    assert cli("sessions", "show", "ses_" + "0" * 26).exit_code == 4
    assert cli("sessions", "start", "--ipus", "3").exit_code == 2

    # The SDK, both faces.
    with Client(cloud.url, key) as c:
        s = c.start_session(ipus=1, idle_timeout_s=1_000_000, max_duration_s=3600)
        assert c.get_session(s.id).ipus == 1
        assert c.change_session(s.id, max_duration_s=7200).max_duration_s == 7200
        assert [x.id for x in c.iter_sessions()][:2] == [s.id, sid]
        assert c.end_session(s.id).done
        with pytest.raises(NotFoundError):
            c.get_session("ses_" + "1" * 26)

    async def run() -> None:
        async with AsyncClient(cloud.url, key) as a:
            page = await a.list_sessions(state="ended")
            assert {x.id for x in page.items} >= {sid}
            with pytest.raises(ConflictError):
                await a.change_session(sid, idle_timeout_s=5)

    asyncio.run(run())
