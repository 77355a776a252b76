"""The dashboard in Debian's Chromium (Playwright), against a cloud in real processes.

One scenario, the way people use it: someone applies for a trial, an admin approves it, the new
tenant signs in on a phone-sized screen, submits a job from the form with a live estimate, watches
it run live, and sees its usage go up; the admin sees the job's partition on the fleet map while it
runs; a second tenant never sees the first one's job. Every page is saved as a screenshot under
test-artifacts/screenshots/. Costs about 40 s: one cloud, one job of ~10 s, a few dozen pages.

With IPUCLOUD_UPDATE_DOCS_IMAGES=1 it also refreshes docs/img/dashboard.png and docs/img/fleet-map.png.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.cloud import RunningCloud
from tests.support.services import unavailable

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1366, "height": 900}
# About 20,000 cluster seconds: ~10 s of wall time at the test cloud's time scale of 2000.
LONG_STEPS = "120000"


@pytest.fixture
def browser() -> Iterator[Any]:
    if shutil.which("chromium") is None and not Path(CHROMIUM).exists():
        unavailable("Debian's chromium is not installed (bin/install-browser installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Watch:
    """Collects what a page must never do: script errors and Content-Security-Policy violations."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def attach(self, context: Any) -> Any:
        context.on("console", self._console)
        context.on("weberror", lambda e: self.problems.append(f"page error: {e.error}"))
        return context

    def _console(self, message: Any) -> None:
        text = message.text
        if message.type == "error" and ("Content Security Policy" in text or "Uncaught" in text):
            self.problems.append(text)


