"""A job as every reader shows it: the one read of `GET /jobs`, `GET /jobs/{id}`, the dashboard's job,
jobs, home and session pages, and an array's elements.

A `JobRead` holds the rows and figures one answer needs (the current attempt and its partition, the
state history, the IPU-milliseconds billed so far, why it waits as the reader may be told, the newest
checkpoints), read in a few queries for a whole page; `api/views.py` turns it into the response body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from scheduler.models import Attempt, Job, JobEvent, Partition
from scheduler.services.batch import checkpoints as checkpoint_service
from scheduler.services.batch import jobs as job_service
from scheduler.services.batch.checkpoints import CheckpointView
from scheduler.services.batch.jobs import Folded
from scheduler.services.tenancy import usage as usage_service
from scheduler.services.tenancy.scope import Scope
from scheduler.services.views import WaitView


@dataclass
class JobRead:
    """What one job's answer shows; a field left None was not asked for."""

    job: Job
    attempt: Attempt | None = None
    partition: Partition | None = None
    history: list[JobEvent] | None = None
    used_ipu_ms: int | None = None
    wait: WaitView | None = None
    checkpoints: list[CheckpointView] | None = None
    checkpoint_count: int | None = None
    resumable_until: datetime | None = None
    folded: Folded | None = None


def job_reads(*, session: Session, jobs: Sequence[Job], scope: Scope, detail: bool = True) -> list[JobRead]:
    """A page of jobs, each with why it waits; with `detail`, also its partition, its state history
    and the IPU-hours billed so far (as `GET /jobs/{id}` shows each), in a few queries for the page."""
    jobs = list(jobs)
    ids = [j.id for j in jobs]
    if detail:
        current = job_service.current_attempts(session=session, jobs=jobs)
        histories = job_service.state_histories(session=session, job_ids=ids)
        used = usage_service.jobs_used_ipu_ms(session=session, job_ids=ids)
    out = []
    for j in jobs:
        if detail:
            attempt, partition = current.get(j.id, (None, None))
            read = JobRead(j, attempt, partition, histories[j.id], used[j.id])
        else:
            read = JobRead(j, job_service.current_attempt(session=session, job=j))
        read.wait = job_service.wait_given(session=session, job=j, attempt=read.attempt, scope=scope)
        out.append(read)
    return out


def job_read(*, session: Session, job: Job, scope: Scope, checkpoints: bool = True) -> JobRead:
    """One job in full: its history, partition, IPU-hours so far, why it waits and, with
    `checkpoints`, its newest checkpoints and until when it may be resumed from them."""
    (read,) = job_reads(session=session, jobs=[job], scope=scope)
    if checkpoints:
        rows, total = checkpoint_service.list_for_job(session=session, job_id=job.id)
        read.checkpoints = [checkpoint_service.checkpoint_json(c) for c in rows]
        read.checkpoint_count = total
        if rows:
            read.resumable_until = checkpoint_service.resumable_until_of(session=session, job=job)
    return read


def get_job_read(*, session: Session, job_id: str, scope: Scope) -> JobRead:
    """`GET /jobs/{id}`: the job in `scope` by id, in full (NotFound outside it)."""
    job = job_service.get_job(session=session, job_id=job_id, scope=scope)
    return job_read(session=session, job=job, scope=scope)


def list_job_reads(
    *, session: Session, scope: Scope, after: str | None, limit: int, state: str | None, fold: bool
) -> tuple[list[JobRead], str | None]:
    """`GET /jobs`: a page of `limit` jobs newest first (with `fold`, the first page opens with one row
    for each array's queued elements), and the id to continue after when there are more."""
    rows = job_service.list_jobs(
        session=session, scope=scope, after=after, limit=limit + 1, state=state, fold=fold
    )
    folded = job_service.folded_elements(session=session, scope=scope) if fold and after is None else []
    reads = job_reads(session=session, jobs=[f.first for f in folded] + rows[:limit], scope=scope)
    for f, read in zip(folded, reads, strict=False):
        read.folded = f
    return reads, rows[limit - 1].id if len(rows) > limit else None
