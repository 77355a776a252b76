"""The workload catalogue and dry-run estimates."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.deps import DbDep, Reader, SettingsDep
from api.schemas import CatalogueOut, ServeRequest, ServeRowOut
from scheduler.jobspec import WorkloadRequest
from scheduler.services import estimates, rates
from scheduler.services import jobs as job_service
from scheduler.services.tenants import get_tenant
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
    compile_s: float | None = None
    step_s: float | None = None
    total_s: float | None = None
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
        "this tenant now; null if never or not within the forecast",
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
    with db.read() as s:
        plan_rates = allowed = None
        if principal.tenant_id is not None:
            plan = get_tenant(session=s, tenant_id=principal.tenant_id).plan_name
            plan_rates, allowed = rates.plan_terms(session=s, plan_name=plan, preemptible=body.preemptible)
        out = estimates.estimate(
            session=s,
            workload=body.workload,
            ipus=body.ipus,
            machine=body.machine,
            settings=settings,
            rates=plan_rates,
            tenant_id=principal.tenant_id,
            serve=body.serve.batch_sizes if body.serve is not None else None,
            prefer=body.prefer,
            machine_types=allowed,
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
