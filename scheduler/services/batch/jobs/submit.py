"""Submitting jobs (with admission and quota reservation) in one batch: Idempotency-Keys, the job rows
and their `queued` events, each tenant judged under its row lock."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

import orjson
from sqlalchemy import Executable, bindparam, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.db import RowsPlan, rows_insert, rows_json
from scheduler.errors import (
    DomainError,
    IdempotencyConflict,
    NotFound,
)
from scheduler.jobspec import JobSpec
from scheduler.models import (
    SERVE_TASK,
    Job,
    JobEvent,
    JobState,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services import sessions
from scheduler.services.batch.jobs.admission import SubmitRequest, _judge, _prepare, row_of
from scheduler.services.capacity import fleet

if TYPE_CHECKING:
    pass


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
    compiled: CompiledKeys | None = None,
) -> list[Outcome]:
    """Admit a batch of jobs in the caller's transaction: one outcome per request, in order.

    `render` makes a job's answer, stored with a job that has an Idempotency-Key (what its replay
    returns; nothing else reads it). `compiled`: executables the caller has seen compiled in
    earlier batches (the submit writer's, `CompiledKeys`); this batch adds what it finds.

    Each job is validated against the emulator, the fleet and its plan, and its predicted cost
    reserved from its tenant's grant. The jobs and their first events are inserted first; only
    then is each tenant's row locked (FOR NO KEY UPDATE, in id order so batches never deadlock) to
    judge status, quota and the queued-job limit on exact figures, refused jobs are deleted again,
    and the reservation is one guarded UPDATE per tenant that the database itself refuses if it
    would pass the grant. The tenant row is therefore locked for two statements and the commit,
    which is what lets concurrent batches of one tenant (several API processes) follow each
    other quickly. A one-tenant batch its tenant admits whole needs neither: one guarded UPDATE
    judges and reserves it (`_reserve_all`), the lock's SELECT only when some job may be refused.

    The queued-job limit is judged on the tenant's `queued_jobs_bound` (an upper bound kept under
    the same lock) and the queue is counted, no further than the limit, only when that bound
    would pass it. A job put back in the queue by a platform failure is not in the bound until
    the next count: such jobs may take a tenant past its limit, submissions never do.

    Raises IdempotencyRace when another transaction committed one of the batch's
    Idempotency-Keys first: retry, and the retry replays it.
    """
    outcomes: list[Outcome | _Later | None] = [None] * len(requests)
    # What an Idempotency-Key is bound to; a request without a key is never compared, so its digest
    # (a dump of the whole spec and a SHA-256) is not made.
    digests = [None if r.idempotency_key is None else request_hash(r.spec) for r in requests]

    _replays(session, requests, digests, outcomes)

    # Validate against plans (not locked: plans are admin settings) and the fleet; insert.
    tenant_ids = sorted({r.tenant_id for n, r in enumerate(requests) if outcomes[n] is None})
    plans: dict[str, Any] = {}
    conn = session.connection()  # Core statements need none of the ORM session's machinery
    if tenant_ids:
        # One tenant (the usual batch) by `=`: an expanding IN is rendered anew at every execution.
        rows = (
            conn.execute(_PLAN_OF_TENANT, {"id": tenant_ids[0]})
            if len(tenant_ids) == 1
            else conn.execute(_PLANS_OF_TENANTS, {"ids": tenant_ids})
        )
        plans = {row.tenant_id: row for row in rows}
    fleet_pods = fleet.pods_by_type(session=session, max_age_s=fleet.PODS_CACHE_S) if plans else {}
    now = utcnow()
    candidates: dict[int, Job] = {}
    # The tenant's executable cache, read once per key per batch: a batch is mostly the same few
    # workloads, and a query per job was a quarter of the writer's time (py-spy, 16 clients). Keys
    # the caller has seen compiled are not read again (`CompiledKeys`).
    cached: dict[str, bool] = _Cached(compiled) if compiled is not None else {}
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
        if render is not None and r.idempotency_key is not None:
            job.submit_response = render(job)
        candidates[n] = job
    if compiled is not None:
        compiled.learn(cached)
    if not candidates:
        return _resolve(outcomes, digests)
    job_rows = [row_of(job) for job in candidates.values()]
    # The events go in before the lock, so that the lock is held for as little as possible; a
    # refused job's event goes with it.
    event_rows = [_queued_event(job, now) for job in candidates.values()]
    reserve: dict[str, int] = {}
    queued_counts: dict[str, int] = {}
    (only, *others) = sorted({j.tenant_id for j in candidates.values()})
    try:
        admitted = _insert(
            conn, job_rows, event_rows, None if others else (only, candidates, plans[only], now)
        )
    except IntegrityError as exc:
        # A key's unique index stops what the replay read could not see: another request with this
        # key committed after that read. The transaction is spent; the caller retries in a new one,
        # which replays that request's job. (No savepoint: nothing of this transaction is kept anyway.)
        if any(j.idempotency_key is not None for j in candidates.values()):
            raise IdempotencyRace() from exc
        raise
    if admitted:
        for n, job in candidates.items():
            outcomes[n] = Submitted(job, replayed=False)
    else:
        # Judge under each tenant's lock (_LOCK_TENANTS), in request order.
        tenants = {
            row.id: row
            for row in conn.execute(
                _LOCK_TENANTS, {"ids": sorted({j.tenant_id for j in candidates.values()})}
            )
        }
        queued_counts = _queued_counts(conn, tenants, plans, candidates)
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


class CompiledKeys:
    """Executable-cache keys (`executables.tenant_key`) seen compiled, kept across batches by one
    submit writer: admission then reads the cache only for keys not yet seen compiled, which under a
    steady load of the same few workloads is none (its read was a tenth of an API process's CPU,
    py-spy, 16 clients). Safe to keep because nothing removes an executable once recorded
    (scheduler/services/batch/executables.py); a key not seen compiled is read every time, so one
    compiled since is found. Bounded: past `limit` keys it starts over."""

    def __init__(self, limit: int = 100_000) -> None:
        self.keys: set[str] = set()
        self.limit = limit

    def learn(self, cached: dict[str, bool]) -> None:
        if len(self.keys) >= self.limit:
            self.keys.clear()
        self.keys.update(k for k, hit in cached.items() if hit)


class _Cached(dict[str, bool]):
    """A batch's reads of the executable cache, over the keys its writer has already seen compiled."""

    def __init__(self, compiled: CompiledKeys) -> None:
        super().__init__()
        self.compiled = compiled

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.compiled.keys:
            return True
        return super().get(key, default)


