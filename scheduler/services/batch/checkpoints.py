"""Checkpoints: a training job's saved state, and resuming from it (docs/checkpoints.md).

A host agent notes a checkpoint of each training attempt every `checkpoint_every_s` of cluster time
(at the last completed step), when it is warned of a preemption, when it hits its time limit and
when the agent hands it back on shutdown. Checkpoints are written in the agent's tick, with its
heartbeat and meter ticks (`attempts.record_tick`): at most one row per attempt per tick, never a
transaction of their own.

What they change:
- a new attempt (after a platform fault or a preemption) starts from the job's last checkpoint, not
  step 0 (`attempts.take_many`), and restoring it is not billed (`Attempt.unbilled_s`);
- an attempt ended by a platform fault is billed for the work up to its last checkpoint, which is
  kept, and refunded the rest (`metering.Settle.kept_s`): the tenant pays for every step once;
- a job stopped by its time limit can be resumed by its owner (`jobs.resume_job`) within its plan's
  `checkpoint_retention_s`.

What is kept (`prune`, from the scheduler loop): each job's newest `KEPT` checkpoints and each
attempt's last one, which hold everything the rest reads (the last one to resume from, an attempt's
last one for its fault billing, the ones `GET /jobs/{id}` lists); and none of a finished job once
its plan's retention has passed, when it can no longer be resumed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.db import changed
from scheduler.models import (
    FINAL_JOB_STATES,
    Attempt,
    AttemptState,
    Checkpoint,
    Job,
    JobState,
    Plan,
    Tenant,
    utcnow,
)

# Checkpoints `GET /jobs/{id}` lists: the newest ones (a week-long job checkpointing every ten
# minutes has a thousand).
LISTED = 20
# A job's newest checkpoints kept (older ones are pruned, but for each attempt's last): all that
# is ever read is the job's last one, each attempt's last one and the listed ones.
KEPT = LISTED
# Beyond its plan's retention a finished job's checkpoints go, after this margin: an owner's resume
# that passed its retention check an instant before still finds its checkpoint.
RETENTION_MARGIN = timedelta(hours=1)
# Jobs pruned per call, so one call's transaction stays short; the loop calls again.
PRUNE_BATCH = 500


@dataclass(frozen=True)
class Pruned:
    thinned: int  # older checkpoints of jobs with more than KEPT (not an attempt's last)
    expired: int  # every checkpoint of finished jobs past their plan's retention

    @property
    def total(self) -> int:
        return self.thinned + self.expired


@dataclass(frozen=True)
class CheckpointDue:
    """A checkpoint a host agent noted: attempt `attempt_id` had completed `step` at `cluster_s`."""

    attempt_id: int
    job_id: str
    attempt: int
    step: int
    steps: int
    samples: int
    executable_key: str
    machine_type: str
    cluster_s: float
    run_s: float
    reason: str


def record(*, session: Session, items: Sequence[CheckpointDue]) -> int:
    """Insert checkpoints (the caller holds their attempts' row locks); a replay inserts nothing."""
    if not items:
        return 0
    now = utcnow()
    table = Checkpoint.__table__
    ins = (
        postgresql.insert(table) if session.get_bind().dialect.name == "postgresql" else sqlite.insert(table)
    )
    session.execute(
        ins.on_conflict_do_nothing(index_elements=["attempt_id", "step"]),
        [
            {
                "job_id": c.job_id,
                "attempt_id": c.attempt_id,
                "attempt": c.attempt,
                "step": c.step,
                "steps": c.steps,
                "samples": c.samples,
                "executable_key": c.executable_key[:80],
                "machine_type": c.machine_type,
                "cluster_s": c.cluster_s,
                "run_s": c.run_s,
                "reason": c.reason,
                "at": now,
            }
            for c in items
        ],
    )
    return len(items)


def latest_by_job(*, session: Session, job_ids: Iterable[str]) -> dict[str, Checkpoint]:
    """Each job's last checkpoint (the furthest step), for the jobs that have one."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    newest = (
        select(Checkpoint.job_id, func.max(Checkpoint.id).label("id"))
        .where(Checkpoint.job_id.in_(ids))
        .group_by(Checkpoint.job_id)
        .subquery()
    )
    rows = session.execute(select(Checkpoint).join(newest, newest.c.id == Checkpoint.id)).scalars()
    return {c.job_id: c for c in rows}


def kept_run_s_of_queued(*, session: Session) -> dict[str, float]:
    """For each queued job with a checkpoint, the run time its last one keeps since its owner last
    started or resumed it (`Job.runtime_base_s`): what its next attempt need not run again
    (`attempts.take_many` resumes it there). Jobs without a checkpoint are left out."""
    queued = select(Job.id).where(Job.state == JobState.QUEUED)
    newest = (
        select(Checkpoint.job_id, func.max(Checkpoint.id).label("id"))
        .where(Checkpoint.job_id.in_(queued))
        .group_by(Checkpoint.job_id)
        .subquery()
    )
    rows = session.execute(
        select(Checkpoint.job_id, Checkpoint.run_s - Job.runtime_base_s)
        .join(newest, newest.c.id == Checkpoint.id)
        .join(Job, Job.id == Checkpoint.job_id)
    ).tuples()
    return {job_id: float(kept) for job_id, kept in rows if kept is not None and kept > 0}


def kept_by_attempt(*, session: Session, attempt_ids: Iterable[int]) -> dict[int, float]:
    """The cluster time of each attempt's last checkpoint: the work of it the job keeps."""
    ids = sorted(set(attempt_ids))
    if not ids:
        return {}
    rows = session.execute(
        select(Checkpoint.attempt_id, func.max(Checkpoint.cluster_s))
        .where(Checkpoint.attempt_id.in_(ids))
        .group_by(Checkpoint.attempt_id)
    ).tuples()
    return {int(a): float(t) for a, t in rows}


def list_for_job(*, session: Session, job_id: str, limit: int = LISTED) -> tuple[list[Checkpoint], int]:
    """The job's newest checkpoints, newest first, and how many it has."""
    total = session.execute(select(func.count()).where(Checkpoint.job_id == job_id)).scalar_one()
    rows = list(
        session.execute(
            select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.id.desc()).limit(limit)
        ).scalars()
    )
    return rows, int(total)


