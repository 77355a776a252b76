"""How a scheduling pass writes what it places (issue 35): set-based statements where the rows are many
and narrow, and no cyclic garbage collection while the pass runs.

Which job starts where is held by test_pass_placements.py; this holds the cost's shape: one
statement for a pass's IPU assignments and one for its jobs' attempt counts, not one execution per
row, with every row as it was.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from sqlalchemy import event, func, select

from scheduler import loop as loop_module
from scheduler.jobspec import JobSpec
from scheduler.loop import SchedulerLoop
from scheduler.models import Attempt, IpuAssignment, Job, JobState, Partition
from scheduler.services.batch import jobs
from scheduler.services.tenancy import tenants
from scheduler.settings import get_settings
from tests.scheduler.test_lifecycle import FakeCelery

SIZES = [1, 2, 4, 1, 8, 1, 16, 2]


def queue_jobs(db: Any) -> list[str]:
    settings = get_settings()
    with db.write() as s:
        tid = tenants.create_tenant(
            session=s, secret=settings.secret(), name="writes", plan="standard", quota_ipu_hours=100_000
        ).tenant.id
        return [
            jobs.submit_job(
                session=s,
                tenant_id=tid,
                spec=JobSpec.model_validate(
                    {
                        "name": f"w{i}",
                        "workload": {"model": "mcmc", "task": "infer", "steps": 1},
                        "ipus": size,
                    }
                ),
            ).job.id
            for i, size in enumerate(SIZES)
        ]


def test_a_pass_writes_assignments_and_attempt_counts_in_one_statement_each(
    db: Any, seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = queue_jobs(db)
    statements: list[tuple[str, bool]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        statements.append((" ".join(statement.split()).lower(), executemany))

    collecting: list[bool] = []
    real_decide = loop_module.decide

    def decide(*args: Any, **kwargs: Any) -> Any:
        collecting.append(gc.isenabled())
        return real_decide(*args, **kwargs)

    monkeypatch.setattr(loop_module, "decide", decide)
    scheduler = SchedulerLoop(settings=get_settings(), db=db, celery=FakeCelery())  # type: ignore[arg-type]
    assert scheduler.lead()
    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        assert scheduler.schedule_pass() == len(SIZES)
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    assert collecting == [False], "the collector ran during the pass"
    assert gc.isenabled(), "the pass left the collector off"

    assignments = [(sql, many) for sql, many in statements if sql.startswith("insert into ipu_assignments")]
    counts = [(sql, many) for sql, many in statements if sql.startswith("update jobs")]
    if db.engine.dialect.name == "postgresql":
        assert assignments == [(assignments[0][0], False)] and "unnest" in assignments[0][0]
        assert counts == [(counts[0][0], False)] and "unnest" in counts[0][0]
    else:  # SQLite: one executemany each
        assert len(assignments) == 1 and len(counts) == 1

    with db.read() as s:
        placed = {j.id: j for j in s.execute(select(Job).where(Job.id.in_(ids))).scalars()}
        assert {j.attempts for j in placed.values()} == {1}
        assert {j.state for j in placed.values()} == {JobState.QUEUED}  # until an agent takes it
        assert all(j.updated_at >= j.created_at for j in placed.values())
        numbers = dict(s.execute(select(Attempt.job_id, Attempt.number)).tuples().all())
        assert numbers == dict.fromkeys(ids, 1)
        held = dict(s.execute(select(IpuAssignment.ipu_id, IpuAssignment.partition_pk)).tuples().all())
        parts = s.execute(select(Partition.pk, Partition.ipu_ids).where(Partition.job_id.in_(ids))).all()
        assert held == {ipu: pk for pk, ipu_ids in parts for ipu in ipu_ids}
        assert s.execute(select(func.count()).select_from(IpuAssignment)).scalar_one() == sum(SIZES)
