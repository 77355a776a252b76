"""Issue #32 item 13: a job's progress counts its steps, and a lost attempt's clock stops when its
agent stops answering, so progress never climbs through an agent's lease and then falls back."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select

from scheduler.loop import SchedulerLoop
from scheduler.models import Attempt, utcnow
from scheduler.services.batch import attempts
from tests.scheduler.test_lifecycle import loop, submit, tenant  # noqa: F401  (fixtures)
from tests.support import agentkit
from vipu.emulator.run import Timeline


def timeline(first_step: int = 0, compile_s: float = 300.0) -> Timeline:
    return Timeline(
        compile_s=compile_s, load_s=20.0, step_s=2.0, steps=1000, samples_per_step=64,
        memory_per_ipu_bytes=1, first_step=first_step,
    )  # fmt: skip


def test_percent_is_the_share_of_steps_done_and_compile_is_a_phase_of_its_own() -> None:
    t = timeline()
    assert t.progress_at(100.0).phase == "compile" and t.progress_at(100.0).percent == 0.0
    assert t.progress_at(310.0).phase == "load" and t.progress_at(310.0).percent == 0.0
    at_550 = t.progress_at(320.0 + 550 * 2.0)
    assert at_550.phase == "run" and at_550.step == 550 and abs(at_550.percent - 55.0) < 1e-9
    # Killed at step 550 with a checkpoint at step 500: the next attempt compiles again, and shows
    # the 500 steps it kept (50%) while it does, not a share of a timeline with compile mixed in.
    resumed = timeline(first_step=500)
    for t_s in (0.0, 150.0, 310.0):
        p = resumed.progress_at(t_s)
        assert p.phase in ("compile", "load") and abs(p.percent - 50.0) < 1e-9 and p.step == 500
    assert abs(resumed.progress_at(320.0 + 51 * 2.0).percent - 55.1) < 1e-9
    # A cached executable (no compile) is at the same percent at the same step.
    assert abs(timeline(compile_s=0.0).progress_at(20.0 + 550 * 2.0).percent - 55.0) < 1e-9
    assert t.progress_at(t.total_s).percent == 100.0


def test_a_silent_agents_attempt_stops_its_clock_and_its_lapse_keeps_what_was_shown(
    db: Any,
    tenant: str,  # noqa: F811
    loop: SchedulerLoop,  # noqa: F811
) -> None:
    job_id = submit(db, tenant)
    assert loop.lead() and loop.schedule_pass() == 1
    with db.read() as s:
        aid = s.execute(select(Attempt.id).where(Attempt.job_id == job_id)).scalar_one()
    # A lease of 0.8 s: a quarter of it (0.2 s) past its last heartbeat, the agent is not answering.
    agent = agentkit.register(db, "silent-agent", lease_s=0.8)
    assert agentkit.take(db, aid, agent=agent) is not None
    with db.read() as s:
        attempt = s.get(Attempt, aid)
        assert attempt is not None and attempt.started_at is not None
        started = attempt.started_at
    time.sleep(1.5)  # the agent died: no heartbeat since the take
    with db.read() as s:
        attempt = s.get(Attempt, aid)
        assert attempt is not None and attempt.state == "running"
        shown = attempts.progress_of(attempt, utcnow())
        assert shown is not None
        waited = (utcnow() - started).total_seconds()
        assert waited > 1.4
        assert shown["cluster_s"] < 0.8, f"the clock ran on for {shown['cluster_s']} s of {waited:.2f} s"
        later = attempts.progress_of(attempt, utcnow())
        assert later == shown, "a silent agent's attempt stands still"
    with db.write() as s:
        lapses = attempts.lapse_agents(session=s, max_attempts=3)
    assert [[a.id for a in lapse.ended] for lapse in lapses] == [[aid]]
    with db.read() as s:
        ended = s.get(Attempt, aid)
        assert ended is not None and ended.state == "lost"
        assert ended.progress is not None
        # What the lost attempt keeps is what was shown while its agent was silent: no fall back.
        assert abs(float(ended.progress["cluster_s"]) - shown["cluster_s"]) < 1e-6
        assert abs(ended.cluster_s - shown["cluster_s"]) < 1e-3  # shown rounded to 1 ms


def test_a_live_agents_attempt_runs_on_between_heartbeats(
    db: Any,
    tenant: str,  # noqa: F811
    loop: SchedulerLoop,  # noqa: F811
) -> None:
    job_id = submit(db, tenant)
    assert loop.lead() and loop.schedule_pass() == 1
    with db.read() as s:
        aid = s.execute(select(Attempt.id).where(Attempt.job_id == job_id)).scalar_one()
    agent = agentkit.register(db, "live-agent", lease_s=60.0)  # grace 15 s
    assert agentkit.take(db, aid, agent=agent) is not None
    time.sleep(0.5)
    with db.read() as s:
        attempt = s.get(Attempt, aid)
        assert attempt is not None
        p = attempts.progress_of(attempt, utcnow())
        assert p is not None and p["cluster_s"] >= 0.45
