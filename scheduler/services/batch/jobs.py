"""Jobs: submit (with admission and quota reservation), read, list, cancel."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

import orjson
from sqlalchemy import bindparam, delete, func, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler import billing, emulation
from scheduler.db import changed
from scheduler.errors import (
    Conflict,
    DoesNotFit,
    DomainError,
    IdempotencyConflict,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    QuotaExceeded,
    TenantInactive,
)
from scheduler.ids import new_id
from scheduler.jobspec import JobSpec, WorkloadRequest, compress_indices
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    SERVE_TASK,
    Attempt,
    AttemptState,
    Job,
    JobEvent,
    JobState,
    Partition,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services import own_models, sessions
from scheduler.services.batch import attempts, checkpoints, executables
from scheduler.services.batch.dependencies import DEPENDENCY, check_dependencies
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.capacity import fleet
from scheduler.services.tenancy import rates
from scheduler.services.tenancy.scope import AllTenants, Scope, restrict, sees
from scheduler.services.views import RuntimeLimitView, WaitView

if TYPE_CHECKING:
    from vipu.emulator.onnxgraph import OnnxWorkload


class IdempotencyRace(Exception):
    """Another request with the same Idempotency-Key committed first; retry to replay it."""


@dataclass
class Submitted:
    job: Job
    replayed: bool


def request_hash(spec: JobSpec) -> str:
    """The digest an Idempotency-Key is bound to: what the client asked for, not the defaults.

    Fields left at their defaults are left out, so a field added later with a default (or a
    default filled in by a newer release) does not turn a retry across an upgrade into a conflict.
    """
    return _digest(spec.model_dump(mode="json", exclude_defaults=True))


def _legacy_request_hash(spec: JobSpec) -> str:
    # Keys stored before request_hash left defaults out hashed the whole spec; they expire with
    # their jobs' retention, and until then a retry of such a request still replays.
    return _digest(spec.model_dump(mode="json"))


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class SubmitRequest:
    tenant_id: str
    spec: JobSpec
    idempotency_key: str | None = None
    member_id: str | None = None  # who submits it: the member of the key, mailed as `notify` asks


Outcome = Submitted | DomainError


def submit_job(
    *,
    session: Session,
    tenant_id: str,
    spec: JobSpec,
    idempotency_key: str | None = None,
    render: Callable[[Job], dict[str, Any]] | None = None,
    member_id: str | None = None,
) -> Submitted:
    """Admit one job (see `submit_jobs`); raises its DomainError when refused."""
    (outcome,) = submit_jobs(
        session=session, requests=[SubmitRequest(tenant_id, spec, idempotency_key, member_id)], render=render
    )
    if isinstance(outcome, DomainError):
        raise outcome
    return outcome


def submit_jobs(
    *,
    session: Session,
    requests: Sequence[SubmitRequest],
    render: Callable[[Job], dict[str, Any]] | None = None,
) -> list[Outcome]:
    """Admit a batch of jobs in the caller's transaction: one outcome per request, in order.

    Each job is validated against the emulator, the fleet and its plan, and its predicted cost
    reserved from its tenant's grant. The jobs and their first events are inserted first; only
    then is each tenant's row locked (FOR NO KEY UPDATE, in id order so batches never deadlock) to
    judge status, quota and the queued-job limit on exact figures, refused jobs are deleted again,
    and the reservation is one guarded UPDATE per tenant that the database itself refuses if it
    would pass the grant. The tenant row is therefore locked for two statements and the commit,
    which is what lets concurrent batches of one tenant (several API processes) follow each
    other quickly.

    The queued-job limit is judged on the tenant's `queued_jobs_bound` (an upper bound kept under
    the same lock) and the queue is counted, no further than the limit, only when that bound
    would pass it. A job put back in the queue by a platform failure is not in the bound until
    the next count: such jobs may take a tenant past its limit, submissions never do.

    Raises IdempotencyRace when another transaction committed one of the batch's
    Idempotency-Keys first: retry, and the retry replays it.
    """
    outcomes: list[Outcome | _Later | None] = [None] * len(requests)
    digests = [request_hash(r.spec) for r in requests]

    # Idempotency-Key replays, from the database and from earlier requests of this batch.
    keyed = {(r.tenant_id, r.idempotency_key) for r in requests if r.idempotency_key is not None}
    existing: dict[tuple[str, str], Job] = {}
    if keyed:
        for job in session.execute(
            select(Job).where(tuple_(Job.tenant_id, Job.idempotency_key).in_(list(keyed)))
        ).scalars():
            existing[(job.tenant_id, job.idempotency_key or "")] = job
    first_of_key: dict[tuple[str, str], int] = {}
    for n, r in enumerate(requests):
        if r.idempotency_key is None:
            continue
        k = (r.tenant_id, r.idempotency_key)
        prior = existing.get(k)
        if prior is not None:
            outcomes[n] = (
                Submitted(prior, replayed=True)
                if prior.request_hash in (digests[n], _legacy_request_hash(r.spec))
                else IdempotencyConflict(
                    "This Idempotency-Key was used for a different request body.", job_id=prior.id
                )
            )
        elif k in first_of_key:
            outcomes[n] = _Later(first_of_key[k])  # resolved once the first one is decided
        else:
            first_of_key[k] = n

    # Validate against plans (not locked: plans are admin settings) and the fleet; insert.
    tenant_ids = sorted({r.tenant_id for n, r in enumerate(requests) if outcomes[n] is None})
    plans: dict[str, Any] = {}
    conn = session.connection()  # Core statements need none of the ORM session's machinery
    if tenant_ids:
        plans = {row.tenant_id: row for row in conn.execute(_PLANS_OF_TENANTS, {"ids": tenant_ids})}
    fleet_pods = fleet.pods_by_type(session=session, max_age_s=fleet.PODS_CACHE_S) if plans else {}
    now = utcnow()
    candidates: dict[int, Job] = {}
    # The tenant's executable cache, read once per key per batch: a batch is mostly the same few
    # workloads, and a query per job was a quarter of the writer's time (py-spy, 16 clients).
    cached: dict[str, bool] = {}
    for n, r in enumerate(requests):
        if outcomes[n] is not None:
            continue
        plan = plans.get(r.tenant_id)
        if plan is None:
            outcomes[n] = NotFound("No such tenant.")
            continue
        try:
            job = _prepare(session, r, digests[n], plan, now, fleet_pods, cached)
        except DomainError as exc:
            outcomes[n] = exc
            continue
        if render is not None:
            job.submit_response = render(job)
        candidates[n] = job
    if not candidates:
        return _resolve(outcomes, digests)
    job_rows = [{c.key: getattr(job, c.key) for c in _JOB_COLUMNS} for job in candidates.values()]
    # The batch's rows go as one executemany of one INSERT: psycopg pipelines it through a statement
    # it prepares once per connection (one round trip, no parse or plan per row). One multi-row
    # `INSERT ... VALUES (...), (...)` took 3-5 times as long on PostgreSQL, `.values(rows)` 12-20
    # times and an unnest of column arrays 2-3 times (benchmarks/submit_batch.py, docs/performance.md).
    if any(j.idempotency_key is not None for j in candidates.values()):
        try:
            with session.begin_nested():
                conn.execute(insert(Job.__table__), job_rows)
        except IntegrityError as exc:
            raise IdempotencyRace() from exc
    else:
        conn.execute(insert(Job.__table__), job_rows)
    # Before the lock, so that the lock is held for as little as possible; a refused job's event
    # goes with it.
    conn.execute(insert(JobEvent.__table__), [_queued_event(job, now) for job in candidates.values()])

    # Judge under each tenant's lock (_LOCK_TENANTS), in request order.
    tenants = {
        row.id: row
        for row in conn.execute(_LOCK_TENANTS, {"ids": sorted({j.tenant_id for j in candidates.values()})})
    }
    mine: dict[str, int] = {}
    for job in candidates.values():
        mine[job.tenant_id] = mine.get(job.tenant_id, 0) + 1
    queued_counts: dict[str, int] = {}
    for t, row in tenants.items():
        limit = plans[t].max_queued_jobs
        if row.queued_jobs_bound + mine[t] <= limit:
            queued_counts[t] = row.queued_jobs_bound  # no job of this batch can pass the limit
        else:
            # The count sees this batch's own rows (the transaction inserted them): take them off.
            queued_counts[t] = (
                conn.execute(_QUEUED_JOBS, {"t": t, "cap": limit + mine[t] + 1}).scalar_one() - mine[t]
            )
    reserve: dict[str, int] = {}
    refused: list[str] = []
    for n, job in candidates.items():
        try:
            _judge(job, tenants[job.tenant_id], plans[job.tenant_id], now, reserve, queued_counts)
        except DomainError as exc:
            outcomes[n] = exc
            refused.append(job.id)
            continue
        outcomes[n] = Submitted(job, replayed=False)
    if refused:
        conn.execute(delete(JobEvent.__table__).where(JobEvent.__table__.c.job_id.in_(refused)))
        conn.execute(delete(Job.__table__).where(Job.__table__.c.id.in_(refused)))
    # A session's jobs start now, in this transaction, on a free GCD of the session's partition.
    sessions.place_session_jobs(
        session=session,
        jobs=[
            o.job
            for o in outcomes
            if isinstance(o, Submitted) and not o.replayed and o.job.spec.get("session")
        ],
    )
    for tenant_id, amount in reserve.items():
        done = conn.execute(
            _RESERVE, {"t": tenant_id, "amount": amount, "bound": queued_counts[tenant_id]}
        ).rowcount
        # Judged under the row lock just above, so the guard cannot refuse; if it ever did, the
        # whole batch rolls back rather than overspend.
        assert done == 1, f"quota guard refused a reservation judged under the tenant's lock ({tenant_id})"
    return _resolve(outcomes, digests)


class QueuedEventRow(TypedDict):
    """The `job_events` row that says a job was admitted to the queue."""

    job_id: str
    kind: str
    message: str
    data: dict[str, Any]
    at: datetime
    attempt: int | None


def _queued_event(job: Job, now: datetime) -> QueuedEventRow:
    return {
        "job_id": job.id,
        "kind": "state",
        "message": (
            f"queued: {job.ipus} IPUs, predicted {job.predicted_runtime_s:.1f} s, "
            f"{job.reserved_ipu_ms / billing.IPU_MS_PER_HOUR:.4f} IPU-hours reserved"
        ),
        "data": {"state": "queued", "ipus": job.ipus, "predicted_runtime_s": job.predicted_runtime_s},
        "at": now,
        "attempt": None,
    }


_JOB_COLUMNS = tuple(Job.__table__.columns)

# The admission statements, built once: a statement object reused across calls keeps its compiled
# form and cache key, which is most of what running a statement costs in Python.
_tenants = Tenant.__table__
_plans = Plan.__table__
_jobs = Job.__table__
_PLANS_OF_TENANTS = (
    select(
        _tenants.c.id.label("tenant_id"),
        _plans.c.name,
        _plans.c.max_partition_size,
        _plans.c.max_runtime_s,
        _plans.c.max_queued_jobs,
        _plans.c.priority,
        _plans.c.rates,
        _plans.c.machine_types,
        _plans.c.preemptible_discount,
    )
    .join(_plans, _plans.c.name == _tenants.c.plan_name)
    .where(_tenants.c.id.in_(bindparam("ids", expanding=True)))
)
# NO KEY UPDATE: the job inserts hold KEY SHARE locks on the tenant (their foreign keys), which a
# plain FOR UPDATE would wait for, deadlocking two API processes that each inserted before locking.
_LOCK_TENANTS = (
    select(
        _tenants.c.id,
        _tenants.c.name,
        _tenants.c.status,
        _tenants.c.expires_at,
        _tenants.c.quota_ipu_ms,
        _tenants.c.used_ipu_ms,
        _tenants.c.reserved_ipu_ms,
        _tenants.c.queued_jobs_bound,
    )
    .where(_tenants.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(_tenants.c.id)
    .with_for_update(key_share=True)
)
# The tenant's queued jobs, counted no further than its plan's limit needs (an index range of at
# most `cap` entries of the (tenant, state) index, however long the queue).
# An array's queued elements count once (scheduler/services/batch/arrays.py).
_QUEUED_JOBS = select(func.count()).select_from(
    select(func.coalesce(_jobs.c.array_id, _jobs.c.id))
    .distinct()
    .where(
        _jobs.c.tenant_id == bindparam("t"),
        _jobs.c.state == JobState.QUEUED.value,
        # Replicas count against the plan's endpoint limits instead (scheduler/services/endpoints/).
        _jobs.c.task != SERVE_TASK,
    )
    .limit(bindparam("cap"))
    .subquery()
)
_RESERVE = (
    update(_tenants)
    .where(
        _tenants.c.id == bindparam("t"),
        _tenants.c.used_ipu_ms + _tenants.c.reserved_ipu_ms + bindparam("amount") <= _tenants.c.quota_ipu_ms,
    )
    .values(
        reserved_ipu_ms=_tenants.c.reserved_ipu_ms + bindparam("amount"),
        queued_jobs_bound=bindparam("bound"),
    )
)


def _resolve(outcomes: list[Outcome | _Later | None], digests: list[str]) -> list[Outcome]:
    """Settle requests that repeated an earlier Idempotency-Key of the batch, then check all are decided."""
    for n, outcome in enumerate(outcomes):
        if isinstance(outcome, _Later):
            first = outcomes[outcome.index]
            if isinstance(first, Submitted):
                outcomes[n] = (
                    Submitted(first.job, replayed=True)
                    if digests[n] == digests[outcome.index]
                    else IdempotencyConflict(
                        "This Idempotency-Key was used for a different request body.", job_id=first.job.id
                    )
                )
            else:
                outcomes[n] = first
    decided: list[Outcome] = []
    for outcome in outcomes:
        assert isinstance(outcome, Submitted | DomainError)
        decided.append(outcome)
    return decided


@dataclass(frozen=True)
class _Later:
    """A request that repeats an earlier Idempotency-Key of the same batch."""

    index: int


def _prepare(
    session: Session,
    r: SubmitRequest,
    digest: str,
    plan: Any,
    now: datetime,
    fleet_pods: dict[str, int],
    cached: dict[str, bool],
) -> Job:
    """Everything about one request that needs no lock: the job it would be, or why it cannot.

    `cached`: what the batch has read of the executable cache so far (it fills it in)."""
    spec = r.spec
    reserved_partition = None
    in_session = False
    if spec.session is not None:
        # A session's job runs on the session's partition like a job in a reserved partition, and
        # pays nothing itself: the session is billed for holding it (scheduler/services/sessions.py).
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
    # A tenant's own model: its row is share-locked until the commit, so it cannot be removed meanwhile.
    source = own_models.resolve_source(
        session=session, tenant_id=r.tenant_id, model=spec.workload.model, lock=True
    )
    named = spec.machine if spec.machine not in (None, "any") else None
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
    options: dict[str, dict[str, float]] = {}
    refusals: list[tuple[str, DomainError]] = []
    for kind in candidates:
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
    return Job(
        id=new_id("job"),
        tenant_id=r.tenant_id,
        name=spec.name,
        spec=_stored_spec(spec, source),
        model=source.model_id if source is not None else spec.workload.model,
        task=spec.workload.task,
        ipus=size,
        ipus_requested=str(spec.ipus),
        machine_type=named,
        options=options,
        prefer=spec.prefer,
        partition_name=reserved_partition.name if reserved_partition is not None else None,
        session_id=spec.session,
        priority=spec.priority,
        max_runtime_s=max_runtime,
        preemptible=spec.preemptible,
        never_preempt=spec.never_preempt,
        checkpoint_every_s=spec.checkpoint_every_s,
        runtime_base_s=0.0,
        predicted_runtime_s=predicted,
        reserved_ipu_ms=reserve,
        state=JobState.QUEUED,
        reason=None,
        wait=None,
        idempotency_key=r.idempotency_key,
        request_hash=digest,
        submit_response=None,
        created_at=now,
        submitted_by=r.member_id,
        notify=list(dict.fromkeys(spec.notify.on)) if spec.notify is not None and spec.notify.on else None,
        updated_at=now,
        started_at=None,
        finished_at=None,
        attempts=0,
        cancel_requested=False,
        array_id=None,
        array_index=None,
        params=None,
        depends_on=depends_on,
        held_for=DEPENDENCY if depends_on is not None else None,
        singleton=spec.singleton,
    )


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


def get_job(*, session: Session, job_id: str, scope: Scope) -> Job:
    """A job by id; a job outside the scope (another tenant's) is indistinguishable from a missing one."""
    job = session.get(Job, job_id)
    if job is None or not sees(scope, job.tenant_id):
        raise NotFound(f"No job {job_id}.")
    return job


def list_jobs(
    *,
    session: Session,
    scope: Scope,
    after: str | None,
    limit: int,
    state: str | None = None,
    fold: bool = False,
) -> list[Job]:
    """The scope's jobs, newest first; `after` is the id of the last job of the previous page.
    `fold`: without arrays' queued elements (`folded_elements` stands for them)."""
    stmt = restrict(select(Job).order_by(Job.id.desc()).limit(limit), Job.tenant_id, scope)
    # A session's holder job is the session (GET /sessions), and an endpoint's replica is the
    # endpoint's (GET /endpoints): neither is one of the tenant's jobs.
    stmt = stmt.where(Job.task.not_in((sessions.SESSION_TASK, SERVE_TASK)))
    if state is not None:
        stmt = stmt.where(Job.state == state)
    if fold:
        stmt = stmt.where((Job.array_id.is_(None)) | (Job.state != JobState.QUEUED))
    if after is not None:
        stmt = stmt.where(Job.id < after)
    return list(session.execute(stmt).scalars())


@dataclass
class Folded:
    """An array's queued elements, shown as one row: its first element, how many, which."""

    first: Job
    count: int
    indices: str


def folded_elements(*, session: Session, scope: Scope) -> list[Folded]:
    """Each array of the scope with queued elements: its first queued element and the rest counted,
    newest array first (`GET /jobs` shows them atop its first page unless asked to expand)."""
    groups = session.execute(
        restrict(
            select(Job.array_id, func.count(), func.min(Job.array_index), func.max(Job.array_index))
            .where(Job.state == JobState.QUEUED, Job.array_id.is_not(None))
            .group_by(Job.array_id)
            .order_by(Job.array_id.desc())
            .limit(100),
            Job.tenant_id,
            scope,
        )
    ).tuples()
    wanted = {a: (int(n), int(lo), int(hi)) for a, n, lo, hi in groups}
    if not wanted:
        return []
    firsts = {
        j.array_id: j
        for j in session.execute(
            select(Job).where(
                tuple_(Job.array_id, Job.array_index).in_([(a, lo) for a, (_, lo, _) in wanted.items()]),
            )
        ).scalars()
    }
    out = []
    for array_id in sorted(wanted, reverse=True):
        n, lo, hi = wanted[array_id]
        first = firsts.get(array_id)
        if first is None:
            continue
        if n == hi - lo + 1:
            indices = f"{lo}-{hi}" if hi > lo else str(lo)
        else:
            indices = compress_indices(
                [
                    int(i or 0)
                    for i in session.execute(
                        select(Job.array_index)
                        .where(Job.array_id == array_id, Job.state == JobState.QUEUED)
                        .order_by(Job.array_index)
                    ).scalars()
                ]
            )
        out.append(Folded(first, n, indices))
    return out


def job_events(
    *, session: Session, job_id: str, after: int = 0, limit: int = 1000, kinds: tuple[str, ...] | None = None
) -> list[JobEvent]:
    stmt = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after)
    if kinds is not None:
        stmt = stmt.where(JobEvent.kind.in_(kinds))
    return list(session.execute(stmt.order_by(JobEvent.id).limit(limit)).scalars())


