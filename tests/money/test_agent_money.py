"""#32 items 9 and 17 in the host agent (the real one, workers/agent.py, driven turn by turn on a test
clock against the test database): a job's "Done" line says what the grant is charged, with the raw
IPU-hours beside it; a preempted job's own log carries the warning."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import select

from scheduler import billing
from scheduler.models import Attempt, AttemptState, JobEvent, Tenant
from scheduler.settings import reset_settings_cache
from tests.faults.harness import leader_loop, make_tenant, place, submit
from tests.faults.test_agent import FakeClock, make_agent, run_for, take
from tests.support import services


@pytest.fixture
def tenant(db: Any, env: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fleet of Bow-2000s (rate 1.4 by default), the clock 100x, as tests/faults/test_agent.py."""
    services.seed(db, fleet_description="1xbow")
    monkeypatch.setenv("IPUCLOUD_TIME_SCALE", "100")
    monkeypatch.setenv("IPUCLOUD_HEARTBEAT_S", "1")
    monkeypatch.setenv("IPUCLOUD_LEASE_S", "5")
    monkeypatch.setenv("IPUCLOUD_METER_INTERVAL_S", "1")
    monkeypatch.setenv("IPUCLOUD_AGENT_SYNC_S", "600")
    monkeypatch.setenv("IPUCLOUD_PREEMPTION_WARNING_S", "120")
    reset_settings_cache()
    return make_tenant(db)


def log_of(db: Any, job_id: str) -> list[JobEvent]:
    with db.read() as s:
        return list(
            s.execute(
                select(JobEvent)
                .where(JobEvent.job_id == job_id, JobEvent.kind == "log")
                .order_by(JobEvent.id)
            )
            .scalars()
            .all()
        )


def test_the_done_line_says_what_the_grant_is_charged_beside_the_raw_ipu_hours(db: Any, tenant: str) -> None:
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=200)
    attempt = place(db, loop, job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [attempt.id])
    run_for(agent, clock, 120)
    with db.read() as s:
        a = s.get(Attempt, attempt.id)
        assert a.state == AttemptState.SUCCEEDED and a.machine_type == "bow" and a.rate == 1.4
        used = billing.ipu_hours(s.get(Tenant, tenant).used_ipu_ms)
    done = [e for e in log_of(db, job_id) if (e.data or {}).get("kind") == "done"]
    assert len(done) == 1, [e.message for e in log_of(db, job_id)]
    m = re.search(
        r"; ([\d,.]+) IPU-hours charged to the grant \(([\d,.]+) IPU-hours on bow at rate 1\.4\)$",
        done[0].message,
    )
    assert m is not None, done[0].message
    charged, raw = float(m.group(1).replace(",", "")), float(m.group(2).replace(",", ""))
    assert charged == pytest.approx(used, abs=0.0011), "the line says what the grant was charged"
    assert charged == pytest.approx(raw * 1.4, abs=0.0011)
    assert done[0].data["rate"] == 1.4


def test_a_preempted_jobs_own_log_carries_the_warning(db: Any, tenant: str) -> None:
    loop = leader_loop(db)
    job_id = submit(db, tenant, steps=500_000, preemptible=True, checkpoint_every_s=60)
    attempt = place(db, loop, job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [attempt.id])
    run_for(agent, clock, 30)  # compiled and loaded, some steps run
    why = "preempted for non-preemptible work of another tenant"
    agent._preempt_notices.append((attempt.id, 120.0, why))  # as its stop-notice listener hears it on Redis
    run_for(agent, clock, 5)
    with db.read() as s:
        assert s.get(Attempt, attempt.id).state == AttemptState.PREEMPTED
    lines = log_of(db, job_id)
    warned = [e for e in lines if (e.data or {}).get("kind") == "preemption_warning"]
    assert len(warned) == 1, [e.message for e in lines]
    w = warned[0]
    assert w.message.startswith(f"WARNING: {why}: it checkpoints after step ")
    assert "queued again and resumes from that checkpoint" in w.message
    assert w.data["level"] == "warning" and w.data["ends_at_s"] >= w.data["t"]
