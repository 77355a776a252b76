"""The host agent's side of the lease, in process on a clock of the test's own: self-fencing,
hand-back, many attempts per tick, hints, the fault switch.

The agent is the real one (workers/agent.py) driven turn by turn (`Agent.step`), against the real
test database; only its clock is the test's, so a run of minutes takes milliseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError

from scheduler.models import Attempt, AttemptState, Job, JobEvent, MeterEvent, Tenant
from scheduler.services.batch import jobs
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings, reset_settings_cache
from tests.faults.checker import check_cloud
from tests.faults.harness import attempt_of, leader_loop, make_tenant, place, submit
from workers.agent import Agent, Hints


@pytest.fixture
def tenant(db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    # 100 cluster seconds per (fake) wall second: a job of some 700 cluster seconds runs ~7 s.
    monkeypatch.setenv("IPUCLOUD_TIME_SCALE", "100")
    monkeypatch.setenv("IPUCLOUD_HEARTBEAT_S", "1")
    monkeypatch.setenv("IPUCLOUD_LEASE_S", "5")
    monkeypatch.setenv("IPUCLOUD_WORKER_GRACE_S", "2")
    monkeypatch.setenv("IPUCLOUD_METER_INTERVAL_S", "1")
    monkeypatch.setenv("IPUCLOUD_AGENT_SYNC_S", "600")
    reset_settings_cache()
    return make_tenant(db)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Outage:
    """The database as the agent sees it: writes fail while `down` (reads still work)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.down = False
        self.refused = 0

    @contextmanager
    def write(self) -> Iterator[Any]:
        if self.down:
            self.refused += 1
            raise OperationalError("UPDATE agents ...", {}, ConnectionRefusedError("database is down"))
        with self.db.write() as s:
            yield s

    @contextmanager
    def read(self) -> Iterator[Any]:
        with self.db.read() as s:
            yield s


class NoRedis:
    """Hints go nowhere: these tests look at the database only."""

    def pipeline(self, transaction: bool = False) -> Any:
        return self

    def publish(self, channel: str, message: str) -> None:
        pass

    def execute(self) -> None:
        pass


def make_agent(db: Any, clock: FakeClock, name: str = "agent-under-test") -> Agent:
    agent = Agent(
        settings=get_settings(),
        db=db,
        name=name,
        queues=["ipucloud"],
        clock=clock,
        hints=Hints(lambda: NoRedis()),  # type: ignore[arg-type,return-value]
    )
    assert agent.step() and agent.lease is not None, "the agent did not register"
    return agent


def run_for(agent: Agent, clock: FakeClock, seconds: float, every: float = 0.25) -> None:
    end = clock.now + seconds
    while clock.now < end:
        clock.now += every
        if not agent.step():
            return


def take(agent: Agent, attempt_ids: list[int]) -> None:
    deliveries = [agent.deliver(a, 0) for a in attempt_ids]
    agent.step()
    assert [d.outcome for d in deliveries] == ["taken"] * len(deliveries)


def test_an_agent_that_cannot_reach_the_database_stops_when_its_lease_would_end(db: Any, tenant: str) -> None:
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=20000)
    attempt = place(db, loop, job_id)
    clock = FakeClock()
    outage = Outage(db)
    agent = make_agent(outage, clock)
    take(agent, [attempt.id])
    run_for(agent, clock, 2.1)  # two good ticks
    settings = get_settings()
    outage.down = True
    gone_at = clock.now
    while agent.running:
        clock.now += 0.25
        agent.step()
        assert clock.now - gone_at < settings.lease_s + 2 * settings.heartbeat_s, "it outlived its lease"
    # It gave up once its own view of the lease ran out, and wrote nothing more.
    assert outage.refused >= 2 and agent.lease is None and not agent._has_writes()
    a = attempt_of(db, attempt.id)
    assert a.state == AttemptState.RUNNING and a.cluster_s <= 2.5 * settings.heartbeat_s * settings.time_scale