_JOB_ID = re.compile(r"\bjob_[0-9a-z]{26}\b")


def state_histories(*, session: Session, job_ids: Sequence[str]) -> dict[str, list[JobEvent]]:
    """Each job's state events, oldest first, in one query for a page of jobs."""
    out: dict[str, list[JobEvent]] = {j: [] for j in job_ids}
    if not job_ids:
        return out
    rows = session.execute(
        select(JobEvent)
        .where(JobEvent.job_id.in_(list(job_ids)), JobEvent.kind == "state")
        .order_by(JobEvent.id)
    ).scalars()
    for event in rows:
        out[event.job_id].append(event)
    return out


def wait_reason(*, session: Session, job: Job, scope: Scope) -> WaitView | None:
    """Why a queued job is not running yet, as the scheduler last explained it, told to `scope`.

    The scheduler names the jobs a job waits behind, whoever they belong to; a tenant is told only
    its own jobs' ids, and of other tenants' jobs only how many ("behind a job of another tenant")."""
    if job.state != JobState.QUEUED:
        return None
    attempt = current_attempt(session=session, job=job)
    return wait_given(session=session, job=job, attempt=attempt, scope=scope)


def wait_given(*, session: Session, job: Job, attempt: Attempt | None, scope: Scope) -> WaitView | None:
    """`wait_reason` for a job whose current attempt the caller has read already."""
    if job.state != JobState.QUEUED:
        return None
    if attempt is not None and attempt.state == AttemptState.PLACED:
        return {"reason": "starting", "detail": "placed on a partition; waiting for a worker to take it"}
    stored = cast("WaitView | None", job.wait)  # what scheduling.wait_json gave
    wait: WaitView = stored or {"reason": "pending", "detail": "waiting for the scheduler's next pass"}
    return redact_wait(session=session, wait=wait, scope=scope)


