"""Dry runs: what the emulator predicts for a job, and how long it would wait for room."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict, cast

from sqlalchemy.orm import Session

from scheduler import emulation
from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import WorkloadRequest
from scheduler.policy import QueuedJob
from scheduler.policy.forecast import estimate_start
from scheduler.policy.las import job_class
from scheduler.services import executables, fleet, own_models, scheduling
from scheduler.services.clock import db_now
from scheduler.services.rates import plan_rates
from scheduler.services.views import RuntimeLimitView
from scheduler.settings import Settings, get_settings
from vipu import emulator
from vipu.emulator.spec import GraphSource
from vipu.machine_types import MACHINE_TYPE_NAMES


class MachineOptionView(TypedDict):
    """One machine type's answer to an estimate on `any`, with the type's rate."""

    fits: bool | None
    ipus: int | None
    total_s: float | None
    expected_wait_s: float | None
    ipu_hours: float | None
    charged_ipu_hours: float | None
    error: str | None
    rate: float


class ServeRowView(TypedDict):
    """One batch size's answer for serving: the latency of a request alone in a batch of that size and
    what one replica serves per second at saturation (`vipu.emulator.serving`)."""

    batch_size: int
    fits: bool
    latency_ms: float | None
    throughput: float | None
    host_call_ms: float | None
    host_ms: float | None
    device_ms: float | None
    step_ms: float | None
    error: str | None


class EstimateView(TypedDict):
    """A dry run's answer (`EstimateOut`): the emulator's `Estimate.to_dict()` and what this adds.

    A type the workload cannot run on at all answers only `fits`, `machine` and `error`."""

    fits: bool
    machine: str
    error: str | None
    model: NotRequired[str]
    task: NotRequired[str]
    ipus: NotRequired[int | None]
    ipus_auto: NotRequired[bool]
    plan: NotRequired[dict[str, object] | None]
    throughput: NotRequired[float | None]
    compile_s: NotRequired[float | None]
    load_s: NotRequired[float | None]
    step_s: NotRequired[float | None]
    steps: NotRequired[int | None]
    samples: NotRequired[int | None]
    total_s: NotRequired[float | None]
    ipu_hours: NotRequired[float | None]
    memory_per_ipu_bytes: NotRequired[int | None]
    cached: NotRequired[bool]
    charged_ipu_hours: NotRequired[float | None]
    expected_wait_s: NotRequired[float | None]  # with a session: the policy's forecast (None: not known)
    machine_options: NotRequired[dict[str, MachineOptionView]]  # on `any`: each type's answer
    runtime_limit: NotRequired[RuntimeLimitView]  # added by the API for a tenant
    serve: NotRequired[list[ServeRowView]]  # with `serve`: a row per batch size asked
    serve_plan: NotRequired[dict[str, object] | None]  # the serving replica those rows are for


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
    serve: Sequence[int] | None = None,
) -> EstimateView:
    """The emulator's dry run on `machine`; on `any` (or None), on every type of the fleet (every
    type there is, offline), answering for the one where it would finish first (the expected wait
    plus its run time), with each type's answer under `machine_options`.

    The expected wait is the scheduling policy's own forecast for this tenant (`expected_wait_s`),
    under the cloud's `settings` (its placement policy and preemption; the process's by default).
    `rates` (grant units per IPU-hour by type; the registry's by default) give `charged_ipu_hours`.
    ``tenant_id`` lets ``workload.model`` name one of the tenant's own models; ``source`` gives a graph
    directly (``ipucloud estimate --model-file`` plans a local file).

    ``serve`` (batch sizes, inference only) adds `serve`: a row per batch size with its latency and
    throughput on one serving replica of the estimate's machine type, of ``ipus`` IPUs or, for
    "auto", the fewest that hold the largest of them; a batch over what that replica holds is a row
    with `fits` false (see docs/emulator.md, "Serving latency")."""
    if source is None and session is not None and tenant_id is not None:
        source = own_models.resolve_source(session=session, tenant_id=tenant_id, model=workload.model)
    spec = emulation.to_workload_spec(workload, source)
    rate_of = plan_rates(rates)
    ctx = _Context(tenant_id, settings or get_settings())
    if serve is not None:
        _check_serve(spec, serve)
    if machine not in (None, "any"):
        out = _estimate_on(session, spec, ipus, machine, ctx, rate_of[machine], strict=True)
        return _with_serve(out, spec, ipus, machine, serve)
    kinds = list(MACHINE_TYPE_NAMES)
    if session is not None:
        present = fleet.largest_by_type(session=session)
        kinds = [kind for kind in kinds if present.get(kind, 0) > 0] or kinds
    answers = {
        kind: _estimate_on(session, spec, ipus, kind, ctx, rate_of[kind], strict=False) for kind in kinds
    }

    def finish(kind: str) -> float:
        out = answers[kind]
        total = out.get("total_s")
        if not out.get("fits") or total is None:
            return math.inf
        wait = out.get("expected_wait_s", 0.0)
        return math.inf if wait is None else float(wait) + float(total)

    best = min(kinds, key=lambda kind: (finish(kind), kinds.index(kind)))
    chosen = answers[best].copy()
    chosen["machine_options"] = {kind: _option(out, rate_of[kind]) for kind, out in answers.items()}
    return _with_serve(chosen, spec, ipus, best, serve)


MAX_SERVE_ROWS = 64


def _check_serve(spec: emulator.WorkloadSpec, batch_sizes: Sequence[int]) -> None:
    if spec.task != "infer":
        raise InvalidRequest(
            "serve applies to inference: set workload.task to infer to estimate serving latency.",
            field="serve",
        )
    if not 1 <= len(batch_sizes) <= MAX_SERVE_ROWS:
        raise InvalidRequest(
            f"serve.batch_sizes takes 1 to {MAX_SERVE_ROWS} batch sizes, got {len(batch_sizes)}.",
            field="serve.batch_sizes",
        )
    most = min(
        spec.source.max_batch_size if spec.source is not None else spec.workload.max_batch_size,
        emulator.MAX_SERVE_BATCH,
    )
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= most:
            raise InvalidRequest(
                f"serve.batch_sizes: each is an integer from 1 to {most:,} (the largest batch of "
                f"{spec.label}), got {b!r}.",
                field="serve.batch_sizes",
            )


def _with_serve(
    out: EstimateView,
    spec: emulator.WorkloadSpec,
    ipus: int | str,
    machine: str,
    batch_sizes: Sequence[int] | None,
) -> EstimateView:
    if batch_sizes is None:
        return out
    rows, plan = serve_rows(spec, ipus, machine, batch_sizes)
    return {**out, "serve": rows, "serve_plan": plan}


def serve_rows(
    spec: emulator.WorkloadSpec, ipus: int | str, machine: str, batch_sizes: Sequence[int]
) -> tuple[list[ServeRowView], dict[str, object] | None]:
    """The serving rows of an estimate and the replica's plan (None when nothing fits it)."""
    top = max(batch_sizes)
    try:
        size = (
            emulator.choose_serving_ipus(spec, machine=machine, max_batch_size=top)
            if ipus == "auto"
            else int(ipus)
        )
        served = emulator.serve_plan(spec, machine=machine, ipus=size, max_batch_size=top)
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc), field=f"workload.{exc.field}")
    except (emulator.CompileError, ValueError) as exc:
        # Nothing fits that replica (or the type cannot form it): every row says why.
        return [_serve_row(b, error=str(exc)) for b in batch_sizes], None
    rows = []
    for b in batch_sizes:
        if b > served.max_batch_size:
            rows.append(
                _serve_row(
                    b,
                    error=f"a batch of {b} does not fit In-Processor-Memory on a replica of {size} "
                    f"{machine} IPU(s): the largest that fits is {served.max_batch_size}",
                )
            )
            continue
        t = served.times(b)
        rows.append(
            {
                "batch_size": b,
                "fits": True,
                "latency_ms": round(t.latency_s * 1e3, 6),
                "throughput": round(b / t.step_s, 3),
                "host_call_ms": round(t.host_call_s * 1e3, 6),
                "host_ms": round(t.host_s * 1e3, 6),
                "device_ms": round(t.device_s * 1e3, 6),
                "step_ms": round(t.step_s * 1e3, 6),
                "error": None,
            }
        )
    return rows, served.to_dict()


