"""Dry runs: what the emulator predicts for a job, and how long it would wait for room."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.orm import Session

from scheduler import emulation
from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import WorkloadRequest
from scheduler.policy import QueuedJob
from scheduler.policy.forecast import estimate_start
from scheduler.services import executables, fleet, own_models, scheduling
from scheduler.services.clock import db_now
from scheduler.services.rates import plan_rates
from scheduler.settings import Settings, get_settings
from vipu import emulator
from vipu.emulator.spec import GraphSource
from vipu.machine_types import MACHINE_TYPE_NAMES


def estimate(
    *,
    session: Session | None,
    workload: WorkloadRequest,
    ipus: int | str,
    machine: str | None,
    settings: Settings | None = None,
    rates: Mapping[str, float] | None = None,
    tenant_id: str | None = None,
    source: GraphSource | None = None,
) -> dict[str, Any]:
    """The emulator's dry run on `machine`; on `any` (or None), on every type of the fleet (every
    type there is, offline), answering for the one where it would finish first (the expected wait
    plus its run time), with each type's answer under `machine_options`.

    The expected wait is the scheduling policy's own forecast for this tenant (`expected_wait_s`),
    under the cloud's `settings` (its placement policy and preemption; the process's by default).
    `rates` (grant units per IPU-hour by type; the registry's by default) give `charged_ipu_hours`.
    ``tenant_id`` lets ``workload.model`` name one of the tenant's own models; ``source`` gives a graph
    directly (``ipucloud estimate --model-file`` plans a local file)."""
    if source is None and session is not None and tenant_id is not None:
        source = own_models.resolve_source(session=session, tenant_id=tenant_id, model=workload.model)
    spec = emulation.to_workload_spec(workload, source)
    rate_of = plan_rates(rates)
    ctx = _Context(tenant_id, settings or get_settings())
    if machine not in (None, "any"):
        return _estimate_on(session, spec, ipus, machine, ctx, rate_of[machine], strict=True)
    kinds = list(MACHINE_TYPE_NAMES)
    if session is not None:
        present = fleet.largest_by_type(session=session)
        kinds = [kind for kind in kinds if present.get(kind, 0) > 0] or kinds
    answers = {
        kind: _estimate_on(session, spec, ipus, kind, ctx, rate_of[kind], strict=False) for kind in kinds
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


@dataclass(frozen=True)
class _Context:
    tenant_id: str | None
    settings: Settings


def _estimate_on(
    session: Session | None,
    spec: emulator.WorkloadSpec,
    ipus: int | str,
    machine: str,
    ctx: _Context,
    rate: float,
    *,
    strict: bool,
) -> dict[str, Any]:
    size_asked: int | Literal["auto"] = "auto" if ipus == "auto" else int(ipus)
    try:
        result = emulator.estimate(spec, size_asked, machine)
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc))
    except emulator.CompileError as exc:
        raise DoesNotFit(str(exc))
    except ValueError as exc:
        if strict:
            raise DoesNotFit(str(exc), machine=machine)
        return {"fits": False, "machine": machine, "error": str(exc)}
    out: dict[str, Any] = result.to_dict()
    key = out["plan"].get("executable_key") if isinstance(out.get("plan"), dict) else None
    cached = (
        session is not None
        and key is not None
        and ctx.tenant_id is not None
        and executables.is_cached(
            session=session, key=executables.tenant_key(tenant_id=ctx.tenant_id, key=str(key))
        )
    )
    if cached:
        # Compiled before for this tenant: the run skips compilation, and so do its time, cost and
        # reservation (what submission reserves; see jobs.submit_job).
        out = emulator.estimate(spec, size_asked, machine, cached=True).to_dict()
    out["charged_ipu_hours"] = None if out.get("ipu_hours") is None else round(out["ipu_hours"] * rate, 6)
    if session is not None and out.get("fits"):
        size = int(out["plan"]["ipus"]) if isinstance(out.get("plan"), dict) else int(ipus)
        try:
            fleet.check_fleet_can_ever_host(session=session, size=size, machine_type=machine)
        except InvalidRequest as exc:
            if strict:
                raise
            return {**out, "fits": False, "error": exc.detail}
        out["expected_wait_s"] = expected_wait_s(
            session=session,
            size=size,
            machine=machine,
            predicted_runtime_s=float(out["total_s"]),
            tenant_id=ctx.tenant_id,
            settings=ctx.settings,
        )
    return out


def expected_wait_s(
    *,
    session: Session,
    size: int,
    machine: str | None,
    predicted_runtime_s: float,
    tenant_id: str | None = None,
    settings: Settings | None = None,
) -> float | None:
    """Cluster seconds until a job of `size` IPUs and this predicted run time would start if submitted
    now by `tenant_id`: the scheduling policy's own forecast (`scheduler.policy.forecast`), run over the
    same snapshot the live pass decides on, with the cloud's policy settings. None when the replay
    does not reach its start (a very long queue, or no room of that size ever)."""
    settings = settings or get_settings()
    scale = settings.time_scale
    policy = scheduling.live_policy(placement=settings.placement_policy, preemption=settings.preemption)
    alloc = fleet.AllocatorSync(settings.placement_policy, time_scale=scale).refresh(session)
    if alloc.find(size, machine_type=machine) is not None and not scheduling.has_queued(session=session):
        return 0.0  # free room and nobody waiting: it starts at the next pass
    now = db_now(session)
    live = scheduling.build_snapshot(
        session=session,
        allocator=alloc,
        now=now,
        time_scale=scale,
        half_life_s=policy.half_life_s,
        also_tenants={tenant_id} if tenant_id is not None else (),
    )
    snapshot = live.snapshot
    target = QueuedJob(
        id=ESTIMATE_JOB_ID,
        tenant_id=tenant_id or ESTIMATE_TENANT,
        size=size,
        submitted_at=snapshot.now,
        predicted_runtime_s=predicted_runtime_s / scale,
        machine_type=machine,
    )
    start = estimate_start(snapshot, target, policy, budget_s=ESTIMATE_BUDGET_S)
    if start is None:
        return None
    return round(max(0.0, start - snapshot.now) * scale, 3)


# What the forecast calls the job asked about: an id no real job has (real ids are job_ + 26 chars).
ESTIMATE_JOB_ID = "job_estimate"
ESTIMATE_TENANT = "tenant_estimate"  # an admin's estimate: a tenant with no usage yet
ESTIMATE_BUDGET_S = 2.0  # longest the forecast of one estimate may take (then: wait not known)