def redact_wait(*, session: Session, wait: WaitView, scope: Scope) -> WaitView:
    """`wait` with every id of a job outside `scope` replaced by words (see `wait_reason`)."""
    if isinstance(scope, AllTenants):
        return wait
    detail = str(wait.get("detail", ""))
    behind = [str(j) for j in wait.get("behind") or ()]
    named = set(behind) | set(_JOB_ID.findall(detail))
    if not named:
        return wait
    own = set(
        session.execute(
            select(Job.id).where(Job.id.in_(sorted(named)), Job.tenant_id == scope.tenant_id)
        ).scalars()
    )
    foreign = named - own
    if not foreign:
        return wait
    for job_id in foreign:
        detail = detail.replace(job_id, "a job of another tenant")
    others = sum(1 for j in behind if j in foreign)
    if others > 1:
        detail += f" (behind {others} jobs of other tenants)"
    return {
        **wait,
        "detail": detail,
        "behind": [j for j in behind if j not in foreign],
        "behind_other_tenants": others,
    }


def current_attempt(*, session: Session, job: Job) -> Attempt | None:
    if job.attempts == 0:
        return None
    return session.execute(
        select(Attempt).where(Attempt.job_id == job.id, Attempt.number == job.attempts)
    ).scalar_one_or_none()