def prune(*, session: Session, now: datetime, batch: int = PRUNE_BATCH) -> Pruned:
    """Delete what no one will read again: checkpoints beyond each job's newest `KEPT`, and all of a
    finished job's once its plan's retention (and `RETENTION_MARGIN`) has passed."""
    crowded = list(
        session.execute(
            select(Checkpoint.job_id).group_by(Checkpoint.job_id).having(func.count() > KEPT).limit(batch)
        ).scalars()
    )
    thinned = 0
    if crowded:
        ranked = (
            select(
                Checkpoint.id,
                func.row_number()
                .over(partition_by=Checkpoint.job_id, order_by=Checkpoint.id.desc())
                .label("newest"),
                func.row_number()
                .over(partition_by=Checkpoint.attempt_id, order_by=Checkpoint.id.desc())
                .label("of_attempt"),
            )
            .where(Checkpoint.job_id.in_(crowded))
            .subquery()
        )
        old = select(ranked.c.id).where(ranked.c.newest > KEPT, ranked.c.of_attempt > 1)
        thinned = changed(session, delete(Checkpoint).where(Checkpoint.id.in_(old)))

    # Retention is per plan; the shortest bounds the candidates, each job's own plan decides.
    shortest = session.execute(select(func.min(Plan.checkpoint_retention_s))).scalar_one_or_none()
    expired = 0
    if shortest is not None:
        finished_before = now - timedelta(seconds=int(shortest)) - RETENTION_MARGIN
        candidates = session.execute(
            select(Job.id, Job.finished_at, Plan.checkpoint_retention_s)
            .join(Tenant, Tenant.id == Job.tenant_id)
            .join(Plan, Plan.name == Tenant.plan_name)
            .where(
                Job.id.in_(select(Checkpoint.job_id).distinct()),
                Job.state.in_(sorted(FINAL_JOB_STATES)),
                Job.finished_at < finished_before,
            )
            .limit(batch)
        ).tuples()
        due = [
            job_id
            for job_id, finished_at, retention in candidates
            if finished_at is not None
            and finished_at + timedelta(seconds=int(retention)) + RETENTION_MARGIN < now
        ]
        if due:
            # Locked as resume_job locks them, skipping any an owner holds: it is resumed, not gone.
            locked = list(
                session.execute(
                    select(Job.id)
                    .where(Job.id.in_(due), Job.state.in_(sorted(FINAL_JOB_STATES)))
                    .with_for_update(skip_locked=True)
                ).scalars()
            )
            if locked:
                expired = changed(session, delete(Checkpoint).where(Checkpoint.job_id.in_(locked)))
    return Pruned(thinned=thinned, expired=expired)


