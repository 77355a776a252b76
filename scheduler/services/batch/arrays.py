"""Job arrays and parameter sweeps: one handle for many jobs (docs/sweeps.md).

An array is a row of its own (`JobArray`) and its elements are ordinary jobs (`Job.array_id`,
`Job.array_index`, `Job.params`): they are placed, run, billed and listed as jobs are. What is
particular to arrays happens in three places:

- Admission (`submit_array`): the elements are prepared as single jobs are (`jobs._prepare`, once
  per distinct element spec), judged together under the tenant's row lock, inserted in bulk, and the
  whole sweep's predicted cost is reserved in one guarded UPDATE. Nothing is stored when it is
  refused. A pending array counts once against the plan's queued jobs.
- The scheduler's pass (`throttle`): elements past an array's `max_running`, singleton jobs whose
  name runs already, and jobs held for their dependencies are not shown to the policy.
- Dependencies (`dependencies.resolve_dependencies`, each scheduler iteration): a held job is
  released when its condition holds and cancelled (or kept, with `on_unsatisfiable: hold`) when it
  no longer can.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.db import changed
from scheduler.errors import (
    Conflict,
    DomainError,
    IdempotencyConflict,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    QuotaExceeded,
    TenantInactive,
)
from scheduler.ids import new_id
from scheduler.jobspec import (
    JobSpec,
    compress_indices,
    parse_indices,
)
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    Job,
    JobArray,
    JobEvent,
    JobState,
    MeterEvent,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services.batch import attempts
from scheduler.services.batch import jobs as job_service
from scheduler.services.batch.dependencies import DEPENDENCY, check_dependencies
from scheduler.services.batch.job_state import finalize_job
from scheduler.services.capacity import fleet
from scheduler.services.tenancy.scope import Scope, restrict, sees

_ARRAY_FIELDS = ("array", "sweep")


# ------------------------------------------------------------------------------------ expansion


@dataclass(frozen=True)
class Element:
    index: int
    params: dict[str, Any] | None
    spec: JobSpec


def expand(spec: JobSpec, *, limit: int) -> list[Element]:
    """The elements an array or sweep submission makes, in index order; InvalidRequest naming the
    field when it is malformed or has more than `limit` elements (nothing is expanded past it)."""
    base = spec.model_dump(mode="json", exclude={"array", "sweep", "depends_on"})
    if spec.sweep is None:
        assert spec.array is not None and spec.array.indices is not None
        try:
            indices = parse_indices(spec.array.indices, limit=limit)
        except ValueError as exc:
            raise InvalidRequest(
                f"array.indices: {exc} (this plan allows {limit:,} elements per array).",
                field="array.indices",
                limit="max_array_size",
            ) from exc
        one = JobSpec.model_validate(base)
        return [Element(i, None, one) for i in indices]
    sweep = spec.sweep
    names = list(sweep.parameters)
    points: list[dict[str, Any]]
    if sweep.method == "grid":
        size = math.prod(len(p.values or ()) for p in sweep.parameters.values())
        if size > limit:
            raise InvalidRequest(
                f"sweep: the grid has {size:,} points; this plan allows {limit:,} elements per array.",
                field="sweep.parameters",
                limit="max_array_size",
            )
        points = [
            dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(sweep.parameters[n].values or () for n in names))
        ]
    else:
        samples = sweep.samples or 0
        if samples > limit:
            raise InvalidRequest(
                f"sweep.samples: {samples:,}; this plan allows {limit:,} elements per array.",
                field="sweep.samples",
                limit="max_array_size",
            )
        rng = random.Random(sweep.seed)
        points = [{n: _draw(rng, sweep.parameters[n]) for n in names} for _ in range(samples)]
    # Points that make the same spec are prepared once: a spec is validated per distinct point.
    made: dict[str, JobSpec] = {}
    out: list[Element] = []
    for index, point in enumerate(points):
        key = repr(sorted(point.items()))
        element = made.get(key)
        if element is None:
            element = made[key] = _apply(base, point)
        out.append(Element(index, point, element))
    return out


def _draw(rng: random.Random, p: Any) -> Any:
    if p.values is not None:
        return rng.choice(p.values)
    lo, hi = float(p.min), float(p.max)
    if p.distribution == "int_uniform":
        return rng.randint(math.ceil(lo), math.floor(hi))
    if p.distribution == "log_uniform":
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return rng.uniform(lo, hi)


def _apply(base: Mapping[str, Any], point: Mapping[str, Any]) -> JobSpec:
    spec: dict[str, Any] = {**base, "workload": dict(base["workload"])}
    for path, value in point.items():
        parts = path.split(".")
        if parts[0] == "workload" and len(parts) == 3:  # workload.dims.<name>
            spec["workload"]["dims"] = {**(spec["workload"].get("dims") or {}), parts[2]: value}
        elif parts[0] == "workload":
            spec["workload"][parts[1]] = value
        else:
            spec[parts[0]] = value
    if "workload.samples" in point:
        spec["workload"]["steps"] = None
    elif "workload.steps" in point:
        spec["workload"]["samples"] = None
    try:
        return JobSpec.model_validate(spec)
    except ValueError as exc:
        raise InvalidRequest(
            f"sweep.parameters: the point {dict(point)} makes an invalid job spec: {exc}",
            field="sweep.parameters",
        ) from exc


# ------------------------------------------------------------------------------------- admission


@dataclass
class SubmittedArray:
    array: JobArray
    replayed: bool


_plans = Plan.__table__


def submit_array(
    *,
    session: Session,
    tenant_id: str,
    spec: JobSpec,
    idempotency_key: str | None = None,
    member_id: str | None = None,
) -> SubmittedArray:
    """Admit an array or sweep in the caller's transaction: all of it, or nothing stored or reserved."""
    if idempotency_key is not None:
        prior = _keyed(session, tenant_id, idempotency_key)
        if prior is not None:
            if prior.spec != _request_body(spec):
                raise IdempotencyConflict(
                    "This Idempotency-Key was used for a different request body.", array_id=prior.id
                )
            return SubmittedArray(prior, replayed=True)
    conn = session.connection()
    plan_row = session.execute(
        select(Plan).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == tenant_id)
    ).scalar_one_or_none()
    if plan_row is None:
        raise NotFound("No such tenant.")
    limit = int(plan_row.max_array_size)
    max_running = spec.array.max_running if spec.array is not None else None
    if max_running is not None and max_running > plan_row.max_concurrent_jobs:
        raise InvalidRequest(
            f"array.max_running: {max_running} is more than the {plan_row.name} plan's "
            f"{plan_row.max_concurrent_jobs} running jobs.",
            field="array.max_running",
            limit="max_concurrent_jobs",
        )
    elements = expand(spec, limit=limit)
    if not elements:
        raise InvalidRequest("The array has no elements.", field="array.indices")
    stored_deps = check_dependencies(
        session=session, tenant_id=tenant_id, depends_on=spec.depends_on, is_array=True
    )
    if stored_deps is not None:
        stored_deps["on_unsatisfiable"] = spec.on_unsatisfiable
    # Each distinct element spec is prepared (emulated, priced) once, as a single job would be.
    fleet_pods = fleet.pods_by_type(session=session, max_age_s=fleet.PODS_CACHE_S)
    now = utcnow()
    prepared: dict[int, Job] = {}
    cached: dict[str, bool] = {}  # the executable cache as read so far, shared by the elements
    for e in elements:
        if id(e.spec) in prepared:
            continue
        # `member_id`: who submits it, whom the elements' `notify` mail goes to, as for a single job.
        request = job_service.SubmitRequest(tenant_id, e.spec, None, member_id)
        try:
            prepared[id(e.spec)] = job_service._prepare(
                session, request, job_service.request_hash(e.spec), plan_row, now, fleet_pods, cached
            )
        except DomainError as exc:
            if e.params is None:
                raise
            exc.detail = f"sweep element {e.index} ({e.params}): {exc.detail}"
            exc.extra.setdefault("field", "sweep.parameters")
            raise
    total = sum(prepared[id(e.spec)].reserved_ipu_ms for e in elements)

    # Judged under the tenant's row lock, as single jobs are (jobs.submit_jobs): one guarded UPDATE.
    tenant = conn.execute(job_service._LOCK_TENANTS, {"ids": [tenant_id]}).one()
    if idempotency_key is not None and _keyed(session, tenant_id, idempotency_key) is not None:
        # A request with this key was admitted while this one waited for the lock: replay it rather
        # than judge this one against a grant that request has already taken.
        raise job_service.IdempotencyRace()
    if tenant.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {tenant.status}.")
    if tenant.expires_at is not None and tenant.expires_at <= now:
        raise TenantInactive(f"The trial of {tenant.name} ended on {tenant.expires_at:%Y-%m-%d}.")
    left = billing.left_ipu_ms(tenant, held=0)
    if total > left:
        raise QuotaExceeded(
            f"This array of {len(elements):,} jobs is predicted to cost {billing.ipu_hours(total):.3f} "
            f"IPU-hours but only {billing.ipu_hours(max(0, left)):.3f} of the grant are left (after what "
            "running and queued jobs hold).",
            cost_ipu_hours=billing.ipu_hours(total),
            remaining_ipu_hours=billing.ipu_hours(max(0, left)),
        )
    queued = int(tenant.queued_jobs_bound)
    if queued + 1 > plan_row.max_queued_jobs:
        queued = conn.execute(
            job_service._QUEUED_JOBS,
            {"t": tenant_id, "cap": plan_row.max_queued_jobs + 1},
        ).scalar_one()
        if queued + 1 > plan_row.max_queued_jobs:
            raise LimitExceeded(
                f"The {plan_row.name} plan allows {plan_row.max_queued_jobs} queued jobs (an array counts "
                "once); wait for some to start.",
                limit="max_queued_jobs",
            )

    array = JobArray(
        id=new_id("arr"),
        tenant_id=tenant_id,
        name=spec.name,
        size=len(elements),
        indices=compress_indices([e.index for e in elements])
        if spec.sweep is None
        else f"0-{len(elements) - 1}",
        max_running=spec.array.max_running if spec.array is not None else None,
        sweep=spec.sweep.model_dump(mode="json") if spec.sweep is not None else None,
        spec=_request_body(spec),
        reserved_at_submit_ipu_ms=total,
        idempotency_key=idempotency_key,
        created_at=now,
        updated_at=now,
    )
    array_row = [{c.key: getattr(array, c.key) for c in JobArray.__table__.columns}]
    if idempotency_key is not None:
        # The key's unique index decides a race the read above cannot see: another request with
        # this key committed after that read (it held the tenant's lock first). The caller retries
        # in a new transaction, which replays that request's array.
        try:
            with session.begin_nested():
                conn.execute(insert(JobArray.__table__), array_row)
        except IntegrityError as exc:
            raise job_service.IdempotencyRace() from exc
    else:
        conn.execute(insert(JobArray.__table__), array_row)
    columns = job_service._JOB_COLUMNS
    rows: list[dict[str, Any]] = []
    events: list[Any] = []
    for e in elements:
        template = prepared[id(e.spec)]
        row = {c.key: getattr(template, c.key) for c in columns}
        job_id = new_id("job")
        row.update(
            id=job_id,
            name=f"{spec.name}[{e.index}]",
            array_id=array.id,
            array_index=e.index,
            params=e.params,
            depends_on=stored_deps,
            held_for=DEPENDENCY if stored_deps is not None else None,
            singleton=spec.singleton,
            idempotency_key=None,
            request_hash=None,
        )
        rows.append(row)
        template.id = job_id
        events.append(job_service._queued_event(template, now))
    for chunk in _chunks(rows, 2000):
        conn.execute(insert(Job.__table__), chunk)
    for chunk in _chunks(events, 5000):
        conn.execute(insert(JobEvent.__table__), chunk)
    done = conn.execute(
        job_service._RESERVE,
        {"t": tenant_id, "amount": total, "bound": queued + 1},
    ).rowcount
    assert done == 1, f"quota guard refused a reservation judged under the tenant's lock ({tenant_id})"
    return SubmittedArray(array, replayed=False)


