"""Issue #32 item 14: every figure says which clock it is in. Durations (`*_s`) are cluster time;
a moment (`estimated_start`, `resumable_until`) is the wall clock; a wait also comes on the wall
clock, since at a time scale of 60 an `expected_wait_s` of 4,660 is 78 s of someone's afternoon."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ipucloud.cli.client_jobs import _progress_row, _wait
from ipucloud.cli.server import DEMO_TIME_SCALE
from scheduler.clock import Clock
from scheduler.models import Job
from scheduler.settings import get_settings, reset_settings_cache
from tests.policy.test_live_pass import new_tenant, scheduler, spec, submit

ROOT = Path(__file__).resolve().parents[2]
SCALE = 60.0


@pytest.fixture
def env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The test cloud at the demo's time scale, where cluster and wall seconds differ 60-fold."""
    monkeypatch.setenv("IPUCLOUD_TIME_SCALE", str(SCALE))
    reset_settings_cache()
    return {**env, "IPUCLOUD_TIME_SCALE": str(SCALE)}


def test_an_estimate_gives_its_wait_on_both_clocks_and_says_its_scale(
    db: Any, seeded: Any, client: Any
) -> None:
    assert get_settings().time_scale == SCALE
    tenant, key = new_tenant(db, "acme", quota_ipu_hours=10_000)
    submit(db, tenant, spec(128, steps=20_000))  # the whole fleet, for a long while
    assert scheduler(db).schedule_pass() == 1
    asked_at = datetime.now().astimezone()
    body = {"workload": {"model": "resnet50", "task": "train", "batch_size": 1024, "steps": 100}, "ipus": 64}
    out = client.post(
        "/api/v1/estimates", json={**body, "machine": "m2000"}, headers={"Authorization": f"Bearer {key}"}
    )
    assert out.status_code == 200, out.text
    est = out.json()
    assert est["time_scale"] == SCALE
    wait_s, wall_s = est["expected_wait_s"], est["expected_wait_wall_s"]
    assert wait_s is not None and wait_s > 60
    assert wall_s == pytest.approx(wait_s / SCALE, abs=0.01)
    # The wall-clock wait is the one the scheduler's wall-clock `estimated_start` agrees with.
    job_id = submit(db, tenant, spec(64, steps=100))
    assert scheduler(db).schedule_pass() == 0
    with db.read() as s:
        wait = s.get(Job, job_id).wait
    start = datetime.fromisoformat(wait["estimated_start"]).timestamp()
    assert abs(start - (asked_at.timestamp() + wall_s)) < 5, (wait, wall_s)


def test_the_api_schema_names_the_clock_of_each_figure(client: Any) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]

    def described(model: str, field: str) -> str:
        return str(schemas[model]["properties"][field].get("description", ""))

    assert described("WaitReason", "estimated_start").startswith("Wall clock")
    assert described("JobOut", "resumable_until").startswith("Wall clock")
    assert described("JobOut", "predicted_runtime_s").startswith("Cluster seconds")
    assert described("Progress", "eta_s").startswith("Cluster seconds")
    assert described("Progress", "cluster_s").startswith("Cluster seconds")
    assert described("EstimateOut", "expected_wait_s").startswith("Cluster seconds")
    assert described("EstimateOut", "expected_wait_wall_s").startswith("Wall seconds")
    assert described("EstimateOut", "total_s").startswith("Cluster seconds")


def test_the_cli_says_which_clock() -> None:
    assert _wait(4660.0, 4660.0 / SCALE) == "77.7 min cluster time (about 77.7 s wall clock)"
    assert _wait(0.0, 0.0) == "starts at once"

    class P:
        phase, step, steps, percent, cluster_s = "compile", 500, 1000, 50.0, 120.0

    assert _progress_row(P()) == "50.0% of steps (compile, step 500 of 1,000, 2.0 min cluster time)"


def test_docs_cli_gives_the_time_scale_up_runs_at() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    assert "2,000 cluster seconds per wall second" not in text
    said = re.findall(r"`ipucloud up` runs (\d[\d,]*) cluster seconds per wall second", text)
    assert said and {float(n.replace(",", "")) for n in said} == {DEMO_TIME_SCALE}


def test_the_dashboard_names_the_clocks() -> None:
    from api.dashboard.web import templates

    html = templates.get_template("_estimate.html").render(
        estimate={
            "fits": True, "plan": {"ipus": 4, "ipus_per_replica": 1, "replicas": 4}, "total_s": 1440.0,
            "compile_s": 756.0, "ipu_hours": 1.6, "expected_wait_s": 4660.0, "expected_wait_wall_s": 77.667,
            "throughput": 3035.0, "time_scale": SCALE, "machine": "m2000", "rate": 1.0,
            "charged_ipu_hours": 1.6, "reserve_ipu_hours": 1.6,
        },
        clock=Clock(SCALE),  # every page is handed the app's (api/dashboard/web.py `render`)
    )  # fmt: skip
    assert "77.7 min cluster time" in html and "about 77.7 s wall clock" in html
    assert "24.0 min cluster time" in html
    page = (ROOT / "api" / "dashboard" / "templates" / "job.html").read_text()
    # The labels are the clock's own names, not words typed into each template.
    assert "Estimated start ({{ clock.wall_name }})" in page
    assert "resumable_until|when }}</time> ({{ clock.wall_name }})" in page
    assert (Clock(SCALE).name, Clock(SCALE).wall_name) == ("cluster time", "wall clock")