def _serve_row(batch: int, *, error: str) -> ServeRowView:
    return {
        "batch_size": batch,
        "fits": False,
        "latency_ms": None,
        "throughput": None,
        "host_call_ms": None,
        "host_ms": None,
        "device_ms": None,
        "step_ms": None,
        "error": error,
    }


def _option(out: EstimateView, rate: float) -> MachineOptionView:
    return {
        "fits": out.get("fits"),
        "ipus": out.get("ipus"),
        "total_s": out.get("total_s"),
        "expected_wait_s": out.get("expected_wait_s"),
        "ipu_hours": out.get("ipu_hours"),
        "charged_ipu_hours": out.get("charged_ipu_hours"),
        "error": out.get("error"),
        "rate": rate,
    }


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
) -> EstimateView:
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
    out = cast(EstimateView, result.to_dict())
    plan = out.get("plan")
    key = plan.get("executable_key") if isinstance(plan, dict) else None
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
        out = cast(EstimateView, emulator.estimate(spec, size_asked, machine, cached=True).to_dict())
        plan = out.get("plan")
    hours = out.get("ipu_hours")
    out["charged_ipu_hours"] = None if hours is None else round(hours * rate, 6)
    if session is not None and out.get("fits"):
        size = int(cast(int, plan["ipus"])) if isinstance(plan, dict) else int(ipus)
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
            predicted_runtime_s=float(cast(float, out["total_s"])),  # it fits: its run time is known
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
        policy=policy,
    )
    snapshot = live.snapshot
    target = QueuedJob(
        id=ESTIMATE_JOB_ID,
        tenant_id=tenant_id or ESTIMATE_TENANT,
        size=size,
        submitted_at=snapshot.now,
        predicted_runtime_s=predicted_runtime_s / scale,
        machine_type=machine,
        priority=job_class(policy, 0, size, predicted_runtime_s / scale),
    )
    start = estimate_start(snapshot, target, policy, budget_s=ESTIMATE_BUDGET_S)
    if start is None:
        return None
    return round(max(0.0, start - snapshot.now) * scale, 3)


# What the forecast calls the job asked about: an id no real job has (real ids are job_ + 26 chars).
ESTIMATE_JOB_ID = "job_estimate"
ESTIMATE_TENANT = "tenant_estimate"  # an admin's estimate: a tenant with no usage yet
ESTIMATE_BUDGET_S = 2.0  # longest the forecast of one estimate may take (then: wait not known)
