"""Placing attempts: a partition's graph compile domains held, the attempt and its outbox row written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from scheduler.db import insert_returning_keys, update_by_key
from scheduler.errors import Conflict
from scheduler.models import (
    Attempt,
    AttemptState,
    Job,
    JobArray,
    JobEvent,
    OutboxMessage,
    utcnow,
)
from scheduler.services.tenancy import rates

TASK_NAME = "ipucloud.run_attempt"


class PlacedPartition(Protocol):
    """What placing an attempt reads of its partition (a Partition, or one just inserted)."""

    @property
    def pk(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def machine_type(self) -> str: ...
    @property
    def ipu_ids(self) -> list[str]: ...
    @property
    def gcds(self) -> int: ...


def gcd_ipus(ipu_ids: Sequence[str], gcds: int, gcd: int) -> list[str]:
    """The IPUs of graph compile domain `gcd` of a partition split into `gcds` equal ones."""
    size = len(ipu_ids) // gcds
    return list(ipu_ids[gcd * size : (gcd + 1) * size])


def free_gcds(*, session: Session, partition_pk: int, gcds: int) -> list[int]:
    """The partition's graph compile domains no live attempt holds, lowest first."""
    used = set(
        session.execute(
            select(Attempt.gcd).where(
                Attempt.partition_pk == partition_pk,
                Attempt.state.in_((AttemptState.PLACED, AttemptState.RUNNING)),
            )
        ).scalars()
    )
    return [g for g in range(gcds) if g not in used]


def place(
    *,
    session: Session,
    job: Job,
    partition: PlacedPartition,
    queue: str,
) -> int:
    """Record attempt N of `job` on `partition` and its outbox message, in the caller's transaction;
    returns the attempt's id."""
    return place_many(session=session, placements=[(job, partition, queue)])[0]


def place_many(*, session: Session, placements: Sequence[tuple[Job, PlacedPartition, str]]) -> list[int]:
    """`place` for many jobs at once: the attempts, their outbox messages and their events each in
    one batched statement, so a scheduling pass that starts a thousand jobs costs a few statements
    rather than a few per job. Returns the attempts' ids, in order."""
    if not placements:
        return []
    now = utcnow()
    rows = []
    # A partition of several graph compile domains runs one job on each: the lowest free one.
    free = {
        p.pk: free_gcds(session=session, partition_pk=p.pk, gcds=p.gcds)
        for _, p, _ in placements
        if p.gcds > 1
    }
    held: list[tuple[int, int, list[str]]] = []  # (gcd, IPUs it holds, their ids)
    for job, partition, _ in placements:
        if partition.gcds > 1:
            if not free[partition.pk]:
                raise Conflict(f"every graph compile domain of partition {partition.name} is in use")
            gcd = free[partition.pk].pop(0)
            ipus = gcd_ipus(partition.ipu_ids, partition.gcds, gcd)
        else:
            gcd, ipus = 0, list(partition.ipu_ids)
        held.append((gcd, len(ipus), ipus))
        # Counted in memory as already written: the rows are updated below in one statement rather
        # than flushed by the ORM one UPDATE per job.
        set_committed_value(job, "attempts", job.attempts + 1)
        set_committed_value(job, "updated_at", now)
        rows.append(
            {
                "job_id": job.id,
                "tenant_id": job.tenant_id,
                "number": job.attempts,
                "state": AttemptState.PLACED,
                "epoch": 0,
                "partition_pk": partition.pk,
                "gcd": gcd,
                "size": len(ipus),
                "machine_type": partition.machine_type,
                "placed_at": now,
                # The type's rate for this job, and the wait (rates.py); an `any` job takes on
                # the size and run time of the type it was placed on.
                **rates.attempt_fields(job, partition.machine_type, now),
            }
        )
    update_by_key(
        session,
        Job.__table__,
        "id",
        {job.id: {"attempts": job.attempts} for job, _, _ in placements},
        same={"updated_at": now},
    )
    ids = insert_returning_keys(session, Attempt.__table__, rows)
    session.execute(
        insert(OutboxMessage.__table__),
        [
            {
                "attempt_id": attempt_id,
                "queue": queue,
                "payload": {"attempt_id": attempt_id, "epoch": 0, "job_id": job.id},
                "created_at": now,
                "publish_count": 0,
            }
            for attempt_id, (job, _, queue) in zip(ids, placements, strict=True)
        ],
    )
    session.execute(
        insert(JobEvent.__table__),
        [
            {
                "job_id": job.id,
                "attempt": job.attempts,
                "kind": "state",
                "message": (
                    f"placed on partition {partition.name}"
                    + (f" graph compile domain {gcd}" if partition.gcds > 1 else "")
                    + f" ({size} x {partition.machine_type}: {_ipu_range(ipus)})"
                ),
                "data": {"partition": partition.name, "gcd": gcd, "ipus": ipus, "attempt": job.attempts},
                "at": now,
            }
            for (job, partition, _), (gcd, size, ipus) in zip(placements, held, strict=True)
        ],
    )
    return ids


def _ipu_range(ipus: list[str]) -> str:
    return ipus[0] if len(ipus) == 1 else f"{ipus[0]} .. {ipus[-1]}"


def array_environment(session: Session, job: Job) -> dict[str, str] | None:
    """An array element's environment: its array, index and the array's size and index range, under
    ipucloud's names and Slurm's (SLURM_ARRAY_JOB_ID, _TASK_ID, _TASK_COUNT, _TASK_MIN, _TASK_MAX)."""
    if job.array_id is None or job.array_index is None:
        return None
    array = session.get(JobArray, job.array_id)
    size = array.size if array is not None else 0
    bounds = session.execute(
        select(func.min(Job.array_index), func.max(Job.array_index)).where(Job.array_id == job.array_id)
    ).one()
    lo, hi = int(bounds[0] or 0), int(bounds[1] or 0)
    env = {
        "IPUCLOUD_ARRAY_ID": job.array_id,
        "IPUCLOUD_ARRAY_INDEX": str(job.array_index),
        "IPUCLOUD_ARRAY_SIZE": str(size),
        "SLURM_ARRAY_JOB_ID": job.array_id,
        "SLURM_ARRAY_TASK_ID": str(job.array_index),
        "SLURM_ARRAY_TASK_COUNT": str(size),
        "SLURM_ARRAY_TASK_MIN": str(lo),
        "SLURM_ARRAY_TASK_MAX": str(hi),
    }
    for path, value in (job.params or {}).items():
        env["IPUCLOUD_PARAM_" + path.upper().replace(".", "_")] = str(value)
    return env
