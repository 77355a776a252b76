"""An array's page in Debian's Chromium (Playwright), against a cloud in real processes: a sweep of four
batch sizes, one at a time, its last element cancelled; the page shows a cell per element by state,
the throughput plot, a results table re-sorted by clicking its header, the CSV link, and "retry
failed" queues the cancelled element again, which then runs. No script error or CSP violation."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ipucloud.sdk import Client
from tests.browser.test_dashboard_browser import DESKTOP, Watch, poll, shot, sign_in
from tests.browser.test_dashboard_browser import browser as browser  # the fixture, shared
from tests.support.cloud import RunningCloud

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def test_an_arrays_page_in_the_browser(cloud: RunningCloud, browser: Any) -> None:
    url = cloud.url
    _, key = cloud.create_tenant("sweeper")
    with Client(url, key) as c:
        sweep = c.submit_array(
            name="bs-sweep",
            model="resnet50",
            steps=200,
            ipus=1,
            machine="m2000",
            array={"max_running": 1},
            sweep={"method": "grid", "parameters": {"workload.batch_size": {"values": [16, 64, 256, 1024]}}},
        )
        c.cancel_array(sweep.id, indices="3")
        ids = {e.array_index: e.id for e in c.iter_array_jobs(sweep.id)}
    final = cloud.wait_jobs(key, [ids[0], ids[1], ids[2]], timeout=180)
    assert {j["state"] for j in final.values()} == {"succeeded"}

    watch = Watch()
    page = watch.attach(browser.new_context(viewport=DESKTOP)).new_page()
    sign_in(page, url, key)
    page.get_by_role("link", name="Arrays").click()
    page.get_by_role("link", name="bs-sweep").click()
    page.wait_for_url(re.compile(r"/arrays/arr_"))
    array_url = page.url.split("?")[0]
    assert page.locator(".grid .cell-succeeded").count() == 3
    assert page.locator(".grid .cell-cancelled").count() == 1
    assert page.locator("svg.chart circle").count() == 3  # the three that ran
    assert "75% ended" not in page.inner_text("main") and "100% ended" in page.inner_text("main")
    assert page.get_by_role("link", name="Download every element as CSV").get_attribute("href") == (
        f"/arrays/{sweep.id}/results.csv"
    )
    shot(page, "31-array")

    # Sorting by throughput, high first: a click on the header twice.
    header = page.locator("table.results thead a", has_text="Samples/s")
    header.click()
    page.wait_for_url(re.compile(r"sort=throughput&order=asc"))
    header.click()
    page.wait_for_url(re.compile(r"sort=throughput&order=desc"))
    rows = page.locator("table.results tbody tr")
    speeds = []
    for i in range(rows.count()):
        text = rows.nth(i).locator("td").nth(3).inner_text().replace(",", "")
        speeds.append(None if text == "–" else float(text))
    ran = [s for s in speeds if s is not None]
    assert ran == sorted(ran, reverse=True) and len(ran) == 3 and speeds[-1] is None

    # Retry failed: the cancelled element is queued again and runs.
    page.get_by_role("button", name=re.compile("^Retry the failed elements")).click()
    page.wait_for_url(array_url)
    assert "queued again" in page.inner_text("main")

    def all_succeeded() -> bool:
        page.goto(array_url)
        return page.locator(".grid .cell-succeeded").count() == 4

    poll(all_succeeded, 120)
    assert page.locator("svg.chart circle").count() == 4
    shot(page, "32-array-retried")
    assert watch.problems == [], watch.problems