def _insert(
    conn: Connection,
    job_rows: list[dict[str, Any]],
    event_rows: list[QueuedEventRow],
    one_tenant: tuple[str, dict[int, Job], Any, datetime] | None,
) -> bool:
    """Insert a batch's jobs and their first events and, for a one-tenant batch, try to admit it
    whole (`_reserve_all`); True when it was.

    On PostgreSQL all of it is one statement, one round trip: the rows as `json_to_recordset`
    INSERTs (`db.rows_insert`) in CTEs of the reservation's guarded UPDATE (or of the events' INSERT
    when there are several tenants). It replaced a COPY of each table and the UPDATE after them,
    five round trips, each a wait of the writer thread while the API processes' event loops and
    PostgreSQL share two cores (docs/performance.md). The rows are visible to the events' foreign
    key, checked at the statement's end. Elsewhere: an executemany of each, then the UPDATE."""
    if conn.dialect.driver != "psycopg":
        conn.execute(insert(_jobs), job_rows)
        conn.execute(insert(_events), event_rows)
        return one_tenant is not None and _reserve_all(conn, *one_tenant)
    statement, jobs_plan, events_plan = _batch_insert(
        tuple(job_rows[0]), tuple(event_rows[0]), one_tenant is not None, conn.dialect
    )
    params: dict[str, Any] = {
        "jobs": rows_json(jobs_plan, job_rows),
        "events": rows_json(events_plan, event_rows),
    }
    if one_tenant is None:
        conn.execute(statement, params)
        return False
    params.update(_reserve_all_params(*one_tenant))
    return bool(conn.execute(statement, params).rowcount == 1)