class CheckpointView(TypedDict):
    """A saved checkpoint as the API shows it (`at` in ISO 8601)."""

    step: int
    steps: int
    samples: int
    executable: str
    machine_type: str
    attempt: int
    run_s: float
    reason: str
    at: str


def checkpoint_json(c: Checkpoint) -> CheckpointView:
    return {
        "step": c.step,
        "steps": c.steps,
        "samples": c.samples,
        "executable": c.executable_key,
        "machine_type": c.machine_type,
        "attempt": c.attempt,
        "run_s": round(c.run_s, 3),
        "reason": c.reason,
        "at": c.at.isoformat(),
    }


def resumable_until(*, job: Job, plan: Plan) -> Any:
    """Until when the owner may resume a job stopped by its time limit (None: it cannot be)."""
    if job.state != JobState.FAILED or job.finished_at is None:
        return None
    return job.finished_at + timedelta(seconds=int(plan.checkpoint_retention_s))


def resumable_until_of(*, session: Session, job: Job) -> Any:
    """`resumable_until` for a job whose last attempt hit its time limit (None for any other)."""
    if job.state != JobState.FAILED:
        return None
    last = session.execute(
        select(Attempt.state).where(Attempt.job_id == job.id, Attempt.number == job.attempts)
    ).scalar_one_or_none()
    if last != AttemptState.TIMED_OUT:
        return None
    plan = session.execute(
        select(Plan).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == job.tenant_id)
    ).scalar_one()
    return resumable_until(job=job, plan=plan)


def warn_preemption(
    *,
    session: Session,
    attempt_ids: Sequence[int],
    deadline: Any,
    window_s: float,
    reasons: Mapping[int, str] | None = None,
) -> list[tuple[str, int]]:
    """Warn running attempts that they are preempted: each has until `deadline` (wall) to checkpoint
    and end itself. Returns (agent, attempt) of the attempts newly warned, to tell over the bus;
    one warned before keeps its first deadline. `reasons` (by attempt) go with the warning: the
    agent writes it in the job's log and ends the attempt with it."""
    from scheduler import bus

    ids = sorted(set(attempt_ids))
    if not ids:
        return []
    rows = session.execute(
        select(Attempt.id, Attempt.worker).where(
            Attempt.id.in_(ids), Attempt.state == AttemptState.RUNNING, Attempt.preempt_deadline.is_(None)
        )
    ).tuples()
    warned = [(worker, int(aid)) for aid, worker in rows if worker]
    if not warned:
        return []
    session.execute(
        update(Attempt)
        .where(
            Attempt.id.in_([a for _, a in warned]),
            Attempt.state == AttemptState.RUNNING,
            Attempt.preempt_deadline.is_(None),
        )
        .values(preempt_deadline=deadline)
        .execution_options(synchronize_session=False)
    )
    for worker, aid in warned:
        why = " ".join((reasons or {}).get(aid, "").split())  # one line, as the bus message is
        bus.publish_after_commit(session, bus.PREEMPT_CHANNEL, f"{worker} {aid} {window_s:g} {why}".rstrip())
    return warned
