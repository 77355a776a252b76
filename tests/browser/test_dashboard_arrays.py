"""The dashboard's array pages over HTTP: a sweep run by the scheduler and an agent shows in the list,
its page has a cell per element coloured by state, its progress, a results table sortable by any
column (and as CSV), a plot of throughput against the swept parameter, and "retry failed"; forged
forms, bad sort keys and another tenant change nothing and see nothing."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from scheduler.loop import SchedulerLoop
from scheduler.models import Attempt, AttemptState, Job
from scheduler.services.batch import attempts
from scheduler.services.batch.attempts import Finish
from scheduler.settings import get_settings
from tests.browser.test_dashboard_http import csrf_of, make_tenant, sign_in
from tests.scheduler.test_lifecycle import FakeCelery
from tests.support import agentkit
from tests.support.services import Seeded

SWEEP = {
    "name": "bs-grid",
    "workload": {"model": "resnet50", "task": "train", "steps": 50},
    "ipus": 1,
    "machine": "m2000",
    "sweep": {
        "method": "grid",
        "parameters": {"workload.batch_size": {"values": [16, 64, 256]}, "ipus": {"values": [1, 2]}},
    },
}
FAIL = {1, 4}  # these indices fail


def run_sweep(db: Any, array_id: str) -> None:
    """The scheduler places every element; an agent runs each for its predicted run time and ends
    it, failing those of FAIL."""
    loop = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    assert loop.lead()
    loop.schedule_pass()
    loop.dispatch()
    with db.read() as s:
        live = s.execute(
            select(Attempt.id, Job.array_index, Job.predicted_runtime_s)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.array_id == array_id, Attempt.state == "placed")
        ).all()
    assert len(live) == 6
    for attempt_id, index, runtime in live:
        assert agentkit.take(db, attempt_id) is not None
        if index in FAIL:  # failed half-way, its last progress not reported (the timeline's is shown)
            assert agentkit.finish(db, attempt_id, AttemptState.FAILED, runtime / 2, "exit 1")
            continue
        with db.read() as s:
            progress = attempts.progress_at(s.get(Attempt, attempt_id), runtime)  # as an agent reports it
        done = agentkit.tick(
            db, finishes=[Finish(attempt_id, AttemptState.SUCCEEDED, runtime, None, progress)]
        )
        assert attempt_id in done.finished


def cells(page: str) -> dict[int, str]:
    return {
        int(i): state
        for state, i in re.findall(r'class="cell cell-(\w+)" href="/jobs/\w+" title="(\d+): ', page)
    }


def table_indices(page: str) -> list[int]:
    body = page.split('<table class="results">', 1)[1]
    return [int(i) for i in re.findall(r'<th scope="row"><a href="/jobs/\w+">(\d+)</a></th>', body)]


def test_an_arrays_page_shows_its_elements_results_and_plot_and_retries_the_failed(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    tenant, key = make_tenant(db, "acme", plan="standard", quota=1000)
    _, other_key = make_tenant(db, "rival", plan="standard", quota=1000)
    made = client.post("/api/v1/jobs", json=SWEEP, headers={"Authorization": f"Bearer {key}"})
    assert made.status_code == 202, made.text
    array_id = made.json()["id"]
    assert sign_in(client, key).status_code == 303
    assert 'href="/arrays"' in client.get("/").text  # in the tenant's nav

    page = client.get(f"/arrays/{array_id}").text
    assert set(cells(page).values()) == {"queued"} and len(cells(page)) == 6
    assert "No element has run yet" in page and "Retry failed" not in page

    run_sweep(db, array_id)
    listed = client.get("/arrays").text
    assert f'href="/arrays/{array_id}"' in listed and "bs-grid" in listed and "failed" in listed

    page = client.get(f"/arrays/{array_id}").text
    assert cells(page) == {i: "failed" if i in FAIL else "succeeded" for i in range(6)}
    assert 'value="100.0"' in page and "100% ended" in page
    assert "Retry failed (2)" in page
    # The plot: throughput against the batch size, a series per IPU count, drawn on the server.
    assert '<svg class="chart"' in page, page.split("plot-h", 1)[1][:2000]
    chart = page.split('<svg class="chart"', 1)[1].split("</svg>", 1)[0]
    assert "throughput against workload.batch_size" in chart and "ipus=1" in chart and "ipus=2" in chart
    # Only elements that ran report a throughput: the failed ones stopped half-way, still compiling.
    assert chart.count("<circle") == 4 and "<script" not in chart

    # The results: sorted by index by default; by throughput, high first; by a parameter.
    assert table_indices(page) == list(range(6))
    with db.read() as s:
        jobs = {j.array_index: j for j in s.execute(select(Job).where(Job.array_id == array_id)).scalars()}
    rows = list(csv.DictReader(io.StringIO(client.get(f"/arrays/{array_id}/results.csv").text)))
    assert [int(r["index"]) for r in rows] == list(range(6))
    assert list(rows[0]) == [
        "index",
        "job_id",
        "state",
        "workload.batch_size",
        "ipus",
        "run_s",
        "throughput",
        "ipu_hours",
    ]
    for r in rows:
        job = jobs[int(r["index"])]
        assert r["job_id"] == job.id and r["state"] == job.state
        assert (int(r["workload.batch_size"]), int(r["ipus"])) == (
            job.params["workload.batch_size"],
            job.params["ipus"],
        )
        ran = job.predicted_runtime_s / (2 if job.array_index in FAIL else 1)
        assert float(r["run_s"]) == round(ran, 3)
        assert float(r["ipu_hours"]) > 0
        assert (r["throughput"] == "") if job.array_index in FAIL else float(r["throughput"]) > 0
    ran = [r for r in rows if r["throughput"]]
    by_throughput = sorted(ran, key=lambda r: (-float(r["throughput"]), -int(r["index"])))
    by_throughput += [r for r in rows if not r["throughput"]]  # none last, by index
    page = client.get(f"/arrays/{array_id}?sort=throughput&order=desc").text
    assert table_indices(page) == [int(r["index"]) for r in by_throughput]
    assert "sort=throughput&amp;order=asc" in page  # its header now sorts the other way
    page = client.get(f"/arrays/{array_id}?sort=param:ipus&order=asc").text
    assert table_indices(page) == [0, 2, 4, 1, 3, 5]
    page = client.get(f"/arrays/{array_id}?x=ipus").text
    assert "throughput against ipus" in page
    for bad in ("sort=nope", "sort=param:workload.nope", "order=up", "x=workload.steps", "sort=a%3Cb"):
        r = client.get(f"/arrays/{array_id}?{bad}")
        assert r.status_code == 422, (bad, r.status_code)

    # Retry failed: forged or cross-site forms change nothing; the real one queues the two again.
    csrf = csrf_of(client, f"/arrays/{array_id}")
    assert client.post(f"/arrays/{array_id}/retry", data={"csrf": "forged"}).status_code == 403
    cross = client.post(
        f"/arrays/{array_id}/retry", data={"csrf": csrf}, headers={"Origin": "https://evil.example"}
    )
    assert cross.status_code == 403
    with db.read() as s:
        assert {j.state for j in s.execute(select(Job).where(Job.array_id == array_id)).scalars()} == {
            "succeeded",
            "failed",
        }
    r = client.post(f"/arrays/{array_id}/retry", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/arrays/{array_id}"
    page = client.get(f"/arrays/{array_id}").text
    assert "2 failed or cancelled element(s)" in page and "Retry failed" not in page
    assert cells(page) == {i: "queued" if i in FAIL else "succeeded" for i in range(6)}
    again = client.post(f"/arrays/{array_id}/retry", data={"csrf": csrf})
    assert again.status_code == 409 and "form-error" in again.text

    # Another tenant sees none of it and cannot retry it.
    client.cookies.clear()
    assert sign_in(client, other_key).status_code == 303
    assert array_id not in client.get("/arrays").text
    for path in (f"/arrays/{array_id}", f"/arrays/{array_id}/results.csv"):
        assert client.get(path).status_code == 404, path
    other_csrf = csrf_of(client, "/arrays")
    assert client.post(f"/arrays/{array_id}/retry", data={"csrf": other_csrf}).status_code == 404
    del tenant
