"""Admission: what a request would be as a job, needing no lock (`_prepare`: its partition, machine
types, options and reservation), and its judgement against its tenant's locked row (`_judge`)."""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

from sqlalchemy import select
from sqlalchemy.orm import Session, configure_mappers
from sqlalchemy.orm.instrumentation import manager_of_class

from scheduler import billing, emulation
from scheduler.errors import (
    DoesNotFit,
    DomainError,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    QuotaExceeded,
    TenantInactive,
)
from scheduler.ids import new_id
from scheduler.jobspec import JobSpec, WorkloadRequest
from scheduler.models import (
    Job,
    JobState,
    Partition,
    Plan,
    Tenant,
)
from scheduler.services import own_models, sessions
from scheduler.services.batch import executables
from scheduler.services.batch.dependencies import DEPENDENCY, check_dependencies
from scheduler.services.capacity import fleet
from scheduler.services.tenancy import rates
from scheduler.services.views import RuntimeLimitView

if TYPE_CHECKING:
    from vipu.emulator.onnxgraph import OnnxWorkload


@dataclass(frozen=True)
class SubmitRequest:
    tenant_id: str
    spec: JobSpec
    idempotency_key: str | None = None
    member_id: str | None = None  # who submits it: the member of the key, mailed as `notify` asks


def _prepare(
    session: Session,
    r: SubmitRequest,
    digest: str | None,
    plan: Any,
    now: datetime,
    fleet_pods: dict[str, int],
    cached: dict[str, bool],
) -> Job:
    """Everything about one request that needs no lock: the job it would be, or why it cannot.

    `cached`: what the batch has read of the executable cache so far (it fills it in)."""
    spec = r.spec
    reserved_partition, in_session = _reserved_partition(session, r)
    # A tenant's own model: its row is share-locked until the commit, so it cannot be removed meanwhile.
    source = own_models.resolve_source(
        session=session, tenant_id=r.tenant_id, model=spec.workload.model, lock=True
    )
    named = spec.machine if spec.machine not in (None, "any") else None
    named, gcd_size = _on_reserved(spec, reserved_partition, named)
    offered = rates.offers(
        plan=plan,
        machine=named,
        present=fleet_pods,
        preemptible=spec.preemptible,
        billed=not in_session,
        pinned=reserved_partition.machine_type if reserved_partition is not None else None,
    )
    candidates = offered.kinds
    max_runtime = min(spec.max_runtime_s or plan.max_runtime_s, plan.max_runtime_s)
    options = _options(
        session,
        r,
        plan,
        offered,
        source,
        reserved_partition,
        gcd_size,
        max_runtime,
        fleet_pods=fleet_pods,
        cached=cached,
    )
    # Shown and planned as its fastest option until it is placed (then as the type it runs on). It
    # reserves what an estimate with its `prefer` promised (billing.promised_kind: compile left out
    # where the tenant's cache holds it), not its dearest option: reserving the dearest refused jobs
    # the estimate said the grant could pay for. Wherever it runs, its settle bills what it ran.
    fastest = min(options, key=lambda kind: (options[kind]["predicted_runtime_s"], candidates.index(kind)))
    size = int(options[fastest]["ipus"])
    predicted = options[fastest]["predicted_runtime_s"]
    reserve = billing.reserve_ipu_ms(options, spec.prefer)
    depends_on = check_dependencies(
        session=session, tenant_id=r.tenant_id, depends_on=spec.depends_on, is_array=False
    )
    if depends_on is not None:
        depends_on["on_unsatisfiable"] = spec.on_unsatisfiable
    notify = list(dict.fromkeys(spec.notify.on)) if spec.notify is not None and spec.notify.on else None
    return job_of_row(
        {
            "id": new_id("job"),
            "tenant_id": r.tenant_id,
            "name": spec.name,
            "spec": _stored_spec(spec, source),
            "model": source.model_id if source is not None else spec.workload.model,
            "task": spec.workload.task,
            "ipus": size,
            "ipus_requested": str(spec.ipus),
            "machine_type": named,
            "options": options,
            "prefer": spec.prefer,
            "partition_name": reserved_partition.name if reserved_partition is not None else None,
            "session_id": spec.session,
            "priority": spec.priority,
            "max_runtime_s": max_runtime,
            "preemptible": spec.preemptible,
            "never_preempt": spec.never_preempt,
            "checkpoint_every_s": spec.checkpoint_every_s,
            "runtime_base_s": 0.0,
            "predicted_runtime_s": predicted,
            "reserved_ipu_ms": reserve,
            "state": JobState.QUEUED,
            "reason": None,
            "wait": None,
            "idempotency_key": r.idempotency_key,
            "request_hash": digest,
            "submit_response": None,
            "created_at": now,
            "submitted_by": r.member_id,
            "notify": notify,
            "updated_at": now,
            "started_at": None,
            "finished_at": None,
            "attempts": 0,
            "cancel_requested": False,
            "array_id": None,
            "array_index": None,
            "params": None,
            "depends_on": depends_on,
            "held_for": DEPENDENCY if depends_on is not None else None,
            "singleton": spec.singleton,
            "endpoint_id": None,
        }
    )