def test_a_stopping_agent_hands_back_what_it_cannot_finish_in_the_grace_period(db: Any, tenant: str) -> None:
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=2000)
    attempt = place(db, loop, job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [attempt.id])
    run_for(agent, clock, 2.5)
    agent.stop()
    run_for(agent, clock, 5)
    assert agent.lease is not None and not agent.running
    with db.read() as s:
        a = s.get(Attempt, attempt.id)
        job = s.get(Job, job_id)
        assert a.state == AttemptState.HANDED_BACK and a.cluster_s > 0
        assert job.state == "queued" and job.reason is None
        assert s.get(Tenant, tenant).used_ipu_ms == 0, "a hand-back is never billed"
    # It does not count against the retry limit: the next attempt is number 2 of a job still queued.
    assert place(db, loop, job_id).number == 2


def test_a_stopping_agent_finishes_what_fits_in_the_grace_period(
    db: Any, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPUCLOUD_WORKER_GRACE_S", "600")
    reset_settings_cache()
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=2000)
    attempt = place(db, loop, job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [attempt.id])
    agent.stop()
    run_for(agent, clock, 60)
    outcome = check_cloud(db, [job_id])
    assert outcome.states == {"succeeded": 1} and outcome.attempts == {"succeeded": 1}


def test_a_paused_agent_finds_its_writes_refused(
    db: Any, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPUCLOUD_LEASE_S", "0.5")
    reset_settings_cache()
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=2000)
    attempt = place(db, loop, job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [attempt.id])
    time.sleep(0.7)  # SIGSTOP: real time passes, the lease runs out on the database's clock
    clock.now += 10_000  # and on resume the run looks complete
    agent.step()
    assert not agent.running and agent.lease is None, "its tick was refused: it dropped everything"
    a = attempt_of(db, attempt.id)
    assert a.state == AttemptState.RUNNING and a.cluster_s == 0, "the late finish changed the attempt"
    agent.step()  # it registers again, and what its paused incarnation held ends with it
    assert agent.lease is not None and agent.lease.epoch == 2
    assert attempt_of(db, attempt.id).state == AttemptState.LOST
    with db.read() as s:
        states = [e.message for e in s.execute(select(JobEvent).where(JobEvent.job_id == job_id)).scalars()]
        assert s.get(Job, job_id).state == "queued"
        assert s.get(Tenant, tenant).used_ipu_ms == 0, "a lost attempt is never billed"
    assert not any(m.startswith("succeeded") for m in states)


def test_one_agent_drives_all_the_ipus_and_a_tick_costs_the_same_for_any_number(db: Any, tenant: str) -> None:
    """The write load follows the hosts, not the running jobs: one tick that bills every one of 128
    running attempts and writes their log lines is still a handful of statements."""
    tenant = make_tenant(db, "many", plan="internal")
    loop = leader_loop(db)
    ids = [submit(db, tenant, name=f"many-{i}", steps=2000, ipus=1) for i in range(128)]
    assert loop.lead() and loop.schedule_pass() == 128
    with db.read() as s:
        placed = list(s.execute(select(Attempt.id).where(Attempt.state == "placed")).scalars())
    clock = FakeClock()
    agent = make_agent(db, clock)
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()[:3]).upper())

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        take(agent, placed)  # one transaction takes them all
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    assert len(agent.running) == 128
    assert len(statements) <= 16, sorted(((statements.count(s), s) for s in set(statements)), reverse=True)
    run_for(agent, clock, 1.5)
    statements.clear()

    with db.read() as s:
        ticks_before = s.execute(select(func.count()).select_from(MeterEvent)).scalar_one()
    event.listen(db.engine, "before_cursor_execute", count)
    try:
        clock.now += 1.0  # every attempt's meter tick is due, and some of its log lines
        agent.step()
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    with db.read() as s:
        ticks_after = s.execute(select(func.count()).select_from(MeterEvent)).scalar_one()
    assert ticks_after - ticks_before == 128, "the tick billed every running attempt"
    writes = [s for s in statements if s.split()[0] in ("INSERT", "UPDATE", "DELETE")]
    assert len(writes) <= 8 and len(statements) <= 16, [(s, statements.count(s)) for s in set(statements)]
    run_for(agent, clock, 60)
    outcome = check_cloud(db, ids)
    assert outcome.states == {"succeeded": 128}


