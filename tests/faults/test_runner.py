"""The worker's side of the lease, in process: self-fencing, hand-back, hints, the fault switch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from scheduler.models import Attempt, AttemptState, Job, JobEvent, Tenant
from scheduler.settings import get_settings, reset_settings_cache
from tests.faults.checker import check_cloud
from tests.faults.harness import attempt_of, leader_loop, make_tenant, place, submit
from workers import runner


@pytest.fixture
def tenant(db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    # 100 cluster seconds per (fake) wall second: a job of some 700 cluster seconds beats ~7 times.
    monkeypatch.setenv("IPUCLOUD_TIME_SCALE", "100")
    monkeypatch.setenv("IPUCLOUD_HEARTBEAT_S", "1")
    monkeypatch.setenv("IPUCLOUD_LEASE_S", "5")
    monkeypatch.setenv("IPUCLOUD_WORKER_GRACE_S", "2")
    reset_settings_cache()
    return make_tenant(db)


class FakeTime:
    """The worker's clock and sleep, so a run of minutes takes milliseconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class Outage:
    """The database as the worker sees it: writes fail while `down` (reads still work)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.down = False
        self.refused = 0

    @contextmanager
    def write(self) -> Iterator[Any]:
        if self.down:
            self.refused += 1
            raise OperationalError("UPDATE attempts ...", {}, ConnectionRefusedError("database is down"))
        with self.db.write() as s:
            yield s

    @contextmanager
    def read(self) -> Iterator[Any]:
        with self.db.read() as s:
            yield s


def context(db: Any, t: FakeTime, stopping: Any = lambda: False) -> runner.RunContext:
    return runner.RunContext(
        settings=get_settings(),
        db=db,
        worker="test-worker",
        stopping=stopping,
        sleep=t.sleep,
        clock=t.clock,
        hint=lambda channel, message: None,
    )


def test_a_worker_that_cannot_reach_the_database_stops_when_its_lease_would_end(db: Any, tenant: str) -> None:
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=2000)
    attempt = place(db, loop, job_id)
    t = FakeTime()
    outage = Outage(db)
    ctx = context(outage, t)  # type: ignore[arg-type]
    beats = 0
    real_sleep = ctx.sleep

    def sleep(s: float) -> None:
        nonlocal beats
        beats += 1
        if beats == 3:
            outage.down = True  # the database goes away after two good heartbeats
        real_sleep(s)

    ctx.sleep = sleep
    started = t.now
    assert runner.run_attempt(ctx, attempt_id=attempt.id, epoch=0) == "fenced"
    settings = get_settings()
    # It gave up once its own estimate of the lease ran out, not later, and wrote nothing more.
    assert t.now - started <= 3 * settings.heartbeat_s + settings.lease_s + 2.1
    assert outage.refused >= 2
    a = attempt_of(db, attempt.id)
    assert a.state == AttemptState.RUNNING and a.cluster_s <= 2 * settings.heartbeat_s * settings.time_scale


def test_a_stopping_worker_hands_back_what_it_cannot_finish_in_the_grace_period(db: Any, tenant: str) -> None:
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=2000)
    attempt = place(db, loop, job_id)
    t = FakeTime()
    stop_at = t.now + 2.5
    ctx = context(db, t, stopping=lambda: t.now >= stop_at)
    assert runner.run_attempt(ctx, attempt_id=attempt.id, epoch=0) == "handed_back"
    with db.read() as s:
        a = s.get(Attempt, attempt.id)
        job = s.get(Job, job_id)
        assert a.state == AttemptState.HANDED_BACK and a.cluster_s > 0
        assert job.state == "queued" and job.reason is None
        assert s.get(Tenant, tenant).used_ipu_ms == 0, "a hand-back is never billed"
    # It does not count against the retry limit: the next attempt is number 2 of a job still queued.
    assert place(db, loop, job_id).number == 2


def test_a_stopping_worker_finishes_what_fits_in_the_grace_period(
    db: Any, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPUCLOUD_WORKER_GRACE_S", "600")
    reset_settings_cache()
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=2000)
    attempt = place(db, loop, job_id)
    t = FakeTime()
    ctx = context(db, t, stopping=lambda: True)
    assert runner.run_attempt(ctx, attempt_id=attempt.id, epoch=0) == "succeeded"
    outcome = check_cloud(db, [job_id])
    assert outcome.states == {"succeeded": 1} and outcome.attempts == {"succeeded": 1}


def test_a_paused_worker_finds_its_finish_refused(
    db: Any, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPUCLOUD_LEASE_S", "0.5")
    reset_settings_cache()
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=2000)
    attempt = place(db, loop, job_id)
    t = FakeTime()
    ctx = context(db, t)

    def paused(s: float) -> None:
        time.sleep(0.7)  # SIGSTOP: real time passes, the lease runs out on the database's clock
        t.now += 10_000  # and on resume the run looks complete

    ctx.sleep = paused
    assert runner.run_attempt(ctx, attempt_id=attempt.id, epoch=0) == "fenced"
    a = attempt_of(db, attempt.id)
    assert a.state == AttemptState.RUNNING and a.cluster_s == 0, "the late finish changed the attempt"
    with db.read() as s:
        states = [e.message for e in s.execute(select(JobEvent).where(JobEvent.job_id == job_id)).scalars()]
    assert not any(m.startswith("succeeded") for m in states)
    loop.reconcile()
    assert attempt_of(db, attempt.id).state == AttemptState.LOST


def test_hints_never_hold_up_the_worker_when_redis_hangs() -> None:
    hang = threading.Event()
    sent: list[str] = []

    def publish(channel: str, message: str) -> None:
        sent.append(message)
        hang.wait(5)

    hints = runner.Hints(publish=publish, bound=8)
    t0 = time.monotonic()
    for i in range(200):
        hints.send("ipucloud:wake", f"m{i}")
    assert time.monotonic() - t0 < 0.5, "a hanging broker held up the caller"
    hang.set()
    deadline = time.monotonic() + 5
    while not hints._queue.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert sent[0] == "m0" and 2 <= len(sent) <= 9, "the backlog is bounded, the rest dropped"


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_crash_switch_kills_only_matching_jobs_and_only_when_set() -> None:
    code = "from workers.faults import crash_if_injected; crash_if_injected({name!r}, 7); print('alive')"
    on = {"IPUCLOUD_FAULT_CRASH_JOBS": "crash-me-*"}
    crashed = _python(code.format(name="crash-me-3"), on)
    assert crashed.returncode == 70 and "alive" not in crashed.stdout
    assert _python(code.format(name="innocent"), on).stdout.strip() == "alive"
    unset = {k: v for k, v in os.environ.items() if k != "IPUCLOUD_FAULT_CRASH_JOBS"}
    assert (
        subprocess.run(
            [sys.executable, "-c", code.format(name="crash-me-3")], env=unset, capture_output=True, text=True
        ).stdout.strip()
        == "alive"
    )


def test_sigterm_in_a_pool_process_kills_it_when_idle_and_hands_back_when_busy() -> None:
    idle = _python(
        """
        import os, signal, time
        from workers import runner
        runner.install_sigterm_handler()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("survived")
        """,
        {},
    )
    assert idle.returncode == -15 and "survived" not in idle.stdout
    busy = _python(
        """
        import os, signal, time
        from workers import runner
        runner.install_sigterm_handler()
        runner._busy.set()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        print("refusing" if runner.refusing_work() else "taking")
        """,
        {"IPUCLOUD_WORKER_GRACE_S": "0", "IPUCLOUD_LEASE_S": "30"},
    )
    assert busy.returncode == 0 and busy.stdout.strip() == "refusing", busy.stderr
    backstop = _python(
        """
        import os, signal, time
        from workers import runner
        runner.install_sigterm_handler()
        runner._busy.set()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        print("outlived the grace period")
        """,
        {"IPUCLOUD_WORKER_GRACE_S": "0.2", "IPUCLOUD_LEASE_S": "0.3"},
    )
    assert backstop.returncode == runner.TERMINATED_EXIT_CODE and not backstop.stdout