def current_attempts(*, session: Session, jobs: list[Job]) -> dict[str, tuple[Attempt, Partition]]:
    """Each listed job's latest attempt and its partition, in one query for the whole page."""
    wanted = [(j.id, j.attempts) for j in jobs if j.attempts]
    if not wanted:
        return {}
    rows = session.execute(
        select(Attempt, Partition)
        .join(Partition, Partition.pk == Attempt.partition_pk)
        .where(Attempt.job_id.in_([j for j, _ in wanted]))
    ).tuples()
    latest = dict(wanted)
    return {a.job_id: (a, p) for a, p in rows if a.number == latest[a.job_id]}


def attempt_partition(*, session: Session, attempt: Attempt | None) -> Partition | None:
    return None if attempt is None else session.get(Partition, attempt.partition_pk)


def request_cancel(*, session: Session, job_id: str, scope: Scope) -> Job:
    """Cancel: a queued job ends now, and so does a placed or running one: the control plane ends its
    attempt itself (billed up to now) and the host agent driving it is told to stop over the bus
    (`stopped_agents`), or finds out at its next look."""
    get_job(session=session, job_id=job_id, scope=scope)  # 404 before any lock
    job = session.execute(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    ).scalar_one()
    if job.state in FINAL_JOB_STATES:
        raise Conflict(f"Job {job_id} already ended ({job.state}).", state=job.state)
    if job.cancel_requested:
        return job
    job.cancel_requested = True
    job.updated_at = utcnow()
    attempt = current_attempt(session=session, job=job)
    if attempt is not None and attempt.state in LIVE_ATTEMPT_STATES:
        reason = (
            "cancelled by user"
            if attempt.state == AttemptState.RUNNING
            else "cancelled by user before it started"
        )
        attempts.stop_running(
            session=session,
            attempt_ids=[attempt.id],
            outcome=AttemptState.CANCELLED,
            reason=reason,
            max_attempts=1,
        )
    if job.state not in FINAL_JOB_STATES:
        finalize_job(session=session, job=job, state=JobState.CANCELLED, reason="cancelled by user")
    session.flush()
    return job