# Every column of `jobs`, in the table's order: a row for the batch's INSERT is read off a job's dict by
# these (`row_of`).
JOB_KEYS = tuple(c.key for c in Job.__table__.columns)
_row_values = operator.itemgetter(*JOB_KEYS)


def job_of_row(row: dict[str, Any]) -> Job:
    """A transient `Job` holding `row`, which must give every column (`JOB_KEYS`) its value.

    `Job(**row)` runs the ORM's attribute machinery once per column, 42 times a job: a sixth of the
    submit writer's time per batch (cProfile, batches of 16). Admission never adds the job to a
    session (its row goes in with Core, `submit_jobs`), so the values go straight into the
    instance's dict, as the ORM does itself when it loads a row; reading and setting attributes
    afterwards works as on any transient object."""
    job: Job = _job_manager().new_instance()
    job.__dict__.update(row)
    return job


def row_of(job: Job) -> dict[str, object]:
    """The `jobs` row of a job made by `job_of_row` (with whatever was set on it since)."""
    return dict(zip(JOB_KEYS, _row_values(job.__dict__), strict=True))


@functools.cache
def _job_manager() -> Any:
    # After the mappers are configured (the first use is at run time, never at import).
    configure_mappers()
    return manager_of_class(Job)


def _reserved_partition(session: Session, r: SubmitRequest) -> tuple[Partition | None, bool]:
    """The partition the job is bound to, if any (its session's, or a reserved one of its tenant), and
    whether it runs in a session."""
    spec = r.spec
    reserved_partition = None
    in_session = False
    if spec.session is not None:
        # A session's job runs on the session's partition like a job in a reserved partition, and
        # pays nothing itself: the session is billed for holding it (scheduler/services/sessions/).
        _, reserved_partition = sessions.session_for_job(
            session=session, tenant_id=r.tenant_id, session_id=spec.session
        )
        in_session = True
    elif spec.partition is not None:
        reserved_partition = fleet.get_live_partition(session=session, name=spec.partition)
        if (
            reserved_partition is None
            or reserved_partition.kind != "reserved"
            or (reserved_partition.tenant_id != r.tenant_id)
        ):
            raise NotFound(f"No reserved partition {spec.partition!r} for this tenant.")
    return reserved_partition, in_session