def test_hints_never_hold_up_the_agent_when_redis_hangs() -> None:
    hang = threading.Event()
    sent: list[str] = []

    class Hanging:
        def __init__(self) -> None:
            self.batch: list[str] = []

        def pipeline(self, transaction: bool = False) -> Any:
            self.batch = []
            return self

        def publish(self, channel: str, message: str) -> None:
            self.batch.append(message)

        def execute(self) -> None:
            sent.extend(self.batch)
            hang.wait(5)

    client = Hanging()
    hints = Hints(lambda: client, bound=8)  # type: ignore[arg-type,return-value]
    t0 = time.monotonic()
    for i in range(200):
        hints.send([("ipucloud:wake", f"m{i}")])
    assert time.monotonic() - t0 < 0.5, "a hanging broker held up the caller"
    hang.set()
    deadline = time.monotonic() + 5
    while not hints._queue.empty() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert sent[0] == "m0" and 2 <= len(sent) <= 9, "the backlog is bounded, the rest dropped"


def test_the_crash_switch_arms_only_matching_jobs_and_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import faults

    monkeypatch.delenv("IPUCLOUD_FAULT_CRASH_JOBS", raising=False)
    faults.fault_settings.cache_clear()
    assert not faults.crash_armed("crash-me-3")
    monkeypatch.setenv("IPUCLOUD_FAULT_CRASH_JOBS", "crash-me-*")
    faults.fault_settings.cache_clear()
    try:
        assert faults.crash_armed("crash-me-3") and not faults.crash_armed("innocent")
        with pytest.raises(faults.InjectedCrash):
            faults.crash(7)
    finally:
        monkeypatch.delenv("IPUCLOUD_FAULT_CRASH_JOBS")
        faults.fault_settings.cache_clear()