@functools.lru_cache(maxsize=16)
def _batch_insert(
    job_names: tuple[str, ...], event_names: tuple[str, ...], reserve: bool, dialect: Any
) -> tuple[Executable, RowsPlan, RowsPlan]:
    """`_insert`'s statement on PostgreSQL, built once (each new one would be compiled anew)."""
    jobs_in, jobs_plan = rows_insert(_jobs, job_names, "jobs", dialect)
    events_in, events_plan = rows_insert(_events, event_names, "events", dialect)
    if reserve:
        # `updated_at` given: SQLAlchemy leaves a column's `onupdate` unset in a statement with CTEs.
        reserve_all = _RESERVE_ALL.values(updated_at=bindparam("now"))
        return reserve_all.add_cte(jobs_in.cte("jobs_in"), events_in.cte("events_in")), jobs_plan, events_plan
    return events_in.add_cte(jobs_in.cte("jobs_in")), jobs_plan, events_plan


def _reserve_all(
    conn: Connection, tenant_id: str, candidates: dict[int, Job], plan: Any, now: datetime
) -> bool:
    """Admit all of a one-tenant batch in one statement, if its tenant admits every job: the tenant's
    status, trial, grant and queued-job limit judged by the UPDATE's guard on the row it locks.

    What `_judge` decides job by job comes to this when none is refused: the tenant active and not
    expired, the batch's total cost within what is left of the grant, and the queue's bound plus
    the batch within the plan's limit (then the queue needs no count, `_queued_counts`). One
    statement instead of the lock's SELECT and the reservation's UPDATE: a round trip less, and
    one less while the tenant's row is locked, which is what concurrent batches of one tenant (the
    API processes' writers) wait for. False (nothing written): judge job by job under the lock."""
    done = conn.execute(_RESERVE_ALL, _reserve_all_params(tenant_id, candidates, plan, now)).rowcount
    return bool(done == 1)


class ReserveAllParams(TypedDict):
    """`_RESERVE_ALL`'s parameters: the tenant, the batch's time, total cost and size, the plan's limit."""

    t: str
    now: datetime
    amount: int
    n: int
    limit: int


def _reserve_all_params(
    tenant_id: str, candidates: dict[int, Job], plan: Any, now: datetime
) -> ReserveAllParams:
    total = sum(job.reserved_ipu_ms for job in candidates.values())
    return {"t": tenant_id, "now": now, "amount": total, "n": len(candidates), "limit": plan.max_queued_jobs}


def _replays(
    session: Session,
    requests: Sequence[SubmitRequest],
    digests: list[str | None],
    outcomes: list[Outcome | _Later | None],
) -> None:
    """Idempotency-Key replays, from the database and from earlier requests of this batch: their
    outcomes filled in."""
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


def _queued_counts(
    conn: Connection, tenants: dict[str, Any], plans: dict[str, Any], candidates: dict[int, Job]
) -> dict[str, int]:
    """Each tenant's queued jobs before this batch, as far as its plan's limit needs them counted."""
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
    return queued_counts


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
_events = JobEvent.__table__
_PLAN_COLUMNS = (
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
_PLANS_OF_TENANTS = (
    select(*_PLAN_COLUMNS)
    .join(_plans, _plans.c.name == _tenants.c.plan_name)
    .where(_tenants.c.id.in_(bindparam("ids", expanding=True)))
)
_PLAN_OF_TENANT = (
    select(*_PLAN_COLUMNS)
    .join(_plans, _plans.c.name == _tenants.c.plan_name)
    .where(_tenants.c.id == bindparam("id"))
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


_RESERVE_ALL = (
    update(_tenants)
    .where(
        _tenants.c.id == bindparam("t"),
        _tenants.c.status == "active",
        or_(_tenants.c.expires_at.is_(None), _tenants.c.expires_at > bindparam("now")),
        _tenants.c.used_ipu_ms + _tenants.c.reserved_ipu_ms + bindparam("amount") <= _tenants.c.quota_ipu_ms,
        _tenants.c.queued_jobs_bound + bindparam("n") <= bindparam("limit"),
    )
    .values(
        reserved_ipu_ms=_tenants.c.reserved_ipu_ms + bindparam("amount"),
        queued_jobs_bound=_tenants.c.queued_jobs_bound + bindparam("n"),
    )
)


def _resolve(outcomes: list[Outcome | _Later | None], digests: list[str | None]) -> list[Outcome]:
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
