"""Dry runs: what the emulator predicts for a job, and how long it would wait for room."""

from __future__ import annotations

import heapq
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler import emulation
from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import WorkloadRequest
from scheduler.models import Attempt, AttemptState, Job, JobState, Partition
from scheduler.services import fleet, own_models
from vipu import emulator
from vipu.emulator.spec import GraphSource


def estimate(
    *,
    session: Session | None,
    workload: WorkloadRequest,
    ipus: int | str,
    machine: str | None,
    policy: str = "default",
    tenant_id: str | None = None,
    source: GraphSource | None = None,
) -> dict[str, Any]:
    """``tenant_id`` lets ``workload.model`` name one of the tenant's own models; ``source`` gives a graph
    directly (``ipucloud estimate --model-file`` plans a local file)."""
    if source is None and session is not None and tenant_id is not None:
        source = own_models.resolve_source(session=session, tenant_id=tenant_id, model=workload.model)
    spec = emulation.to_workload_spec(workload, source)
    m = machine or emulation.DEFAULT_MACHINE
    try:
        result = emulator.estimate(spec, ipus if ipus == "auto" else int(ipus), m)
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc))
    except emulator.CompileError as exc:
        raise DoesNotFit(str(exc))
    out = result.to_dict()
    if session is not None and out.get("fits"):
        size = int(out["plan"]["ipus"]) if isinstance(out.get("plan"), dict) else int(ipus)  # type: ignore[arg-type]
        fleet.check_fleet_can_ever_host(session=session, size=size, machine_type=machine)
        out["expected_wait_s"] = expected_wait_s(session=session, size=size, machine=machine, policy=policy)
    return out


def expected_wait_s(
    *, session: Session, size: int, machine: str | None, policy: str = "default"
) -> float | None:
    """Cluster seconds until a partition of `size` would start if the queue ahead ran as predicted.

    Replays the running jobs' predicted ends and the queued jobs' starts on the allocator, first
    come first served: an estimate, stated as such, not a reservation.
    """
    alloc = fleet.load_allocator(session=session, policy=policy)
    if alloc.find(size, machine_type=machine) is not None and not _queued_ahead(session):
        return 0.0
    ends: list[tuple[float, str]] = []
    rows = session.execute(
        select(Partition.name, Job.predicted_runtime_s, Attempt.cluster_s)
        .join(Attempt, Attempt.partition_pk == Partition.pk)
        .join(Job, Job.id == Attempt.job_id)
        .where(Attempt.state.in_([AttemptState.PLACED, AttemptState.RUNNING]), Partition.kind == "job")
    ).all()
    for name, predicted, ran in rows:
        heapq.heappush(ends, (max(0.0, predicted - ran), name))
    queued = session.execute(
        select(Job.ipus, Job.machine_type, Job.predicted_runtime_s)
        .where(Job.state == JobState.QUEUED, Job.partition_name.is_(None))
        .order_by(Job.priority.desc(), Job.id)
        .limit(2000)
    ).all()
    clock = 0.0
    for n, (q_size, q_machine, q_runtime) in enumerate([*queued, (size, machine, None)]):
        while (placement := alloc.allocate(f"estimate-{n}", q_size, machine_type=q_machine)) is None:
            if not ends:
                return None  # no healthy room of that size even after everything ends
            clock, name = heapq.heappop(ends)
            if name in alloc.partitions():
                alloc.release(name)
        if q_runtime is None:
            return round(clock, 3)
        heapq.heappush(ends, (clock + q_runtime, placement.partition_id))
    return round(clock, 3)


def _queued_ahead(session: Session) -> bool:
    return session.execute(select(Job.id).where(Job.state == JobState.QUEUED).limit(1)).first() is not None
