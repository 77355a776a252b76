"""The workload catalogue and dry-run estimates."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from api.deps import DbDep, Reader, SettingsDep
from api.schemas import CatalogueOut, ServeRequest, ServeRowOut
from scheduler.errors import InvalidRequest
from scheduler.jobspec import MAX_ARRAY_SIZE, ArrayRequest, JobSpec, SweepRequest, WorkloadRequest
from scheduler.models import Plan
from scheduler.services.batch import estimates
from scheduler.services.batch import jobs as job_service
from scheduler.services.tenancy import rates
from scheduler.services.tenancy.tenants import get_tenant
from vipu import emulator
from vipu.machine_types import MACHINE_TYPE_NAMES

router = APIRouter(prefix="/api/v1", tags=["catalogue"])


class EstimateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    workload: WorkloadRequest
    ipus: Annotated[int, Field(ge=1, le=65_536)] | Literal["auto"] = "auto"
    machine: Literal[(*MACHINE_TYPE_NAMES, "any")] | None = Field(  # type: ignore[valid-type]
        None,
        description="A machine type, or `any` (also what null means): the estimate is for the type where "
        "the job would finish first, each type's answer under `machine_options`.",
    )
    prefer: Literal["time", "cost"] = Field(
        "time",
        description="As in a job spec, with `machine` `any`: `time` answers for the type where it finishes "
        "first, `cost` for the one that spends the least of the grant (rate x IPU-hours).",
    )
    max_runtime_s: int | None = Field(
        None, ge=1, le=365 * 24 * 3600, description="As in a job spec: run at most this long, then stop."
    )
    preemptible: bool = Field(
        False, description="As in a job spec: the charge and reservation at the plan's preemptible rates."
    )
    serve: ServeRequest | None = Field(
        None,
        description="Inference only: also time one serving replica (of `ipus` IPUs, or for `auto` the "
        "fewest that hold the largest batch) at these batch sizes; the answer's `serve` has a row each.",
    )
    array: ArrayRequest | None = Field(
        None,
        description="As in a job spec: estimate a job array, each element and in total (`elements`, "
        "`totals`); `max_running` is honoured in the forecast of when its elements start.",
    )
    sweep: SweepRequest | None = Field(
        None, description="As in a job spec: estimate a parameter sweep, each point and in total."
    )
    max_rows: int = Field(
        estimates.DEFAULT_ESTIMATE_ROWS,
        ge=1,
        le=estimates.MAX_ESTIMATE_ROWS,
        description="With `array` or `sweep`: answer at most this many `elements` rows (the totals count "
        "every element).",
    )

    @model_validator(mode="after")
    def _array(self) -> EstimateRequest:
        if self.array is not None and self.array.indices is None and self.sweep is None:
            raise ValueError("an array needs `indices` (or a `sweep` to make its elements)")
        if self.array is not None and self.array.indices is not None and self.sweep is not None:
            raise ValueError("a sweep makes its own indices: give `array` only its `max_running`")
        if (self.array is not None or self.sweep is not None) and self.serve is not None:
            raise ValueError("`serve` times one endpoint replica: not with an array or sweep")
        return self


class ElementEstimateOut(BaseModel):
    index: int
    params: dict[str, Any] | None = Field(None, description="A sweep's point (null for a plain array).")
    fits: bool
    ipus: int | None = None
    machine: str | None = None
    total_s: float | None = Field(None, description="Predicted run time, cluster seconds.")
    throughput: float | None = Field(None, description="samples/s")
    ipu_hours: float | None = None
    charged_ipu_hours: float | None = Field(None, description="IPU-hours x the type's rate: grant spent")
    expected_wait_s: float | None = Field(
        None,
        description="Cluster seconds until it would start, its array's `max_running` honoured; null when "
        "not within the forecast (only the first 1,000 elements are forecast).",
    )
    error: str | None = None


class ArrayTotalsOut(BaseModel):
    elements: int
    fitting: int = Field(description="Elements that fit; the sums below are theirs.")
    max_running: int | None = None
    total_s: float = Field(description="The elements' predicted run times added up (cluster seconds).")
    ipu_hours: float
    charged_ipu_hours: float = Field(description="The grant the whole array is predicted to spend.")
    expected_wait_s: float | None = Field(None, description="Cluster seconds until its first element starts.")
    expected_end_s: float | None = Field(
        None,
        description="Cluster seconds until its last element is predicted to end, no more than `max_running` "
        "at once; null when the forecast does not reach it.",
    )


class RuntimeLimit(BaseModel):
    model_config = ConfigDict(extra="allow")

    max_runtime_s: int = Field(description="The longest a job may run on the plan (cluster seconds).")
    within: bool = Field(description="Whether this job ends within it; if not, submitting it is refused.")
    detail: str | None = Field(None, description="When not: the prediction, the limit and what would fit.")
    fitting_steps: int | None = Field(None, description="Steps that would end in time on the same IPUs.")
    fitting_ipus: int | None = Field(None, description="The smallest partition on which all of it would.")


class EstimateOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    fits: bool
    plan: dict[str, Any] | None = None
    throughput: float | None = Field(None, description="samples/s")
    compile_s: float | None = Field(None, description="Cluster seconds compiling (0 when cached).")
    step_s: float | None = Field(None, description="Cluster seconds per step.")
    total_s: float | None = Field(None, description="Cluster seconds from start to end, compile included.")
    ipu_hours: float | None = None
    charged_ipu_hours: float | None = Field(
        None, description="What the grant is charged: IPU-hours (`ipu_hours`, raw) x the type's `rate`"
    )
    rate: float | None = Field(None, description="The type's rate under your plan: grant units per IPU-hour")
    reserve_ipu_hours: float | None = Field(
        None,
        description="What submitting this job reserves of the grant (the type it is promised at, with "
        "`prefer`); its end bills what it ran",
    )
    machine: str | None = Field(None, description="The machine type this answer is for")
    prefer: str | None = Field(None, description="With machine `any`: what the type was chosen for")
    machine_options: dict[str, dict[str, Any]] | None = Field(
        None, description="With machine `any`: each type's answer (fits, ipus, total_s, expected_wait_s, ...)"
    )
    expected_wait_s: float | None = Field(
        None,
        description="Cluster seconds before it would start, as the scheduling policy forecasts it for "
        "this tenant now; null if never or not within the forecast. `expected_wait_wall_s` is the same "
        "wait on the wall clock.",
    )
    expected_wait_wall_s: float | None = Field(
        None,
        description="Wall seconds before it would start: `expected_wait_s` / `time_scale`.",
    )
    time_scale: float | None = Field(
        None,
        description="Cluster seconds this cloud emulates per wall second: every `*_s` figure here is "
        "cluster time, a wall-clock wait is it divided by this.",
    )
    cached: bool | None = Field(
        None, description="The executable is compiled already: time, cost and reservation leave out compiling"
    )
    error: str | None = None
    runtime_limit: RuntimeLimit | None = Field(
        None, description="The tenant's run-time limit per job and whether this job ends within it."
    )
    serve: list[ServeRowOut] | None = Field(
        None, description="With `serve`: per batch size, a request's latency and a replica's throughput."
    )
    elements: list[ElementEstimateOut] | None = Field(
        None, description="With `array` or `sweep`: a row per element, in index order, up to `max_rows`."
    )
    elements_truncated: bool | None = Field(
        None, description="With `array` or `sweep`: there are more elements than `elements` rows."
    )
    totals: ArrayTotalsOut | None = Field(None, description="With `array` or `sweep`: the whole array.")
    serve_plan: dict[str, Any] | None = Field(
        None,
        description="With `serve`: the serving replica (IPUs, pipeline stages x copies, largest batch, "
        "host call, compile and load, its inputs and outputs); null when nothing fits it.",
    )


@router.get(
    "/workloads",
    response_model=CatalogueOut,
    response_model_exclude_unset=True,
    summary="The workload catalogue with each workload's parameters and limits",
)
def list_workloads(principal: Reader) -> dict[str, Any]:
    return {
        "items": [w.to_dict() for w in emulator.catalogue()],
        "machines": [m.to_dict() for m in emulator.MACHINES.values()],
    }


@router.post(
    "/estimates", response_model=EstimateOut, summary="Dry run: plan, fit, time, cost and queue wait"
)
def create_estimate(
    body: EstimateRequest, principal: Reader, db: DbDep, settings: SettingsDep
) -> EstimateOut:
    if body.array is not None or body.sweep is not None:
        return _estimate_array(body, principal.tenant_id, db, settings)
    with db.read() as s:
        offers = None
        if principal.tenant_id is not None:
            plan = get_tenant(session=s, tenant_id=principal.tenant_id).plan_name
            offers = rates.plan_offers(session=s, plan_name=plan, preemptible=body.preemptible)
        out = estimates.estimate(
            session=s,
            workload=body.workload,
            ipus=body.ipus,
            machine=body.machine,
            settings=settings,
            offers=offers,
            tenant_id=principal.tenant_id,
            serve=body.serve.batch_sizes if body.serve is not None else None,
            prefer=body.prefer,
        )
        ipus = out.get("ipus")
        if principal.tenant_id is not None and out.get("fits") and ipus:
            out["runtime_limit"] = job_service.runtime_limit(
                session=s,
                tenant_id=principal.tenant_id,
                workload=body.workload,
                ipus=int(ipus),
                machine=out.get("machine") or body.machine,  # the type the estimate is for
                max_runtime_s=body.max_runtime_s,
            )
    return EstimateOut(**out)


def _estimate_array(body: EstimateRequest, tenant_id: str | None, db: Any, settings: Any) -> EstimateOut:
    """An array's or sweep's dry run, judged as its submission would be (the plan's array size and
    running limits) but storing nothing."""
    try:
        spec = JobSpec.model_validate(
            {
                "name": "estimate",
                "workload": body.workload.model_dump(mode="json", exclude_defaults=True),
                "ipus": body.ipus,
                "machine": body.machine,
                "max_runtime_s": body.max_runtime_s,
                "array": body.array.model_dump(mode="json", exclude_none=True) if body.array else None,
                "sweep": body.sweep.model_dump(mode="json", exclude_defaults=True) if body.sweep else None,
            }
        )
    except ValidationError as exc:  # what a job spec refuses beyond an estimate's own rules (ipus)
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "ipus"
        raise InvalidRequest(f"{where}: {first['msg']}", field=where) from exc
    with db.read() as s:
        offers = None
        limit, running_limit = MAX_ARRAY_SIZE, None
        if tenant_id is not None:
            plan_name = get_tenant(session=s, tenant_id=tenant_id).plan_name
            offers = rates.plan_offers(session=s, plan_name=plan_name)
            plan = s.get(Plan, plan_name)
            assert plan is not None
            limit, running_limit = int(plan.max_array_size), int(plan.max_concurrent_jobs)
            max_running = body.array.max_running if body.array is not None else None
            if max_running is not None and max_running > running_limit:
                raise InvalidRequest(
                    f"array.max_running: {max_running} is more than the {plan.name} plan's "
                    f"{running_limit} running jobs.",
                    field="array.max_running",
                    limit="max_concurrent_jobs",
                )
        out = estimates.estimate_array(
            session=s,
            spec=spec,
            limit=limit,
            max_rows=body.max_rows,
            settings=settings,
            offers=offers,
            tenant_id=tenant_id,
            max_running_limit=running_limit,
        )
    totals = out["totals"]
    return EstimateOut(
        fits=totals["fitting"] == totals["elements"],
        total_s=totals["total_s"],
        ipu_hours=totals["ipu_hours"],
        charged_ipu_hours=totals["charged_ipu_hours"],
        expected_wait_s=totals["expected_wait_s"],
        elements=[ElementEstimateOut(**row) for row in out["elements"]],
        elements_truncated=out["elements_truncated"],
        totals=ArrayTotalsOut(**totals),
    )
