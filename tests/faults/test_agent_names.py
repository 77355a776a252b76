"""Issue 32 item 16: a second `ipucloud worker` on one host without `--hostname` took the same Celery
node name, and the two took each other's lease every second, silently. A live agent's name is now
refused to another process, with what to set; a restart on the same host (the old pid gone) and a
name whose lease lapsed are taken over as before."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import Agent as AgentRow
from scheduler.services.batch import attempts
from scheduler.services.capacity import agents
from scheduler.settings import get_settings
from tests.faults.test_agent import FakeClock, NoRedis
from tests.support.services import Seeded
from workers.agent import Agent, Hints


def _register(db: Any, name: str, host: str, pid: int, lease_s: float = 60.0, takeover: bool = False) -> int:
    with db.write() as s:
        lease, _ = attempts.register_agent(
            session=s, name=name, host=host, pid=pid, queues=["ipucloud"], lease_s=lease_s,
            max_attempts=3, takeover=takeover,
        )  # fmt: skip
    return lease.epoch


def test_a_live_agents_name_is_refused_to_another_process(db: Any, seeded: Seeded) -> None:
    assert _register(db, "celery@h1", "h1", 100) == 1
    assert _register(db, "celery@h1", "h1", 100) == 2  # the same process again: a restart in place
    for host, pid in (("h1", 101), ("h2", 100)):
        with pytest.raises(agents.NameTaken) as caught:
            _register(db, "celery@h1", host, pid)
        message = str(caught.value)
        assert "--hostname" in message and "h1" in message and "pid 100" in message, message
    assert _register(db, "celery@h1", "h1", 101, takeover=True) == 3  # told the old one is gone
    assert _register(db, "celery@h9", "h9", 1, lease_s=-1.0) == 1  # a lease already lapsed...
    assert _register(db, "celery@h9", "h8", 2) == 2  # ...is anyone's


def test_the_agent_stops_and_says_what_to_set_when_its_name_is_live_elsewhere(
    db: Any, seeded: Seeded
) -> None:
    name = "celery@shared-name"
    # A live process on this host holds the name: this test's own parent (pid alive, not ours).
    _register(db, name, socket.gethostname(), os.getppid())
    told: list[str] = []
    agent = Agent(
        settings=get_settings(), db=db, name=name, queues=["ipucloud"], clock=FakeClock(),
        hints=Hints(lambda: NoRedis()),  # type: ignore[arg-type,return-value]
        on_name_taken=told.append,
    )  # fmt: skip
    assert agent.step() and agent.lease is None
    assert not agent.step(), "the agent stops rather than fight for the name"
    assert told and "--hostname" in told[0] and agent.name_taken == told[0]
    with db.read() as s:
        row = s.execute(select(AgentRow).where(AgentRow.name == name)).scalar_one()
    assert row.epoch == 1 and row.pid == os.getppid(), "the live agent kept its lease"

    # Its previous incarnation on this host is dead (a pid that has exited): a restart takes over.
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _register(db, "celery@restarted", socket.gethostname(), int(gone.stdout))
    again = Agent(
        settings=get_settings(), db=db, name="celery@restarted", queues=["ipucloud"], clock=FakeClock(),
        hints=Hints(lambda: NoRedis()),  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    assert again.step() and again.lease is not None and again.lease.epoch == 2


def test_a_second_worker_under_a_live_name_exits_saying_what_to_set(cloud: Any) -> None:
    """Two `ipucloud worker` processes with the one node name: the second exits 3 with the message,
    and the first keeps its lease (it was running before and is running after)."""
    import time

    first = cloud.procs["worker"]
    deadline = time.monotonic() + 60
    dup = cloud.spawn("worker-dup", "--concurrency", "2", "--hostname", "worker@%h", component="worker")
    while dup.alive() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not dup.alive(), "the second worker kept running under a live name"
    assert dup.popen is not None and dup.popen.returncode == 3, dup.log.read_text()[-2000:]
    said = dup.log.read_text()
    assert "another host agent named 'worker@" in said and "--hostname" in said, said[-2000:]
    assert first.alive()