def _keyed(session: Session, tenant_id: str, key: str) -> JobArray | None:
    return session.execute(
        select(JobArray)
        .where(JobArray.tenant_id == tenant_id, JobArray.idempotency_key == key)
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def _request_body(spec: JobSpec) -> dict[str, object]:
    return spec.model_dump(mode="json", exclude_defaults=True)


def _chunks(rows: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(rows), n):
        yield rows[i : i + n]


# ------------------------------------------------------------------------------------------ reading


@dataclass
class ArraySummary:
    array: JobArray
    by_state: dict[str, int]
    completed: list[int]
    failed: list[int]
    used_ipu_ms: int
    reserved_ipu_ms: int


def get_array(*, session: Session, array_id: str, scope: Scope) -> JobArray:
    array = session.get(JobArray, array_id)
    if array is None or not sees(scope, array.tenant_id):
        raise NotFound(f"No array {array_id}.")
    return array


def list_arrays(*, session: Session, scope: Scope, after: str | None, limit: int) -> list[JobArray]:
    stmt = restrict(select(JobArray).order_by(JobArray.id.desc()).limit(limit), JobArray.tenant_id, scope)
    if after is not None:
        stmt = stmt.where(JobArray.id < after)
    return list(session.execute(stmt).scalars())


def summaries(*, session: Session, arrays: Sequence[JobArray]) -> list[ArraySummary]:
    """Each array's elements by state, its completed and failed indices and IPU-hours, in two
    queries for a page of arrays."""
    ids = [a.id for a in arrays]
    by_state: dict[str, dict[str, int]] = {a: {} for a in ids}
    reserved: dict[str, int] = dict.fromkeys(ids, 0)
    done: dict[str, list[int]] = {a: [] for a in ids}
    failed: dict[str, list[int]] = {a: [] for a in ids}
    if ids:
        for array_id, state, n, held in session.execute(
            select(Job.array_id, Job.state, func.count(), func.sum(Job.reserved_ipu_ms))
            .where(Job.array_id.in_(ids))
            .group_by(Job.array_id, Job.state)
        ).tuples():
            by_state[str(array_id)][state] = int(n)
            reserved[str(array_id)] += int(held or 0)
        for array_id, index, state in session.execute(
            select(Job.array_id, Job.array_index, Job.state)
            .where(
                Job.array_id.in_(ids),
                Job.state.in_((JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)),
            )
            .order_by(Job.array_id, Job.array_index)
        ).tuples():
            (done if state == JobState.SUCCEEDED else failed)[str(array_id)].append(int(index or 0))
    used: dict[str, int] = {}
    if ids:
        used = {
            str(a): int(ms or 0)
            for a, ms in session.execute(
                select(Job.array_id, func.sum(MeterEvent.ipu_ms))
                .join(MeterEvent, MeterEvent.job_id == Job.id)
                .where(Job.array_id.in_(ids))
                .group_by(Job.array_id)
            ).tuples()
        }
    return [
        ArraySummary(a, by_state[a.id], done[a.id], failed[a.id], used.get(a.id, 0), reserved[a.id])
        for a in arrays
    ]


def array_state(by_state: Mapping[str, int], size: int) -> str:
    """`queued` until one starts, `running` while any is queued or running, then `succeeded` when all
    did, `cancelled` when all ended cancelled, else `failed`."""
    running = by_state.get(JobState.RUNNING, 0)
    queued = by_state.get(JobState.QUEUED, 0)
    if queued == size:
        return "queued"
    if running or queued:
        return "running"
    if by_state.get(JobState.SUCCEEDED, 0) == size:
        return "succeeded"
    if by_state.get(JobState.CANCELLED, 0) == size:
        return "cancelled"
    return "failed"


def elements(
    *, session: Session, array_id: str, after: int | None, limit: int, state: str | None = None
) -> list[Job]:
    stmt = select(Job).where(Job.array_id == array_id).order_by(Job.array_index).limit(limit)
    if after is not None:
        stmt = stmt.where(Job.array_index > after)
    if state is not None:
        stmt = stmt.where(Job.state == state)
    return list(session.execute(stmt).scalars())


@dataclass(frozen=True)
class ElementResult:
    """One element of an array as its results table shows it: its run so far or as it ended."""

    index: int
    job_id: str
    state: str
    params: dict[str, Any] | None
    run_s: float | None  # cluster seconds its latest attempt ran
    throughput: float | None  # samples/s of that attempt (its average once it ended)
    ipu_hours: float  # billed to it, every attempt


def results(*, session: Session, array_id: str, scope: Scope, now: datetime) -> list[ElementResult]:
    """Every element of the array by index, with its latest attempt's run time and throughput and
    the IPU-hours billed to it: three queries, whatever the array's size."""
    get_array(session=session, array_id=array_id, scope=scope)
    rows = list(
        session.execute(
            select(Job.id, Job.array_index, Job.state, Job.params, Job.attempts)
            .where(Job.array_id == array_id)
            .order_by(Job.array_index)
        ).tuples()
    )
    latest: dict[str, Attempt] = {
        a.job_id: a
        for a in session.execute(
            select(Attempt)
            .join(Job, Job.id == Attempt.job_id)
            .where(Job.array_id == array_id, Attempt.number == Job.attempts)
        ).scalars()
    }
    billed = dict(
        session.execute(
            select(MeterEvent.job_id, func.sum(MeterEvent.ipu_ms))
            .join(Job, Job.id == MeterEvent.job_id)
            .where(Job.array_id == array_id)
            .group_by(MeterEvent.job_id)
        )
        .tuples()
        .all()
    )
    out = []
    for job_id, index, state, params, _ in rows:
        attempt = latest.get(job_id)
        progress = attempts.progress_of(attempt, now) if attempt is not None else None
        if progress is None and attempt is not None and attempt.timeline and attempt.cluster_s > 0:
            # Ended without its agent's last progress (handed back, stopped by the control plane):
            # where its timeline had it when it stopped.
            progress = attempts.progress_at(attempt, attempt.cluster_s)
        out.append(
            ElementResult(
                index=int(index or 0),
                job_id=job_id,
                state=state,
                params=params,
                run_s=None
                if attempt is None
                else float(progress["cluster_s"] if progress else attempt.cluster_s),
                throughput=None
                if not progress or not progress.get("throughput")
                else float(progress["throughput"]),
                ipu_hours=billing.ipu_hours(int(billed.get(job_id) or 0)),
            )
        )
    return out


# -------------------------------------------------------------------------------------- changing


def _pick(session: Session, array: JobArray, indices: str, states: Collection[str]) -> list[Job]:
    if indices == "failed":
        chosen = None
        states = [s for s in states if s in (JobState.FAILED, JobState.CANCELLED)]
    else:
        try:
            chosen = parse_indices(indices, limit=array.size)
        except ValueError as exc:
            raise InvalidRequest(f"indices: {exc}.", field="indices") from exc
    stmt = (
        select(Job)
        .where(Job.array_id == array.id, Job.state.in_(list(states)))
        .order_by(Job.id)
        .with_for_update(key_share=True)
        .execution_options(populate_existing=True)
    )
    if chosen is not None:
        stmt = stmt.where(Job.array_index.in_(chosen))
    return list(session.execute(stmt).scalars())


def cancel_elements(*, session: Session, array_id: str, scope: Scope, indices: str | None) -> list[str]:
    """Cancel the array's queued and running elements (those of `indices`, or all); returns their ids."""
    array = get_array(session=session, array_id=array_id, scope=scope)
    jobs = _pick(
        session,
        array,
        indices or f"0-{max(0, _max_index(session, array))}",
        (JobState.QUEUED, JobState.RUNNING),
    )
    if not jobs:
        return []
    live = dict(
        session.execute(
            select(Attempt.job_id, Attempt.id).where(
                Attempt.job_id.in_([j.id for j in jobs]), Attempt.state.in_(LIVE_ATTEMPT_STATES)
            )
        )
        .tuples()
        .all()
    )
    for job in jobs:
        job.cancel_requested = True
        job.updated_at = utcnow()
    if live:
        attempts.stop_running(
            session=session,
            attempt_ids=list(live.values()),
            outcome=AttemptState.CANCELLED,
            reason="cancelled by user",
            max_attempts=1,
        )
    released = 0
    events: list[dict[str, Any]] = []
    for job in jobs:
        if job.state in FINAL_JOB_STATES:
            continue
        released += job.reserved_ipu_ms
        job.held_for = None
        finalize_job(
            session=session,
            job=job,
            state=JobState.CANCELLED,
            reason="cancelled by user",
            release=False,
            events=events,
        )
        job.reserved_ipu_ms = 0
    if events:
        session.execute(insert(JobEvent.__table__), events)
    if released:
        session.execute(
            update(Tenant)
            .where(Tenant.id == array.tenant_id)
            .values(reserved_ipu_ms=Tenant.reserved_ipu_ms - released)
        )
    session.flush()
    return [j.id for j in jobs]


def _max_index(session: Session, array: JobArray) -> int:
    return int(
        session.execute(select(func.max(Job.array_index)).where(Job.array_id == array.id)).scalar_one() or 0
    )


def retry_elements(*, session: Session, array_id: str, scope: Scope, indices: str) -> list[str]:
    """Queue the array's failed or cancelled elements again (`failed`: all of them), reserving their
    predicted cost again by a guarded update as admission does; returns their ids."""
    array = get_array(session=session, array_id=array_id, scope=scope)
    jobs = _pick(session, array, indices, (JobState.FAILED, JobState.CANCELLED))
    if not jobs:
        raise Conflict(f"Array {array_id} has no failed or cancelled elements among {indices!r}.")
    reserve = {
        j.id: (
            billing.reserve_ipu_ms(j.options, j.prefer or "time")
            if j.options
            else billing.charged_ipu_ms(j.ipus, j.predicted_runtime_s, 1.0)
        )
        for j in jobs
    }
    total = sum(reserve.values())
    tenant = session.get(Tenant, array.tenant_id)
    assert tenant is not None
    if tenant.status != "active":
        raise Conflict(f"Tenant {tenant.name} is {tenant.status}.")
    done = changed(
        session,
        update(Tenant)
        .where(
            Tenant.id == tenant.id,
            Tenant.used_ipu_ms + Tenant.reserved_ipu_ms + total <= Tenant.quota_ipu_ms,
        )
        .values(
            reserved_ipu_ms=Tenant.reserved_ipu_ms + total, queued_jobs_bound=Tenant.queued_jobs_bound + 1
        )
        .execution_options(synchronize_session=False),
    )
    if done != 1:
        raise QuotaExceeded(
            f"Retrying {len(jobs)} elements is predicted to cost {billing.ipu_hours(total):.3f} IPU-hours, "
            "more than is left of the grant.",
            cost_ipu_hours=billing.ipu_hours(total),
        )
    now = utcnow()
    events = []
    for job in jobs:
        job.state = JobState.QUEUED
        job.reason = None
        job.wait = None
        job.cancel_requested = False
        job.finished_at = None
        job.updated_at = now
        job.reserved_ipu_ms = reserve[job.id]
        job.runtime_base_s = 0.0
        # A retry runs it now: its dependencies were met, or its owner asks for it regardless.
        job.held_for = None
        events.append(
            {
                "job_id": job.id,
                "attempt": None,
                "kind": "state",
                "at": now,
                "message": "queued again: retried by its owner",
                "data": {"state": "queued", "retried": True},
            }
        )
    session.execute(insert(JobEvent.__table__), events)
    session.flush()
    return [j.id for j in jobs]


def update_array(
    *, session: Session, array_id: str, scope: Scope, max_running: int | None, change: bool = True
) -> JobArray:
    """Change an array's `max_running` (None lifts it); `change=False` changes nothing."""
    array = get_array(session=session, array_id=array_id, scope=scope)
    if not change:
        return array
    if max_running is not None:
        plan = session.execute(
            select(Plan).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == array.tenant_id)
        ).scalar_one()
        if max_running > plan.max_concurrent_jobs:
            raise InvalidRequest(
                f"max_running: {max_running} is more than the {plan.name} plan's {plan.max_concurrent_jobs} "
                "running jobs.",
                field="max_running",
                limit="max_concurrent_jobs",
            )
    array.max_running = max_running
    array.updated_at = utcnow()
    session.flush()
    return array


