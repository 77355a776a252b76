"""Reading jobs: one, a list, an array's folded elements, events and state histories, why a job waits,
its current attempt."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from scheduler.errors import (
    NotFound,
)
from scheduler.jobspec import compress_indices
from scheduler.models import (
    SERVE_TASK,
    Attempt,
    AttemptState,
    Job,
    JobEvent,
    JobState,
    Partition,
)
from scheduler.services import sessions
from scheduler.services.tenancy.scope import AllTenants, Scope, restrict, sees
from scheduler.services.views import WaitView

if TYPE_CHECKING:
    pass


def get_job(*, session: Session, job_id: str, scope: Scope) -> Job:
    """A job by id; a job outside the scope (another tenant's) is indistinguishable from a missing one."""
    job = session.get(Job, job_id)
    if job is None or not sees(scope, job.tenant_id):
        raise NotFound(f"No job {job_id}.")
    return job


def list_jobs(
    *,
    session: Session,
    scope: Scope,
    after: str | None,
    limit: int,
    state: str | None = None,
    fold: bool = False,
) -> list[Job]:
    """The scope's jobs, newest first; `after` is the id of the last job of the previous page.
    `fold`: without arrays' queued elements (`folded_elements` stands for them)."""
    stmt = restrict(select(Job).order_by(Job.id.desc()).limit(limit), Job.tenant_id, scope)
    # A session's holder job is the session (GET /sessions), and an endpoint's replica is the
    # endpoint's (GET /endpoints): neither is one of the tenant's jobs.
    stmt = stmt.where(Job.task.not_in((sessions.SESSION_TASK, SERVE_TASK)))
    if state is not None:
        stmt = stmt.where(Job.state == state)
    if fold:
        stmt = stmt.where((Job.array_id.is_(None)) | (Job.state != JobState.QUEUED))
    if after is not None:
        stmt = stmt.where(Job.id < after)
    return list(session.execute(stmt).scalars())


@dataclass
class Folded:
    """An array's queued elements, shown as one row: its first element, how many, which."""

    first: Job
    count: int
    indices: str


def folded_elements(*, session: Session, scope: Scope) -> list[Folded]:
    """Each array of the scope with queued elements: its first queued element and the rest counted,
    newest array first (`GET /jobs` shows them atop its first page unless asked to expand)."""
    groups = session.execute(
        restrict(
            select(Job.array_id, func.count(), func.min(Job.array_index), func.max(Job.array_index))
            .where(Job.state == JobState.QUEUED, Job.array_id.is_not(None))
            .group_by(Job.array_id)
            .order_by(Job.array_id.desc())
            .limit(100),
            Job.tenant_id,
            scope,
        )
    ).tuples()
    wanted = {a: (int(n), int(lo), int(hi)) for a, n, lo, hi in groups}
    if not wanted:
        return []
    firsts = {
        j.array_id: j
        for j in session.execute(
            select(Job).where(
                tuple_(Job.array_id, Job.array_index).in_([(a, lo) for a, (_, lo, _) in wanted.items()]),
            )
        ).scalars()
    }
    out = []
    for array_id in sorted(wanted, reverse=True):
        n, lo, hi = wanted[array_id]
        first = firsts.get(array_id)
        if first is None:
            continue
        if n == hi - lo + 1:
            indices = f"{lo}-{hi}" if hi > lo else str(lo)
        else:
            indices = compress_indices(
                [
                    int(i or 0)
                    for i in session.execute(
                        select(Job.array_index)
                        .where(Job.array_id == array_id, Job.state == JobState.QUEUED)
                        .order_by(Job.array_index)
                    ).scalars()
                ]
            )
        out.append(Folded(first, n, indices))
    return out


def job_events(
    *, session: Session, job_id: str, after: int = 0, limit: int = 1000, kinds: tuple[str, ...] | None = None
) -> list[JobEvent]:
    stmt = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after)
    if kinds is not None:
        stmt = stmt.where(JobEvent.kind.in_(kinds))
    return list(session.execute(stmt.order_by(JobEvent.id).limit(limit)).scalars())