def resume_job(*, session: Session, job_id: str, scope: Scope) -> Job:
    """Queue a job that its time limit stopped again, from its last checkpoint, with a new time limit.

    Only the owner's tenant sees it (another tenant's job is 404), only a job that failed by its
    time limit with a checkpoint, and only within its plan's `checkpoint_retention_s`. Its quota
    reservation is taken again for the steps it has left, by a guarded update like admission's."""
    get_job(session=session, job_id=job_id, scope=scope)  # 404 before any lock
    job = session.execute(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    ).scalar_one()
    attempt = current_attempt(session=session, job=job)
    if job.state != JobState.FAILED or attempt is None or attempt.state != AttemptState.TIMED_OUT:
        raise Conflict(
            f"Job {job_id} is {job.state}: only a job stopped by its time limit (max_runtime_s) can be "
            "resumed.",
            state=job.state,
        )
    checkpoint = checkpoints.latest_by_job(session=session, job_ids=[job.id]).get(job.id)
    if checkpoint is None:
        raise Conflict(f"Job {job_id} has no checkpoint to resume from.", state=job.state)
    tenant = session.get(Tenant, job.tenant_id)
    assert tenant is not None
    plan = session.get(Plan, tenant.plan_name)
    assert plan is not None
    until = checkpoints.resumable_until(job=job, plan=plan)
    now = utcnow()
    if until is None or now > until:
        raise Conflict(
            f"Job {job_id}'s checkpoints were kept {int(plan.checkpoint_retention_s):,} s after it stopped "
            f"(the {plan.name} plan's retention); it can no longer be resumed.",
            state=job.state,
        )
    # What is left, timed as its last attempt ran (restoring the checkpoint is not billed).
    step_s = float((attempt.timeline or {}).get("step_s", 0.0))
    left_s = max(0, checkpoint.steps - checkpoint.step) * step_s
    if left_s <= 0:
        left_s = job.predicted_runtime_s * max(0.0, 1.0 - checkpoint.step / max(1, checkpoint.steps))
    predicted = min(left_s, float(job.max_runtime_s or left_s))
    options = {
        kind: {**option, "predicted_runtime_s": predicted} for kind, option in (job.options or {}).items()
    }
    job.options = options or None
    job.predicted_runtime_s = predicted
    reserve = (
        billing.reserve_ipu_ms(options, job.prefer or "time")
        if options
        else billing.charged_ipu_ms(job.ipus, predicted, 1.0)
    )
    if tenant.status != "active":
        raise Conflict(f"Tenant {tenant.name} is {tenant.status}.", state=job.state)
    done = changed(
        session,
        update(Tenant)
        .where(
            Tenant.id == tenant.id,
            Tenant.used_ipu_ms + Tenant.reserved_ipu_ms + reserve <= Tenant.quota_ipu_ms,
        )
        # The queued-job bound stays an upper bound (scheduler/services/batch/jobs.py, submit_jobs).
        .values(
            reserved_ipu_ms=Tenant.reserved_ipu_ms + reserve,
            queued_jobs_bound=Tenant.queued_jobs_bound + 1,
        )
        .execution_options(synchronize_session=False),
    )
    if done != 1:
        cost = billing.ipu_hours(reserve)
        raise QuotaExceeded(
            f"Resuming this job is predicted to cost {cost:.3f} IPU-hours, more than is left of the grant.",
            cost_ipu_hours=cost,
        )
    # Counted under the tenant's row lock the update took, as admission counts: a resume joins the
    # queue like a submission and is held to the plan's limit like one.
    queued = session.execute(
        select(func.count()).select_from(
            select(Job.id)
            .where(Job.tenant_id == tenant.id, Job.state == JobState.QUEUED)
            .limit(plan.max_queued_jobs)
            .subquery()
        )
    ).scalar_one()
    if queued >= plan.max_queued_jobs:
        raise LimitExceeded(
            f"The {plan.name} plan allows {plan.max_queued_jobs} queued jobs; wait for some to start.",
            limit="max_queued_jobs",
        )
    job.reserved_ipu_ms = reserve
    # Its time limit counts again from here: what it had run is behind it.
    job.runtime_base_s = checkpoint.run_s
    job.state = JobState.QUEUED
    job.reason = None
    job.wait = None
    job.finished_at = None
    job.updated_at = now
    add_event(
        session,
        job.id,
        "state",
        f"resumed by its owner from the checkpoint after step {checkpoint.step:,} of {checkpoint.steps:,}",
        data={"state": "queued", "resumed": True, "step": checkpoint.step},
        at=now,
    )
    session.flush()
    return job
