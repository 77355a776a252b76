"""Dependencies between jobs, as a submission states them (docs/sweeps.md); the scheduler resolves
them (scheduler/services/batch/arrays.py, `resolve_dependencies`)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.errors import InvalidRequest, NotFound
from scheduler.jobspec import DependsOn
from scheduler.models import Job, JobArray

DEPENDENCY = "dependency"  # Job.held_for while its dependencies keep it from the scheduler


class StoredDependency(TypedDict):
    job: str
    type: str


class StoredDependencies(TypedDict):
    """`Job.depends_on`: what a held job waits for."""

    mode: str  # all | any
    on: list[StoredDependency]
    on_unsatisfiable: NotRequired[str]  # cancel | hold


def check_dependencies(
    *, session: Session, tenant_id: str, depends_on: DependsOn | None, is_array: bool
) -> StoredDependencies | None:
    """The stored form of a submission's dependencies, or NotFound naming an id that is not the
    tenant's (another tenant's is as missing as one that never was). Each exists already, so no
    cycle can form."""
    if depends_on is None:
        return None
    items = depends_on.items
    job_ids = sorted({d.job for d in items if d.job.startswith("job_")})
    array_ids = sorted({d.job for d in items if d.job.startswith("arr_")})
    found: set[str] = set()
    if job_ids:
        found |= set(
            session.execute(select(Job.id).where(Job.id.in_(job_ids), Job.tenant_id == tenant_id)).scalars()
        )
    if array_ids:
        found |= set(
            session.execute(
                select(JobArray.id).where(JobArray.id.in_(array_ids), JobArray.tenant_id == tenant_id)
            ).scalars()
        )
    for d in items:
        if d.job not in found:
            raise NotFound(f"depends_on: no job or array {d.job}.", field="depends_on")
        if d.type == "aftercorr" and (not is_array or not d.job.startswith("arr_")):
            raise InvalidRequest(
                "depends_on: `aftercorr` ties an array's elements to another array's: both must be arrays.",
                field="depends_on",
            )
    return {"mode": depends_on.mode, "on": [{"job": d.job, "type": d.type} for d in items]}