def test_a_run_that_crashes_in_the_agent_ends_alone_and_unbilled(
    db: Any, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import faults

    monkeypatch.setenv("IPUCLOUD_FAULT_CRASH_JOBS", "poison-*")
    faults.fault_settings.cache_clear()
    try:
        loop = leader_loop(db)
        poison = submit(db, tenant, name="poison-1", steps=2000)
        healthy = [submit(db, tenant, name=f"healthy-{i}", steps=2000) for i in range(3)]
        assert loop.schedule_pass() == 4
        with db.read() as s:
            placed = list(s.execute(select(Attempt.id).where(Attempt.state == "placed")).scalars())
        clock = FakeClock()
        agent = make_agent(db, clock)
        take(agent, placed)
        run_for(agent, clock, 3)
        assert len(agent.running) == 3, "the other attempts carry on"
        with db.read() as s:
            lost = s.execute(select(Attempt).where(Attempt.job_id == poison)).scalar_one()
        assert lost.state == "lost" and "crashed" in (lost.end_reason or "")
        run_for(agent, clock, 60)
        with db.write() as s:
            assert s.get(Job, poison).state == "queued", "it goes again, within the retry limit"
            jobs.request_cancel(session=s, job_id=poison, scope=OneTenant(tenant))
        outcome = check_cloud(db, [poison, *healthy])
        assert outcome.states == {"succeeded": 3, "cancelled": 1}
        assert outcome.attempts == {"succeeded": 3, "lost": 1}
    finally:
        monkeypatch.delenv("IPUCLOUD_FAULT_CRASH_JOBS")
        faults.fault_settings.cache_clear()


def _redis_on(url: str, db_number: int) -> Any:
    """A client of the same Redis server as `url`, on database `db_number` (unix socket or TCP)."""
    import redis

    pool = redis.Redis.from_url(url).connection_pool
    kwargs = {**pool.connection_kwargs, "db": db_number}
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def test_a_stop_notice_from_another_database_on_the_same_redis_is_not_heard(
    db: Any, tenant: str, redis_url: str
) -> None:
    """Redis pub/sub ignores database numbers. CI's test processes share one Redis server, each on a
    database of its own, and each runs an agent named like the others' ("w1@vm") driving attempt 1:
    another cloud's "w1@vm 1" stop notice made an agent drop an attempt its cloud never ended, then
    hand it back as one it did not know it held."""
    from scheduler import bus

    ours = _redis_on(redis_url, _db_of(redis_url))
    theirs = _redis_on(redis_url, (_db_of(redis_url) % 15) + 1)
    clock = FakeClock()
    agent = Agent(
        settings=get_settings(),
        db=db,
        name="w1@vm",
        queues=["ipucloud"],
        clock=clock,
        hints=Hints(lambda: NoRedis()),  # type: ignore[arg-type,return-value]
        redis_client=lambda: ours,
    )
    assert agent.step() and agent.lease is not None
    listener = threading.Thread(target=agent._listen, daemon=True)
    listener.start()
    try:
        attempt = place(db, leader_loop(db), submit(db, tenant, steps=50_000))
        take(agent, [attempt.id])
        wait_subscribed(ours, bus.scoped(bus.STOP_CHANNEL, ours))
        bus.publish(bus.STOP_CHANNEL, f"w1@vm {attempt.id}", client=theirs)
        bus.publish(bus.PREEMPT_CHANNEL, f"w1@vm {attempt.id} 30 another cloud's preemption", client=theirs)
        time.sleep(1.5)
        agent.step()
        assert attempt.id in agent.running, "a notice from another database stopped the attempt"
        assert agent.running[attempt.id].preempt_at is None, "another database's notice preempted it"
        bus.publish(bus.STOP_CHANNEL, f"w1@vm {attempt.id}", client=ours)
        deadline = time.monotonic() + 5
        while attempt.id in agent.running and time.monotonic() < deadline:
            time.sleep(0.05)
            agent.step()
        assert attempt.id not in agent.running, "its own cloud's stop notice was not heard"
    finally:
        agent._done.set()
        listener.join(timeout=3)


def _db_of(url: str) -> int:
    import redis

    return int(redis.Redis.from_url(url).connection_pool.connection_kwargs.get("db", 0))


def wait_subscribed(client: Any, channel: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.pubsub_numsub(channel)[0][1] > 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"nobody subscribed to {channel} in {timeout} s")


def test_the_same_message_twice_in_one_batch_is_taken_once_and_the_copy_turned_away(
    db: Any, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both deliveries of a message can reach one take batch (the worker's two threads received
    them together): one is taken, the other answered as a duplicate, not as a second take."""
    clock = FakeClock()
    agent = make_agent(db, clock)
    attempt = place(db, leader_loop(db), submit(db, tenant, steps=50_000))
    first, second = agent.deliver(attempt.id, 0), agent.deliver(attempt.id, 0)
    with caplog.at_level("INFO", logger="ipucloud.worker"):
        agent.step()
    assert (first.outcome, second.outcome) == ("taken", "not-taken")
    assert f"attempt {attempt.id} (epoch 0) is not ours to run" in caplog.text
    assert list(agent.running) == [attempt.id]


def test_a_burst_of_deliveries_through_the_default_worker_pool_shares_one_take(db: Any, tenant: str) -> None:
    """Each of the worker's Celery threads waits in `take` until the agent has taken its message, so
    the pool's size bounds the deliveries one take transaction can batch. At 16, a burst of one-step
    jobs queued up in the broker while the agent took them 16 at a time (docs/performance.md)."""
    tenant = make_tenant(db, "burst", plan="internal")
    loop = leader_loop(db)
    for i in range(64):
        submit(db, tenant, name=f"burst-{i}", steps=2000, ipus=1)
    assert loop.schedule_pass() == 64
    with db.read() as s:
        placed = list(s.execute(select(Attempt.id).where(Attempt.state == "placed")).scalars())
    clock = FakeClock()
    agent = make_agent(db, clock)
    # What `ipucloud worker` runs by default: a threads pool of IPUCLOUD_WORKER_CONCURRENCY, each
    # thread handing one message to `Agent.take` (workers/app.py).
    pool = ThreadPoolExecutor(get_settings().worker_concurrency)
    try:
        outcomes = [pool.submit(agent.take, a, 0, 5.0) for a in placed]
        deadline = time.monotonic() + 3
        while agent._takes.qsize() < len(placed) and time.monotonic() < deadline:
            time.sleep(0.01)
        agent.step()  # one turn of the loop: one take transaction
        assert len(agent.running) == len(placed)
        assert [f.result(timeout=5) for f in outcomes] == ["taken"] * len(placed)
    finally:
        for _ in range(8):  # answer whatever a smaller pool left waiting, so its threads end
            agent.step()
        pool.shutdown(wait=True)