def shot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def fits_the_screen(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


def poll(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(f"{url}/login")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def test_trial_to_a_finished_job_in_the_browser(cloud: RunningCloud, browser: Any) -> None:
    url = cloud.url
    watch = Watch()
    # The rest of the fleet: another tenant's reservation, a draining and a failed machine.
    globex, _ = cloud.create_tenant("globex")
    with cloud.admin() as api:
        made = api.post(
            "/api/v1/admin/partitions", json={"id": "globex-reserved", "size": 16, "tenant": globex}
        )
        assert made.status_code == 201, made.text
        assert api.post("/api/v1/admin/machines/pod0001-m14/drain", json={"reason": "firmware"}).is_success
        assert api.post("/api/v1/admin/machines/pod0001-m15/fail", json={"reason": "PSU"}).is_success

    # Someone applies for a trial (desktop), without a key.
    applicant = watch.attach(browser.new_context(viewport=DESKTOP)).new_page()
    applicant.goto(f"{url}/")
    applicant.keyboard.press("Tab")
    assert applicant.evaluate("document.activeElement.className") == "skip", "the skip link comes first"
    applicant.keyboard.press("Enter")
    assert applicant.evaluate("document.activeElement.id") == "main", "and it moves focus to the content"
    shot(applicant, "01-landing")
    applicant.get_by_role("link", name="Apply for a free trial").first.click()
    applicant.get_by_label("Your name").fill("Ada Lovelace")
    applicant.get_by_label("E-mail").fill("ada@example.org")
    applicant.get_by_label("Organisation").fill("Analytical Engines")
    applicant.get_by_label("An individual developer").check()
    applicant.get_by_label("What do you want to run?").fill("ResNet-50 training on my own images.")
    shot(applicant, "02-trial-form")
    applicant.get_by_role("button", name="Apply").click()
    assert "received" in applicant.get_by_role("status").inner_text()
    shot(applicant, "03-trial-received")

    # The admin approves it, handing the key over (no mail server here); the new key is shown once.
    admin = watch.attach(browser.new_context(viewport=DESKTOP)).new_page()
    admin.goto(f"{url}/login")
    shot(admin, "04-login")
    sign_in(admin, url, cloud.admin_key)
    assert admin.url.endswith("/admin/fleet")
    admin.get_by_role("link", name="Trials").click()
    assert "ResNet-50 training on my own images." in admin.inner_text("main")
    shot(admin, "05-admin-trials")
    admin.get_by_label("Show me the key to hand over").first.check()
    admin.get_by_role("button", name="Approve Ada Lovelace").click()
    new_key = admin.get_by_label(re.compile("API key for")).input_value()
    assert new_key.startswith("ipuc_")
    shot(admin, "06-admin-key-once")

    # The new tenant signs in on a phone and submits a job from the form.
    tenant_context = watch.attach(browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True))
    tenant = tenant_context.new_page()
    sign_in(tenant, url, new_key)
    assert "100.000" in tenant.inner_text("main") and "IPU-hours left" in tenant.inner_text("main")
    assert fits_the_screen(tenant)
    shot(tenant, "07-tenant-home-new")
    tenant.get_by_role("link", name="Submit a job").first.click()
    tenant.get_by_label("Workload").select_option("resnet50")
    tenant.get_by_label("Steps").fill(LONG_STEPS)
    tenant.get_by_label("IPUs").select_option("4")
    tenant.get_by_label("Job name").fill("r50-demo")
    estimate = tenant.locator("#estimate")
    # The live estimate, fetched as the form changes (no button pressed).
    expect(estimate.locator(".verdict.good")).to_contain_text("Fits on 4 IPUs", timeout=10_000)
    assert "starts at once" in estimate.inner_text()
    assert "of 100.000 left" in estimate.inner_text()
    assert fits_the_screen(tenant)
    shot(tenant, "08-submit-live-estimate")
    tenant.get_by_role("button", name="Submit job").click()
    tenant.wait_for_url(re.compile(r"/jobs/job_"))
    job_url = tenant.url
    tenant.evaluate("window.__sameDocument = true")

    # It runs: the page follows it live over server-sent events, without reloading.
    tenant.locator("#job-state", has_text="running").wait_for(timeout=60_000)
    first = float(tenant.locator("#job-progress").get_attribute("value") or 0)
    # (Polled from here: Playwright's wait_for_function evaluates strings, which this page's CSP forbids.)
    poll(lambda: float(tenant.locator("#job-progress").get_attribute("value") or 0) > first + 5, 30)

    assert tenant.evaluate("window.__sameDocument === true"), "updated live, not by reloading"
    assert "samples/s" in tenant.locator("#throughput").inner_text()
    assert not tenant.locator("#waiting").is_visible(), "a running job no longer says why it waits"
    assert tenant.locator("#log li").count() > 2
    # Where it runs and what it has cost so far, also without reloading.
    poll(lambda: float(tenant.locator("#ipu-hours").inner_text().replace(",", "")) > 0, 30)
    assert tenant.locator("#partition").inner_text().startswith("p_")
    assert tenant.locator("#job-machine").inner_text() == "m2000"
    assert tenant.locator("#attempts").inner_text() == "1"
    live_timeline = tenant.locator("#timeline").inner_text()
    for entry in ("queued", "placed on partition p_", "running"):
        assert entry in live_timeline, live_timeline
    shot(tenant, "09-job-running-live")

    # Meanwhile the admin sees its partition on the fleet map, next to the rest of the fleet's state.
    admin.get_by_role("link", name="Fleet").click()
    entry = admin.locator(".legend li", has_text="Ada Lovelace")
    assert "job" in entry.inner_text() and "4 IPUs" in entry.inner_text()
    letter = entry.get_attribute("data-letter")
    letters = admin.locator("svg.fleet-map text", has_text=re.compile(f"^{letter}$"))
    assert letters.count() == 4, "the job's 4 IPUs carry its partition's letter"
    assert admin.locator(".legend li", has_text="globex-reserved").get_attribute("data-letter") != letter
    assert admin.locator("svg.fleet-map a.machine-failed").count() == 1
    assert admin.locator("svg.fleet-map a.machine-draining").count() == 1
    admin_map = shot(admin, "10-admin-fleet-map-job-running")
    machine = admin.locator("svg.fleet-map a").first
    machine.focus()
    admin.keyboard.press("Enter")
    admin.wait_for_url(re.compile(r"machine=pod0000-m00"))
    assert "Machine pod0000-m00" in admin.inner_text("#machine")

    # It ends: the page shows the final figures; the home page shows the usage.
    tenant.locator("#job-state", has_text="succeeded").wait_for(timeout=90_000)
    tenant.wait_for_load_state()
    tenant.get_by_text("The job has ended.").wait_for(timeout=15_000)
    assert tenant.locator("#job-progress").get_attribute("value") == "100"
    timeline = tenant.locator("#timeline").inner_text()
    assert "queued" in timeline and "running" in timeline and "succeeded" in timeline
    shot(tenant, "11-job-succeeded")
    tenant.get_by_role("link", name="Home").click()
    main = tenant.inner_text("main")
    used = re.search(r"([0-9.]+) used of 100\.000", main)
    assert used and float(used.group(1)) > 1.0, main
    assert tenant.locator("svg.chart rect").count() >= 1, "today's bar in the usage chart"
    assert "r50-demo" in tenant.inner_text("main")
    assert fits_the_screen(tenant)
    shot(tenant, "12-tenant-home-after")

    # A second tenant sees none of it.
    _, other_key = cloud.create_tenant("someone-else", plan="trial")
    other = watch.attach(browser.new_context(viewport=DESKTOP)).new_page()
    sign_in(other, url, other_key)
    other.get_by_role("link", name="Jobs").click()
    assert "r50-demo" not in other.content() and "No jobs yet" in other.inner_text("main")
    response = other.goto(job_url)
    assert response is not None and response.status == 404
    assert "r50-demo" not in other.content()
    shot(other, "13-other-tenant-404")

    # Without JavaScript the estimate still comes, from the "Preview estimate" button.
    nojs_context = watch.attach(browser.new_context(viewport=DESKTOP, java_script_enabled=False))
    nojs = nojs_context.new_page()
    sign_in(nojs, url, new_key)
    nojs.goto(f"{url}/jobs/new")
    nojs.get_by_label("Workload").select_option("bert-base")
    nojs.get_by_label("IPUs").select_option("auto")
    nojs.get_by_role("button", name="Preview estimate").click()
    assert "Fits on" in nojs.inner_text("#estimate")
    assert re.search(r"[0-9.]+ IPU-hours of [0-9.]+ left", nojs.inner_text("#estimate")), "the grant's charge"
    shot(nojs, "14-submit-preview-without-javascript")
    nojs.goto(f"{url}/")
    assert "r50-demo" in nojs.inner_text("main")
    home = shot(nojs, "16-tenant-home-desktop")

    for path in ("/admin/partitions", "/admin/tenants", "/admin/usage"):
        admin.goto(f"{url}{path}")
        shot(admin, "15-admin-" + path.rsplit("/", 1)[-1])
    assert "Ada Lovelace" in admin.inner_text("main")

    # The API reference: Swagger UI from this server (no CDN), under the dashboard's policy.
    docs = watch.attach(browser.new_context(viewport=DESKTOP)).new_page()
    elsewhere: list[str] = []
    docs.on("request", lambda r: None if r.url.startswith((url, "data:")) else elsewhere.append(r.url))
    docs.goto(f"{url}/docs")
    docs.locator(".opblock").first.wait_for(timeout=15_000)
    assert docs.locator(".opblock").count() >= 30, "every operation of the spec"
    assert elsewhere == [], f"/docs fetched from other sites: {elsewhere}"
    shot(docs, "17-api-reference")

    assert watch.problems == [], watch.problems

    if os.environ.get("IPUCLOUD_UPDATE_DOCS_IMAGES") == "1":
        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copy(home, ROOT / "docs" / "img" / "dashboard.png")
        shutil.copy(admin_map, ROOT / "docs" / "img" / "fleet-map.png")