_JOB_ID = re.compile(r"\bjob_[0-9a-z]{26}\b")


def state_histories(*, session: Session, job_ids: Sequence[str]) -> dict[str, list[JobEvent]]:
    """Each job's state events, oldest first, in one query for a page of jobs."""
    out: dict[str, list[JobEvent]] = {j: [] for j in job_ids}
    if not job_ids:
        return out
    rows = session.execute(
        select(JobEvent)
        .where(JobEvent.job_id.in_(list(job_ids)), JobEvent.kind == "state")
        .order_by(JobEvent.id)
    ).scalars()
    for event in rows:
        out[event.job_id].append(event)
    return out


def wait_reason(*, session: Session, job: Job, scope: Scope) -> WaitView | None:
    """Why a queued job is not running yet, as the scheduler last explained it, told to `scope`.

    The scheduler names the jobs a job waits behind, whoever they belong to; a tenant is told only
    its own jobs' ids, and of other tenants' jobs only how many ("behind a job of another tenant")."""
    if job.state != JobState.QUEUED:
        return None
    attempt = current_attempt(session=session, job=job)
    return wait_given(session=session, job=job, attempt=attempt, scope=scope)


def wait_given(*, session: Session, job: Job, attempt: Attempt | None, scope: Scope) -> WaitView | None:
    """`wait_reason` for a job whose current attempt the caller has read already."""
    if job.state != JobState.QUEUED:
        return None
    if attempt is not None and attempt.state == AttemptState.PLACED:
        return {"reason": "starting", "detail": "placed on a partition; waiting for a worker to take it"}
    stored = cast("WaitView | None", job.wait)  # what scheduling.wait_json gave
    wait: WaitView = stored or {"reason": "pending", "detail": "waiting for the scheduler's next pass"}
    return redact_wait(session=session, wait=wait, scope=scope)


def redact_wait(*, session: Session, wait: WaitView, scope: Scope) -> WaitView:
    """`wait` with every id of a job outside `scope` replaced by words (see `wait_reason`)."""
    if isinstance(scope, AllTenants):
        return wait
    detail = str(wait.get("detail", ""))
    behind = [str(j) for j in wait.get("behind") or ()]
    named = set(behind) | set(_JOB_ID.findall(detail))
    if not named:
        return wait
    own = set(
        session.execute(
            select(Job.id).where(Job.id.in_(sorted(named)), Job.tenant_id == scope.tenant_id)
        ).scalars()
    )
    foreign = named - own
    if not foreign:
        return wait
    for job_id in foreign:
        detail = detail.replace(job_id, "a job of another tenant")
    others = sum(1 for j in behind if j in foreign)
    if others > 1:
        detail += f" (behind {others} jobs of other tenants)"
    return {
        **wait,
        "detail": detail,
        "behind": [j for j in behind if j not in foreign],
        "behind_other_tenants": others,
    }


def current_attempt(*, session: Session, job: Job) -> Attempt | None:
    if job.attempts == 0:
        return None
    return session.execute(
        select(Attempt).where(Attempt.job_id == job.id, Attempt.number == job.attempts)
    ).scalar_one_or_none()


def current_attempts(*, session: Session, jobs: list[Job]) -> dict[str, tuple[Attempt, Partition]]:
    """Each listed job's latest attempt and its partition, in one query for the whole page."""
    wanted = [(j.id, j.attempts) for j in jobs if j.attempts]
    if not wanted:
        return {}
    rows = session.execute(
        select(Attempt, Partition)
        .join(Partition, Partition.pk == Attempt.partition_pk)
        .where(Attempt.job_id.in_([j for j, _ in wanted]))
    ).tuples()
    latest = dict(wanted)
    return {a.job_id: (a, p) for a, p in rows if a.number == latest[a.job_id]}


def attempt_partition(*, session: Session, attempt: Attempt | None) -> Partition | None:
    return None if attempt is None else session.get(Partition, attempt.partition_pk)
