"""The workload catalogue and dry-run estimates."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.deps import DbDep, Reader
from scheduler.jobspec import WorkloadRequest
from scheduler.services import estimates, rates
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


class EstimateOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    fits: bool
    plan: dict[str, Any] | None = None
    throughput: float | None = Field(None, description="samples/s")
    compile_s: float | None = None
    step_s: float | None = None
    total_s: float | None = None
    ipu_hours: float | None = None
    charged_ipu_hours: float | None = Field(None, description="IPU-hours x the type's rate: grant spent")
    machine: str | None = None
    machine_options: dict[str, dict[str, Any]] | None = Field(
        None, description="With machine `any`: each type's answer (fits, ipus, total_s, expected_wait_s, ...)"
    )
    expected_wait_s: float | None = Field(
        None, description="Cluster seconds before it would start; null if never"
    )
    error: str | None = None


@router.get("/workloads", summary="The workload catalogue with each workload's parameters and limits")
def list_workloads(principal: Reader) -> dict[str, Any]:
    return {
        "items": [w.to_dict() for w in emulator.catalogue()],
        "machines": [m.to_dict() for m in emulator.MACHINES.values()],
    }


@router.post(
    "/estimates", response_model=EstimateOut, summary="Dry run: plan, fit, time, cost and queue wait"
)
def create_estimate(body: EstimateRequest, principal: Reader, db: DbDep) -> EstimateOut:
    with db.read() as s:
        plan_rates = None
        if principal.tenant_id is not None:
            plan = get_tenant(session=s, tenant_id=principal.tenant_id).plan_name
            plan_rates = rates.plan_terms(session=s, plan_name=plan)[0]
        out = estimates.estimate(
            session=s,
            workload=body.workload,
            ipus=body.ipus,
            machine=body.machine,
            rates=plan_rates,
            tenant_id=principal.tenant_id,
        )
    return EstimateOut(**out)
