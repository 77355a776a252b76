"""A session's own jobs: the session a job names, and placing its jobs on free GCDs of the held
partition in the submission's own transaction."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from scheduler import dispatch_now
from scheduler.errors import Conflict, NotFound
from scheduler.models import (
    IpuSession,
    Job,
    OutboxMessage,
    Partition,
    SessionState,
    utcnow,
)
from scheduler.services.batch import attempts
from scheduler.services.capacity import fleet


def session_for_job(*, session: Session, tenant_id: str, session_id: str) -> tuple[IpuSession, Partition]:
    """The active session a job names and its partition, the session's row locked until commit (its
    jobs take its GCDs one at a time). Another tenant's session is not found."""
    row = session.execute(
        select(IpuSession)
        .where(IpuSession.id == session_id, IpuSession.tenant_id == tenant_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"No session {session_id}.")
    if row.state != SessionState.ACTIVE or row.partition_pk is None:
        raise Conflict(
            f"Session {session_id} is {row.state}"
            + (f" ({row.ended_reason})" if row.ended_reason else "")
            + ": jobs run only in an active session.",
            state=row.state,
        )
    partition = session.get(Partition, row.partition_pk)
    assert partition is not None
    return row, partition


def place_session_jobs(*, session: Session, jobs: Sequence[Job]) -> list[int]:
    """Place admitted session jobs on free GCDs of their sessions' partitions at once (the
    submission's transaction); a job that finds none free stays queued for the next. Returns the
    attempts placed."""
    by_partition: dict[str, list[Job]] = {}
    for job in jobs:
        if job.partition_name is not None:
            by_partition.setdefault(job.partition_name, []).append(job)
    placements: list[tuple[Job, attempts.PlacedPartition, str]] = []
    for name, waiting in by_partition.items():
        partition = fleet.get_live_partition(session=session, name=name)
        if partition is None or partition.kind != "session":
            continue
        free = attempts.free_gcds(session=session, partition_pk=partition.pk, gcds=partition.gcds)
        queue = dispatch_now.queue_for(partition.machine_type, partition.ipu_ids)
        placements.extend((job, partition, queue) for job in waiting[: len(free)])
    if not placements:
        return []
    # place_many writes each job's attempt count itself (one UPDATE for the batch), also for these
    # jobs, which the submission inserted without the ORM.
    ids = attempts.place_many(session=session, placements=placements)
    # Sent by this process as it commits, not by the scheduler's next iteration: written published.
    session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.attempt_id.in_(ids))
        .values(published_at=utcnow(), publish_count=1)
        .execution_options(synchronize_session=False)
    )
    dispatch_now.publish_after_commit(
        session, [(attempt_id, 0, q) for attempt_id, (_, _, q) in zip(ids, placements, strict=True)]
    )
    return ids