def _on_reserved(
    spec: JobSpec, reserved_partition: Partition | None, named: str | None
) -> tuple[str | None, int | None]:
    """The machine type the job is bound to and, in a reserved partition, the size of the graph compile
    domain it holds; or why it does not fit there."""
    gcd_size: int | None = None
    if reserved_partition is not None:
        machine = reserved_partition.machine_type
        if named is not None and named != machine:
            raise InvalidRequest(
                f"Partition {reserved_partition.name} is made of {machine} machines; this job asks for "
                f"{named}.",
                field="machine",
            )
        # A job in a reserved partition holds one of its graph compile domains, all of that GCD's IPUs:
        # it is planned, reserved and billed on what it holds. (An admin reserved it for this tenant,
        # so it runs whatever machine types the plan allows elsewhere.)
        named = machine
        gcd_size = reserved_partition.size // reserved_partition.gcds
        if spec.ipus != "auto" and spec.ipus > gcd_size:
            raise LimitExceeded(
                f"The job needs {spec.ipus} IPUs but a graph compile domain of partition "
                f"{reserved_partition.name} holds {gcd_size} (its {reserved_partition.size} IPUs are split "
                f"into {reserved_partition.gcds} GCDs of {gcd_size})."
            )
    return named, gcd_size


def _options(
    session: Session,
    r: SubmitRequest,
    plan: Any,
    offered: rates.Offers,
    source: OnnxWorkload | None,
    reserved_partition: Partition | None,
    gcd_size: int | None,
    max_runtime: float,
    *,
    fleet_pods: dict[str, int],
    cached: dict[str, bool],
) -> dict[str, dict[str, float]]:
    """The job's option on each machine type it is offered and fits (its size, runtime and price), or
    why it fits on none."""
    spec = r.spec
    options: dict[str, dict[str, float]] = {}
    refusals: list[tuple[str, DomainError]] = []
    for kind in offered.kinds:
        try:
            resolved = emulation.resolve(
                spec.workload, spec.ipus if gcd_size is None else gcd_size, kind, source
            )
        except DoesNotFit as exc:
            refusals.append((kind, exc))
            continue
        # Compiled before for this tenant (a run that finds it in the tenant's cache skips
        # compilation and is billed so): plan and reserve without it.
        cache_key = executables.tenant_key(tenant_id=r.tenant_id, key=resolved.executable_key)
        hit = cached.get(cache_key)
        if hit is None:
            hit = cached[cache_key] = executables.is_cached(session=session, key=cache_key)
        resolved = resolved.given_cache(hit)
        size = resolved.ipus if gcd_size is None else gcd_size
        try:
            offered.check_size(kind, size, "this job needs")
            if reserved_partition is None:
                fleet.check_fleet_can_ever_host(
                    session=session, size=size, machine_type=kind, pods=fleet_pods
                )
            # A type on which it would outlast the plan's limit is no option: there it would be
            # stopped unfinished and billed.
            check_runtime(spec, resolved, kind, plan, source)
        except DomainError as exc:
            refusals.append((kind, exc))
            continue
        options[kind] = offered.option(kind, size, min(resolved.predicted_runtime_s, float(max_runtime)))
    if not options:
        if len(refusals) == 1:
            raise refusals[0][1]
        first = refusals[0][1]
        raise type(first)(
            "The job cannot run on any machine type: "
            + "; ".join(f"{kind}: {exc.detail}" for kind, exc in refusals),
            **{k: v for k, v in first.extra.items() if k in ("limit",)},
        )
    return options


def check_runtime(
    spec: JobSpec, resolved: emulation.Resolved, machine: str | None, plan: Any, source: OnnxWorkload | None
) -> None:
    """Refuse a job predicted to run longer than its plan allows, unless the user asked for a
    `max_runtime_s` within the limit (then it runs that long and stops, as asked): accepted, it
    would be stopped unfinished at the limit and billed for the time it ran."""
    limit = int(plan.max_runtime_s)
    if resolved.predicted_runtime_s <= limit:
        return
    if spec.max_runtime_s is not None and spec.max_runtime_s <= limit:
        return
    advice = runtime_advice(
        workload=spec.workload, ipus=resolved.ipus, machine=machine, plan=plan, source=source
    )
    if advice is not None:
        raise LimitExceeded(advice.message(plan.name), limit="max_runtime_s", **advice.fields())


