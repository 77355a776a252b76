"""Dry runs: what the emulator predicts for a job, and how long it would wait for room."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler import emulation
from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import WorkloadRequest
from scheduler.models import Attempt, AttemptState, Job, JobState, Partition
from scheduler.services import fleet, own_models
from scheduler.services.rates import plan_rates
from vipu import emulator
from vipu.emulator.spec import GraphSource
from vipu.machine_types import MACHINE_TYPE_NAMES


def estimate(
    *,
    session: Session | None,
    workload: WorkloadRequest,
    ipus: int | str,
    machine: str | None,
    policy: str = "default",
    rates: Mapping[str, float] | None = None,
    tenant_id: str | None = None,
    source: GraphSource | None = None,
) -> dict[str, Any]:
    """The emulator's dry run on `machine`; on `any` (or None), on every type of the fleet (every
    type there is, offline), answering for the one where it would finish first (the expected wait
    plus its run time), with each type's answer under `machine_options`.

    `rates` (grant units per IPU-hour by type; the registry's by default) give `charged_ipu_hours`.
    ``tenant_id`` lets ``workload.model`` name one of the tenant's own models; ``source`` gives a graph
    directly (``ipucloud estimate --model-file`` plans a local file)."""
    if source is None and session is not None and tenant_id is not None:
        source = own_models.resolve_source(session=session, tenant_id=tenant_id, model=workload.model)
    spec = emulation.to_workload_spec(workload, source)
    rate_of = plan_rates(rates)
    if machine not in (None, "any"):
        return _estimate_on(session, spec, ipus, machine, policy, rate_of[machine], strict=True)
    kinds = list(MACHINE_TYPE_NAMES)
    if session is not None:
        present = fleet.largest_by_type(session=session)
        kinds = [kind for kind in kinds if present.get(kind, 0) > 0] or kinds
    answers = {
        kind: _estimate_on(session, spec, ipus, kind, policy, rate_of[kind], strict=False) for kind in kinds
    }

    def finish(kind: str) -> float:
        out = answers[kind]
        if not out.get("fits") or out.get("total_s") is None:
            return math.inf
        wait = out.get("expected_wait_s", 0.0)
        return math.inf if wait is None else float(wait) + float(out["total_s"])

    best = min(kinds, key=lambda kind: (finish(kind), kinds.index(kind)))
    chosen = dict(answers[best])
    chosen["machine_options"] = {
        kind: {
            key: out.get(key)
            for key in (
                "fits",
                "ipus",
                "total_s",
                "expected_wait_s",
                "ipu_hours",
                "charged_ipu_hours",
                "error",
            )
        }
        | {"rate": rate_of[kind]}
        for kind, out in answers.items()
    }
    return chosen


def _estimate_on(
    session: Session | None,
    spec: emulator.WorkloadSpec,
    ipus: int | str,
    machine: str,
    policy: str,
    rate: float,
    *,
    strict: bool,
) -> dict[str, Any]:
    try:
        result = emulator.estimate(spec, ipus if ipus == "auto" else int(ipus), machine)
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc))
    except emulator.CompileError as exc:
        raise DoesNotFit(str(exc))
    except ValueError as exc:
        if strict:
            raise DoesNotFit(str(exc), machine=machine)
        return {"fits": False, "machine": machine, "error": str(exc)}
    out = result.to_dict()
    out["charged_ipu_hours"] = None if out.get("ipu_hours") is None else round(out["ipu_hours"] * rate, 6)
    if session is not None and out.get("fits"):
        size = int(out["plan"]["ipus"]) if isinstance(out.get("plan"), dict) else int(ipus)  # type: ignore[arg-type]
        try:
            fleet.check_fleet_can_ever_host(session=session, size=size, machine_type=machine)
        except InvalidRequest as exc:
            if strict:
                raise
            return {**out, "fits": False, "error": exc.detail}
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
