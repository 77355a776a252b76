"""The dashboard's newer pages in Debian's Chromium (Playwright), against a cloud in real processes:
a tenant uploads an ONNX model, holds a session and runs a job in it from the submit form, watches the
session's countdown tick in the page, submits a preemptible job that checkpoints and sees its
checkpoints, and ends the session. Every page runs its scripts under the dashboard's Content Security
Policy with no error (tests/browser/test_dashboard_browser.py has the first-use scenario).

The test cloud runs 2,000 cluster seconds per wall second, so the session asks for a day (43 s of wall
time), and what it checks happens well within it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.test_dashboard_browser import DESKTOP, Watch, poll, shot, sign_in
from tests.browser.test_dashboard_browser import browser as browser  # the fixture, shared
from tests.support import onnx_files
from tests.support.cloud import RunningCloud

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

DAY = "86400"


def test_models_sessions_and_checkpoints_in_the_browser(
    cloud: RunningCloud, browser: Any, tmp_path: Any
) -> None:
    url = cloud.url
    watch = Watch()
    _, key = cloud.create_tenant("workbench")
    page = watch.attach(browser.new_context(viewport=DESKTOP)).new_page()
    sign_in(page, url, key)

    # An own model: uploaded from a file, described on its page.
    onnx = tmp_path / "mlp.onnx"
    onnx.write_bytes(onnx_files.mlp(hidden=256, layers=3))
    page.goto(f"{url}/models")
    page.get_by_label("ONNX file").set_input_files(str(onnx))
    page.get_by_label("Name").fill("my-mlp")
    page.get_by_role("button", name="Upload").click()
    page.wait_for_url(re.compile(r"/models/"))
    assert "my-mlp" in page.inner_text("main") and "parameters" in page.inner_text("main").lower()
    shot(page, "21-own-model")

    # A session, started from its form; its page counts down in the page once active.
    page.goto(f"{url}/sessions")
    page.get_by_label("IPUs").fill("4")
    page.get_by_label("Maximum duration (s)").fill(DAY)
    page.get_by_label("Idle timeout (s)").fill(DAY)
    page.get_by_label("Name").fill("notebook")
    page.get_by_role("button", name="Start").click()
    page.wait_for_url(re.compile(r"/sessions/ses_"))
    session_url = page.url

    def active() -> bool:
        page.goto(session_url)
        return page.locator("#session-state").inner_text() == "active"

    poll(active, 30)
    countdown = page.locator(".countdown").first
    before = countdown.inner_text()
    poll(lambda: countdown.inner_text() != before, 5)  # session.js ticks it, no reload
    shot(page, "22-session-active")

    # A job in the session from the submit form, reached from the session's page.
    page.get_by_role("link", name="submit one here").click()
    assert page.get_by_label("Run in session").input_value() == session_url.rsplit("/", 1)[1]
    page.get_by_label("Workload").select_option("resnet50")
    page.get_by_label("Steps").fill("20")
    page.get_by_label("IPUs").select_option("4")
    page.get_by_label("Job name").fill("in-notebook")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/job_"))
    page.locator("#job-state", has_text="succeeded").wait_for(timeout=60_000)
    page.goto(session_url)
    assert "in-notebook" in page.inner_text("main")

    # A preemptible job that checkpoints: the form's checkbox and interval, its checkpoints listed.
    page.goto(f"{url}/jobs/new")
    page.get_by_label("Workload").select_option("resnet50")
    page.get_by_label("Steps").fill("60000")
    page.get_by_label("IPUs").select_option("4")
    page.get_by_label("Checkpoint every (seconds)").fill("600")
    page.get_by_label("Preemptible: the plan").check()
    page.get_by_label("Job name").fill("spot-r50")
    expect(page.locator("#estimate .verdict.good")).to_contain_text("Fits on 4 IPUs", timeout=10_000)
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/job_"))
    job_url = page.url
    page.locator("#job-state", has_text="succeeded").wait_for(timeout=90_000)
    page.goto(job_url)
    main = page.inner_text("main")
    assert "Checkpoints" in main and "discounted" in main, main
    assert page.locator("#checkpoints-h").is_visible()
    shot(page, "23-job-checkpoints")

    # The session ends by its button.
    page.goto(session_url)
    page.get_by_role("button", name=re.compile("^End session")).click()
    page.wait_for_load_state()
    page.goto(session_url)
    assert page.locator("#session-state").inner_text() == "ended"

    assert watch.problems == [], watch.problems