def runtime_advice(
    *,
    workload: WorkloadRequest,
    ipus: int,
    machine: str | None,
    plan: Any,
    source: OnnxWorkload | None = None,
) -> emulation.RuntimeAdvice | None:
    """What of a workload would end within the plan's run-time limit (None: all of it does)."""
    return emulation.runtime_advice(
        workload, ipus, machine, int(plan.max_runtime_s), int(plan.max_partition_size), source
    )


def runtime_limit(
    *,
    session: Session,
    tenant_id: str,
    workload: WorkloadRequest,
    ipus: int,
    machine: str | None,
    max_runtime_s: int | None = None,
) -> RuntimeLimitView:
    """For a dry run: the tenant's run-time limit per job and whether this job ends within it, with
    what would fit when not (what submitting it would answer, see `check_runtime`)."""
    plan = session.execute(
        select(Plan).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == tenant_id)
    ).scalar_one()
    limit = int(plan.max_runtime_s)
    out: RuntimeLimitView = {"max_runtime_s": limit, "within": True, "detail": None}
    if max_runtime_s is not None and max_runtime_s <= limit:
        return out
    # The tenant's own model, when the workload names one (as admission would read it).
    source = own_models.resolve_source(session=session, tenant_id=tenant_id, model=workload.model)
    advice = runtime_advice(workload=workload, ipus=ipus, machine=machine, plan=plan, source=source)
    if advice is not None:
        # `fields()` holds max_runtime_s, predicted_runtime_s, fitting_steps (or _samples), fitting_ipus.
        fields = {**out, **advice.fields(), "within": False, "detail": advice.message(plan.name)}
        return cast(RuntimeLimitView, fields)
    return out


class StoredSpec(TypedDict):
    """A job spec as `Job.spec` stores it: `JobSpec` dumped to JSON."""

    name: str
    workload: dict[str, Any]
    ipus: int | str
    machine: str | None
    prefer: str
    partition: str | None
    session: str | None
    priority: int
    max_runtime_s: int | None
    preemptible: bool
    never_preempt: bool
    checkpoint_every_s: int | None
    notify: dict[str, list[str]] | None


def _stored_spec(spec: JobSpec, source: OnnxWorkload | None) -> StoredSpec:
    """The spec as submitted; an own model's name is stored as its id, which the worker plans from."""
    stored = cast(StoredSpec, spec.model_dump(mode="json", exclude={"array", "sweep"}))
    if source is not None:
        stored["workload"]["model"] = source.model_id
    return stored


def _judge(
    job: Job,
    tenant: Any,
    plan: Any,
    now: datetime,
    reserve: dict[str, int],
    queued_counts: dict[str, int],
) -> None:
    """Admit one prepared job against its tenant's locked row, or raise why not."""
    if tenant.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {tenant.status}.")
    if tenant.expires_at is not None and tenant.expires_at <= now:
        raise TenantInactive(f"The trial of {tenant.name} ended on {tenant.expires_at:%Y-%m-%d}.")
    cost = job.reserved_ipu_ms
    held = reserve.get(tenant.id, 0)
    left = billing.left_ipu_ms(tenant, held=held)
    if cost > left:
        left = max(0, left)
        raise QuotaExceeded(
            f"This job is predicted to cost {billing.ipu_hours(cost):.3f} IPU-hours but only "
            f"{billing.ipu_hours(left):.3f} "
            "of the grant are left (after what running and queued jobs hold).",
            cost_ipu_hours=billing.ipu_hours(cost),
            remaining_ipu_hours=billing.ipu_hours(left),
        )
    queued = queued_counts.get(tenant.id, 0)
    if queued >= plan.max_queued_jobs:
        raise LimitExceeded(
            f"The {plan.name} plan allows {plan.max_queued_jobs} queued jobs; wait for some to start.",
            limit="max_queued_jobs",
        )
    reserve[tenant.id] = held + cost
    queued_counts[tenant.id] = queued + 1