# --------------------------------------------------------------------------------------- scheduling


@dataclass(frozen=True)
class Gate:
    """What the scheduler's pass reads once to keep elements past `max_running` and singleton jobs
    whose name runs from the policy."""

    room: dict[str, int]  # array id -> elements it may start this pass
    running_names: set[tuple[str, str]]  # (tenant, name) of running singleton-guarded jobs
    # array id -> its max_running and its elements running now (arrays with a max_running only),
    # for the forecast (policy.HeldArray)
    caps: dict[str, int] = field(default_factory=dict)
    live: dict[str, frozenset[str]] = field(default_factory=dict)


def gate(
    *, session: Session, array_ids: Collection[str], singleton_names: Collection[tuple[str, str]]
) -> Gate:
    room: dict[str, int] = {}
    caps: dict[str, int] = {}
    live: dict[str, frozenset[str]] = {}
    if array_ids:
        limits = dict(
            session.execute(
                select(JobArray.id, JobArray.max_running).where(
                    JobArray.id.in_(sorted(array_ids)), JobArray.max_running.is_not(None)
                )
            )
            .tuples()
            .all()
        )
        if limits:
            running: dict[str, set[str]] = {}
            for array_id, job_id in session.execute(
                select(Job.array_id, Job.id)
                .join(Attempt, Attempt.job_id == Job.id)
                .where(Job.array_id.in_(sorted(limits)), Attempt.state.in_(LIVE_ATTEMPT_STATES))
            ).tuples():
                running.setdefault(str(array_id), set()).add(job_id)
            room = {str(a): max(0, int(m or 0) - len(running.get(a, ()))) for a, m in limits.items()}
            caps = {str(a): int(m or 0) for a, m in limits.items()}
            live = {a: frozenset(running.get(a, ())) for a in caps}
    names: set[tuple[str, str]] = set()
    if singleton_names:
        tenants = sorted({t for t, _ in singleton_names})
        for tenant_id, name in session.execute(
            select(Job.tenant_id, Job.name)
            .join(Attempt, Attempt.job_id == Job.id)
            .where(Job.tenant_id.in_(tenants), Attempt.state.in_(LIVE_ATTEMPT_STATES))
        ).tuples():
            if (tenant_id, name) in singleton_names:
                names.add((tenant_id, name))
    return Gate(room, names, caps, live)


__all__ = [
    "DEPENDENCY",
    "ArraySummary",
    "Element",
    "ElementResult",
    "Gate",
    "SubmittedArray",
    "array_state",
    "cancel_elements",
    "check_dependencies",
    "elements",
    "expand",
    "gate",
    "get_array",
    "list_arrays",
    "results",
    "retry_elements",
    "submit_array",
    "summaries",
    "update_array",
]
