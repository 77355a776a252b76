"""Dry runs: what the emulator predicts for a job, and how long it would wait for room."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict, cast

from sqlalchemy.orm import Session

from scheduler import billing, emulation
from scheduler.clock import Clock
from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import JobSpec, WorkloadRequest
from scheduler.policy import HeldArray, QueuedJob
from scheduler.policy.forecast import estimate_start, forecast
from scheduler.policy.las import job_class
from scheduler.services import own_models
from scheduler.services.batch import arrays, executables, scheduling
from scheduler.services.capacity import fleet
from scheduler.services.clock import db_now
from scheduler.services.tenancy import rates
from scheduler.services.tenancy.rates import Offers
from scheduler.services.views import RuntimeLimitView
from scheduler.settings import Settings, get_settings
from vipu import emulator
from vipu.emulator.spec import GraphSource


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
    rate: NotRequired[float]  # grant units per IPU-hour on this type: charged = rate x ipu_hours
    reserve_ipu_hours: NotRequired[float | None]  # what submitting it reserves of the grant
    prefer: NotRequired[str]  # on `any`: what it was answered for (time or cost)
    expected_wait_s: NotRequired[float | None]  # with a session: the policy's forecast (None: not known)
    expected_wait_wall_s: NotRequired[float | None]  # the same on the wall clock: clock.to_wall
    time_scale: NotRequired[float]  # with a session: the cloud's cluster seconds per wall second
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
    offers: Offers | None = None,
    tenant_id: str | None = None,
    source: GraphSource | None = None,
    serve: Sequence[int] | None = None,
    forecast_wait: bool = True,
    prefer: str = "time",
) -> EstimateView:
    """The emulator's dry run on `machine`; on `any` (or None), on every type of the fleet (every
    type there is, offline), answering for the one where it would finish first (the expected wait
    plus its run time), with each type's answer under `machine_options`.

    The expected wait is the scheduling policy's own forecast for this tenant (`expected_wait_s`),
    under the cloud's `settings` (its placement policy and preemption; the process's by default).
    ``offers`` (`rates.offers`: what the tenant's plan offers this work, as admission asks it; the
    registry's terms and every type present by default) limits `any` to the types the plan allows and
    gives the rates of `charged_ipu_hours`. ``prefer`` (as a job's): on `any`, `cost` answers for the
    type that spends least of the grant instead (ties: the earliest finish). `reserve_ipu_hours` is
    what submitting the job would reserve (`billing.reserve_ipu_ms`: the option admission promises
    with this `prefer`), so a grant's room can be judged from it.
    ``tenant_id`` lets ``workload.model`` name one of the tenant's own models; ``source`` gives a graph
    directly (``ipucloud estimate --model-file`` plans a local file).

    ``serve`` (batch sizes, inference only) adds `serve`: a row per batch size with its latency and
    throughput on one serving replica of the estimate's machine type, of ``ipus`` IPUs or, for
    "auto", the fewest that hold the largest of them; a batch over what that replica holds is a row
    with `fits` false (see docs/emulator.md, "Serving latency")."""
    if source is None and session is not None and tenant_id is not None:
        source = own_models.resolve_source(session=session, tenant_id=tenant_id, model=workload.model)
    spec = emulation.to_workload_spec(workload, source)
    if offers is None:
        present = fleet.largest_by_type(session=session) if session is not None else None
        offers = rates.offers(plan=None, present=present)
    rate_of = offers.rates
    ctx = _Context(tenant_id, settings or get_settings(), forecast_wait)
    if serve is not None:
        _check_serve(spec, serve)
    if machine not in (None, "any"):
        out = _estimate_on(session, spec, ipus, machine, ctx, rate_of[machine], strict=True)
        out["reserve_ipu_hours"] = out.get("charged_ipu_hours")
        return _with_serve(out, spec, ipus, machine, serve)
    kinds = list(offers.kinds)
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

    def spend(kind: str) -> float:
        charged = answers[kind].get("charged_ipu_hours")
        return math.inf if not answers[kind].get("fits") or charged is None else float(charged)

    if prefer == "cost":
        # As the scheduler settles a `prefer: cost` job (policy/machine_choice.py): the cheapest type
        # it can start on, the earliest finish among equally cheap ones.
        startable = [kind for kind in kinds if math.isfinite(finish(kind))] or kinds
        best = min(startable, key=lambda kind: (spend(kind), finish(kind), kinds.index(kind)))
    else:
        best = min(kinds, key=lambda kind: (finish(kind), kinds.index(kind)))
    chosen = answers[best].copy()
    chosen["prefer"] = prefer
    chosen["machine_options"] = {kind: _option(out, rate_of[kind]) for kind, out in answers.items()}
    fitting = {
        kind: {
            "ipus": float(o["ipus"] or 0),
            "predicted_runtime_s": float(o["total_s"] or 0),
            "rate": rate_of[kind],
        }
        for kind, o in answers.items()
        if o.get("fits") and o.get("ipus") and o.get("total_s") is not None
    }
    chosen["reserve_ipu_hours"] = (
        billing.ipu_hours(billing.reserve_ipu_ms(fitting, prefer)) if fitting and chosen.get("fits") else None
    )
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
    forecast_wait: bool = True  # False: no `expected_wait_s` (an array's elements are forecast together)


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
    out["rate"] = rate
    if session is not None and out.get("fits"):
        size = int(cast(int, plan["ipus"])) if isinstance(plan, dict) else int(ipus)
        try:
            fleet.check_fleet_can_ever_host(session=session, size=size, machine_type=machine)
        except InvalidRequest as exc:
            if strict:
                raise
            return {**out, "fits": False, "error": exc.detail}
        if not ctx.forecast_wait:
            return out
        out["expected_wait_s"] = expected_wait_s(
            session=session,
            size=size,
            machine=machine,
            predicted_runtime_s=float(cast(float, out["total_s"])),  # it fits: its run time is known
            tenant_id=ctx.tenant_id,
            settings=ctx.settings,
        )
        # The wait is cluster time like every other `*_s` here; at a cloud's time scale of 60, 4,660
        # cluster seconds is 78 s on the wall clock, which is what someone waiting for it lives through.
        clock = Clock.of(ctx.settings)
        wait = out["expected_wait_s"]
        out["time_scale"] = clock.scale
        out["expected_wait_wall_s"] = None if wait is None else round(clock.to_wall(wait), 3)
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
    clock = Clock.of(settings)
    policy = scheduling.live_policy(settings)
    alloc = fleet.AllocatorSync(settings.placement_policy, clock=clock).refresh(session)
    if alloc.find(size, machine_type=machine) is not None and not scheduling.has_queued(session=session):
        return 0.0  # free room and nobody waiting: it starts at the next pass
    now = db_now(session)
    live = scheduling.build_snapshot(
        session=session,
        allocator=alloc,
        now=now,
        clock=clock,
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
        predicted_runtime_s=clock.to_wall(predicted_runtime_s),
        machine_type=machine,
        priority=job_class(
            policy,
            scheduling.plan_priority(session=session, tenant_id=tenant_id),
            size,
            clock.to_wall(predicted_runtime_s),
        ),
    )
    start = estimate_start(snapshot, target, policy, budget_s=ESTIMATE_BUDGET_S)
    if start is None:
        return None
    return round(clock.to_cluster(max(0.0, start - snapshot.now)), 3)


# What the forecast calls the job asked about: an id no real job has (real ids are job_ + 26 chars).
ESTIMATE_JOB_ID = "job_estimate"
ESTIMATE_TENANT = "tenant_estimate"  # an admin's estimate: a tenant with no usage yet
ESTIMATE_BUDGET_S = 2.0  # longest the forecast of one estimate may take (then: wait not known)


# ------------------------------------------------------------------------------------ arrays


MAX_ESTIMATE_ROWS = 1_000  # the most per-element rows an array's estimate answers with
DEFAULT_ESTIMATE_ROWS = 100
FORECAST_ELEMENTS = 1_000  # the most elements of an array whose start the estimate forecasts


class ElementEstimateView(TypedDict):
    """One element of an array or sweep in its estimate."""

    index: int
    params: dict[str, object] | None
    fits: bool
    ipus: int | None
    machine: str | None
    total_s: float | None  # predicted run time
    throughput: float | None
    ipu_hours: float | None
    charged_ipu_hours: float | None
    expected_wait_s: float | None  # when it would start, its array's max_running honoured
    error: str | None


class ArrayTotalsView(TypedDict):
    elements: int
    fitting: int
    max_running: int | None
    total_s: float  # the elements' run times added up
    ipu_hours: float
    charged_ipu_hours: float
    expected_wait_s: float | None  # until its first element starts
    expected_end_s: float | None  # until its last element ends (None: not within the forecast)


class ArrayEstimateView(TypedDict):
    elements: list[ElementEstimateView]
    elements_truncated: bool  # more elements than rows answered (`max_rows`); totals count them all
    totals: ArrayTotalsView


def estimate_array(
    *,
    session: Session,
    spec: JobSpec,
    limit: int,
    max_rows: int = DEFAULT_ESTIMATE_ROWS,
    settings: Settings | None = None,
    offers: Offers | None = None,
    tenant_id: str | None = None,
    max_running_limit: int | None = None,
) -> ArrayEstimateView:
    """An array's or sweep's dry run: each element as `estimate` answers a job (each distinct point
    once), and the whole: its elements' run times, IPU-hours and grant spent added up, when its first
    would start and its last end. Starts are the policy's forecast of all its elements together (the
    first `FORECAST_ELEMENTS`), no more than `max_running` (else the tenant's running limit,
    `max_running_limit`) running at once. Elements that do not fit are rows with `fits` false; the
    array's malformed input is an InvalidRequest naming the field, as on submission."""
    settings = settings or get_settings()
    elements = arrays.expand(spec, limit=limit)
    if not elements:
        raise InvalidRequest("The array has no elements.", field="array.indices")
    answers: dict[int, EstimateView] = {}
    for e in elements:
        if id(e.spec) in answers:
            continue
        try:
            answers[id(e.spec)] = estimate(
                session=session,
                workload=e.spec.workload,
                ipus=e.spec.ipus,
                machine=e.spec.machine,
                settings=settings,
                offers=offers,
                tenant_id=tenant_id,
                forecast_wait=False,
            )
        except DoesNotFit as exc:
            answers[id(e.spec)] = {"fits": False, "machine": str(e.spec.machine), "error": exc.detail}
        except InvalidRequest as exc:
            if e.params is not None:
                exc.detail = f"sweep element {e.index} ({e.params}): {exc.detail}"
                exc.extra.setdefault("field", "sweep.parameters")
            raise
    max_running = spec.array.max_running if spec.array is not None else None
    cap = max_running or max_running_limit or len(elements)
    waits = _forecast_elements(session, elements, answers, cap, tenant_id, settings)
    rows: list[ElementEstimateView] = []
    totals: ArrayTotalsView = {
        "elements": len(elements),
        "fitting": 0,
        "max_running": max_running,
        "total_s": 0.0,
        "ipu_hours": 0.0,
        "charged_ipu_hours": 0.0,
        "expected_wait_s": None,
        "expected_end_s": None,
    }
    ends: list[float] = []
    for e in elements:
        out = answers[id(e.spec)]
        fits = bool(out.get("fits"))
        wait = waits.get(e.index)
        if fits:
            totals["fitting"] += 1
            totals["total_s"] += float(out.get("total_s") or 0.0)
            totals["ipu_hours"] += float(out.get("ipu_hours") or 0.0)
            totals["charged_ipu_hours"] += float(out.get("charged_ipu_hours") or 0.0)
            if wait is not None:
                ends.append(wait + float(out.get("total_s") or 0.0))
        if len(rows) < max_rows:
            rows.append(
                {
                    "index": e.index,
                    "params": e.params,
                    "fits": fits,
                    "ipus": out.get("ipus"),
                    "machine": out.get("machine"),
                    "total_s": out.get("total_s"),
                    "throughput": out.get("throughput"),
                    "ipu_hours": out.get("ipu_hours"),
                    "charged_ipu_hours": out.get("charged_ipu_hours"),
                    "expected_wait_s": wait,
                    "error": out.get("error"),
                }
            )
    for key in ("total_s", "ipu_hours", "charged_ipu_hours"):
        totals[key] = round(totals[key], 6)
    if waits:
        totals["expected_wait_s"] = min(waits.values())
        if len(ends) == totals["fitting"]:
            totals["expected_end_s"] = round(max(ends), 3)
    return {"elements": rows, "elements_truncated": len(elements) > len(rows), "totals": totals}


def _forecast_elements(
    session: Session,
    elements: Sequence[arrays.Element],
    answers: Mapping[int, EstimateView],
    cap: int,
    tenant_id: str | None,
    settings: Settings,
) -> dict[int, float]:
    """Seconds until each fitting element (of the first `FORECAST_ELEMENTS`) would start if the
    array were submitted now: the live snapshot's forecast with the elements held as an array of at
    most `cap` running at once (policy.HeldArray). Elements it does not reach are left out."""
    clock = Clock.of(settings)
    policy = scheduling.live_policy(settings)
    alloc = fleet.AllocatorSync(settings.placement_policy, clock=clock).refresh(session)
    live = scheduling.build_snapshot(
        session=session,
        allocator=alloc,
        now=db_now(session),
        clock=clock,
        half_life_s=policy.half_life_s,
        also_tenants={tenant_id} if tenant_id is not None else (),
        policy=policy,
    )
    snapshot = live.snapshot
    targets: list[QueuedJob] = []
    index_of: dict[str, int] = {}
    ranked_at = scheduling.plan_priority(session=session, tenant_id=tenant_id)
    for e in elements[:FORECAST_ELEMENTS]:
        out = answers[id(e.spec)]
        if not out.get("fits") or out.get("total_s") is None or not out.get("ipus"):
            continue
        job_id = f"{ESTIMATE_JOB_ID}_{e.index}"
        index_of[job_id] = e.index
        targets.append(
            QueuedJob(
                id=job_id,
                tenant_id=tenant_id or ESTIMATE_TENANT,
                size=int(cast(int, out["ipus"])),
                submitted_at=snapshot.now,
                predicted_runtime_s=clock.to_wall(float(cast(float, out["total_s"]))),
                machine_type=out.get("machine"),
                # Ranked as the single job's estimate is (its service class under default-classes).
                priority=job_class(
                    policy,
                    ranked_at,
                    int(cast(int, out["ipus"])),
                    clock.to_wall(float(cast(float, out["total_s"]))),
                ),
            )
        )
    if not targets:
        return {}
    held = {
        **snapshot.held,
        ESTIMATE_ARRAY_ID: HeldArray(cap=max(1, cap), members=frozenset(), waiting=tuple(targets)),
    }
    view = dataclasses.replace(snapshot, held=held, arrivals=[*snapshot.arrivals, *targets[:cap]])
    starts = forecast(view, policy, until=set(index_of), budget_s=ESTIMATE_BUDGET_S)
    return {
        index_of[job_id]: round(clock.to_cluster(max(0.0, start - snapshot.now)), 3)
        for job_id, start in starts.items()
        if job_id in index_of
    }


ESTIMATE_ARRAY_ID = "arr_estimate"
