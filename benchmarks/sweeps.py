"""A 10,000-element job array on 16 POD64s: its submission through the API, the scheduler's pass with it
queued, and the job list's latency while it runs (docs/sweeps.md).

    .venv/bin/python benchmarks/sweeps.py [--database-url URL] [--size N] [--pods N] [--max-running N]

It creates a scratch database next to the one named (PostgreSQL by default), migrates it, seeds the plans,
the fleet and a tenant on the `internal` plan, and drives the API in-process (FastAPI's TestClient, the
real app and middleware, Redis at 127.0.0.1:6379/15 for its rate limits):

1. `POST /api/v1/jobs` with `array: {"indices": "0-9999"}`: validation, admission of every element, the
   bulk inserts and the one guarded reservation, and the commit, as the client waits for them;
2. `SchedulerLoop.schedule_pass`, its Celery sends counted rather than sent (as benchmarks/live_loop.py
   does): the first pass, which places as many elements as fit, then passes
   with the rest queued and the fleet full;
   `POST /api/v1/estimates` for the same array is timed on the idle fleet and again after these passes;
3. after an agent took the placed elements (running), `GET /api/v1/jobs` (the first page, queued
   elements folded) and `GET /api/v1/jobs?expand=true`, each timed `--requests` times: p50 and p99.

The scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import func, select  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from api.app import create_app  # noqa: E402
from benchmarks.live_loop import NullCelery, _Router, scratch_database  # noqa: E402
from scheduler import runtime as runtime_module  # noqa: E402
from scheduler.loop import SchedulerLoop  # noqa: E402
from scheduler.models import Attempt, AttemptState, Job  # noqa: E402
from scheduler.services.batch import attempts  # noqa: E402
from scheduler.services.capacity import fleet  # noqa: E402
from scheduler.services.tenancy import tenants  # noqa: E402
from scheduler.settings import Settings  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/sweeps.py"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _timed_estimate(client: TestClient, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """`POST /api/v1/estimates` for the array: its time and what its totals say."""
    started = time.perf_counter()
    r = client.post("/api/v1/estimates", json=body, headers=headers)
    took = time.perf_counter() - started
    assert r.status_code == 200, r.text
    answer = r.json()
    forecast = sum(1 for e in answer["elements"] if e["expected_wait_s"] is not None)
    return {"s": took, "totals": answer["totals"], "rows": len(answer["elements"]), "forecast_rows": forecast}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--pods", type=int, default=16)
    parser.add_argument("--size", type=int, default=10_000, help="elements of the array")
    parser.add_argument("--max-running", type=int, default=None, help="the array's max_running")
    parser.add_argument("--passes", type=int, default=5, help="passes timed with the fleet full")
    parser.add_argument("--requests", type=int, default=200, help="job-list requests timed")
    args = parser.parse_args()

    db_url, drop = scratch_database(args.database_url)
    out: dict[str, Any] = {}
    try:
        settings = Settings(
            mode="production",
            database_url=db_url,
            redis_url="redis://127.0.0.1:6379/15",
            secret_key="benchmark-secret-benchmark-secret",
            rate_limit="1000000/minute",
            log_level="WARNING",
        )
        runtime = runtime_module.Runtime.from_settings(settings)
        runtime_module.install(runtime)
        db = runtime.db
        with db.write() as s:
            tenants.seed_plans(session=s)
            fleet.seed_fleet(session=s, pods=args.pods)
            created = tenants.create_tenant(
                session=s, secret=settings.secret(), name="bench", plan="internal", quota_ipu_hours=1e9
            )
        key = created.api_key
        headers = {"Authorization": f"Bearer {key}"}
        body: dict[str, Any] = {
            "name": "sweep",
            "workload": {"model": "resnet50", "task": "train", "batch_size": 64, "steps": 100},
            "ipus": 1,
            "array": {"indices": f"0-{args.size - 1}"},
        }
        if args.max_running:
            body["array"]["max_running"] = args.max_running
        app = create_app(runtime=runtime)
        with TestClient(app, raise_server_exceptions=True) as client:
            client.get("/api/v1/jobs", headers=headers)  # warm: imports, caches, the key
            estimate = {k: v for k, v in body.items() if k != "name"}
            out["estimate_idle"] = _timed_estimate(client, estimate, headers)
            started = time.perf_counter()
            r = client.post("/api/v1/jobs", json=body, headers=headers)
            out["submit_s"] = time.perf_counter() - started
            assert r.status_code == 202, r.text
            array_id = r.json()["id"]

            loop = SchedulerLoop(settings=settings, db=db, celery=NullCelery(), router=_Router())  # type: ignore[arg-type]
            assert loop.lead()
            started = time.perf_counter()
            out["placed"] = loop.schedule_pass()
            out["first_pass_s"] = time.perf_counter() - started
            full = []
            for _ in range(args.passes):
                assert loop.lead()
                started = time.perf_counter()
                loop.schedule_pass()
                full.append(time.perf_counter() - started)
            out["full_passes_s"] = full
            # The same array asked about again, with the first one queued behind a full fleet.
            out["estimate_full"] = _timed_estimate(client, estimate, headers)

            # An agent takes every placed element: they run while the list is read.
            with db.write() as s:
                agent, _ = attempts.register_agent(
                    session=s,
                    name="bench",
                    host="bench",
                    pid=0,
                    queues=["ipucloud"],
                    lease_s=3600,
                    max_attempts=3,
                )
            with db.read() as s:
                placed = list(
                    s.execute(
                        select(Attempt.id, Attempt.epoch).where(Attempt.state == AttemptState.PLACED)
                    ).tuples()
                )
            for chunk in range(0, len(placed), 200):
                with db.write() as s:
                    attempts.take_many(
                        session=s,
                        agent=agent,
                        deliveries=placed[chunk : chunk + 200],
                        lease_s=3600,
                        time_scale=1.0,
                    )
            with db.read() as s:
                out["running"] = s.execute(
                    select(func.count())
                    .select_from(Job)
                    .where(Job.array_id == array_id, Job.state == "running")
                ).scalar_one()
            for label, url in (("folded", "/api/v1/jobs"), ("expanded", "/api/v1/jobs?expand=true")):
                times = []
                for _ in range(args.requests):
                    started = time.perf_counter()
                    r = client.get(url, headers=headers)
                    times.append(time.perf_counter() - started)
                    assert r.status_code == 200, r.text
                out[label] = times
                out[label + "_rows"] = len(r.json()["items"])
            arr = client.get(f"/api/v1/arrays/{array_id}", headers=headers).json()
            times = []
            for _ in range(max(20, args.requests // 10)):
                started = time.perf_counter()
                client.get(f"/api/v1/arrays/{array_id}", headers=headers)
                times.append(time.perf_counter() - started)
            out["array_get"] = times
        runtime_module.close_current()
        runtime.close()
    finally:
        drop()

    kind = make_url(db_url).get_backend_name()
    ms = 1000.0
    print(
        f"database: {kind}; fleet: {args.pods} POD64 ({args.pods * 64} IPUs); "
        f"array of {args.size:,} 1-IPU jobs"
        + (f", max_running {args.max_running}" if args.max_running else "")
    )
    print(
        f"submission (POST /api/v1/jobs, through the commit): {out['submit_s']:.2f} s "
        f"({out['submit_s'] / args.size * 1e6:.0f} us per element)"
    )
    print(f"first scheduler pass: placed {out['placed']:,} elements in {out['first_pass_s']:.3f} s")
    print(
        f"passes with {args.size - out['placed']:,} elements queued and the fleet full: "
        f"median {statistics.median(out['full_passes_s']):.3f} s, max {max(out['full_passes_s']):.3f} s"
    )
    print(f"array state: {arr['state']}, elements {arr['elements_by_state']}; {out['running']:,} running")
    for label in ("folded", "expanded"):
        t = out[label]
        print(
            f"GET /api/v1/jobs ({label}, {out[label + '_rows']} rows) x{len(t)}: "
            f"p50 {percentile(t, 0.5) * ms:.1f} ms, "
            f"p99 {percentile(t, 0.99) * ms:.1f} ms"
        )
    for label, what in (("estimate_idle", "an idle fleet"), ("estimate_full", "the first array queued")):
        e = out[label]
        end, first = e["totals"]["expected_end_s"], e["totals"]["expected_wait_s"]
        print(
            f"POST /api/v1/estimates for the array, {what}: {e['s']:.2f} s; "
            f"{e['totals']['elements']:,} elements, {e['totals']['charged_ipu_hours']:.1f} IPU-hours, "
            "first starts in "
            + ("(beyond the forecast)" if first is None else f"{first:,.0f} s")
            + ", last ends in "
            + ("(beyond the forecast)" if end is None else f"{end:,.0f} s")
            + f"; {e['forecast_rows']} of {e['rows']} rows forecast"
        )
    t = out["array_get"]
    print(
        f"GET /api/v1/arrays/{{id}} x{len(t)}: p50 {percentile(t, 0.5) * ms:.1f} ms, "
        f"p99 {percentile(t, 0.99) * ms:.1f} ms"
    )
    print(
        f"reproduce: {COMMAND} --database-url {args.database_url} --pods {args.pods} --size {args.size}"
        + (f" --max-running {args.max_running}" if args.max_running else "")
    )


if __name__ == "__main__":
    main()
