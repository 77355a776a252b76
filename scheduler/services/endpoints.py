"""Inference endpoints, the control plane: a model served by replicas that the scheduler holds,
adds, drains and replaces (docs/endpoints.md).

A replica is a *holder job* (task `serve`, hidden from the job list) like a session's: admission
reserves a window of its cost (`WINDOW_S` cluster seconds at the plan's rate) from the grant, and it
queues, is placed, fair-shared and limited by the same machinery as any job, except that it counts
against the plan's endpoint limits instead of its job-count limits. Unlike a session's holder, an agent
runs its attempt: a model server that compiles, loads, then answers the endpoint's requests from Redis
until it is stopped (the data plane: scheduler/inference.py, workers/serving.py). Its attempt is
metered like any other, so the endpoint is billed per held IPU-second, busy or idle, compile included.

A replica's state is derived, never reported: its job queued (or its attempt placed) is `queued`;
its running attempt at cluster time t = (now - started_at) x timeline["scale"] is `compiling` before
timeline["compile_s"], `loading` until compile_s + load_s, then `ready`; a cancel requested is
`draining`.

`serve_pass` runs in the scheduler leader's loop (fenced like sessions.sweep): it reads each live
endpoint's last minute of traffic (`inference.windows`), decides how many replicas it wants
(`decide_scale`, a pure function), creates or drains holder jobs to get there, replaces replicas
that failed, stops an endpoint whose tenant's grant is spent (reason `quota`), sets its state and
reason, and rolls each minute up into `endpoint_stats`.

An endpoint's events (`endpoint.ready`, `endpoint.scaled`, `endpoint.failed`; docs/notifications.md)
are written in the transaction that changes its state or its wanted replicas, under its row's lock:
their ids name the endpoint, the change and its instant, so each change writes one, however often a
pass is replayed.

Locks are taken in the order endpoints, jobs, attempts, tenants.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler import billing
from scheduler.clock import UNSCALED, Clock
from scheduler.endpointspec import EndpointChange, EndpointSpec
from scheduler.errors import (
    Conflict,
    DoesNotFit,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    QuotaExceeded,
    TenantInactive,
)
from scheduler.ids import new_id
from scheduler.models import (
    FINAL_JOB_STATES,
    LIVE_ATTEMPT_STATES,
    LIVE_ENDPOINT_STATES,
    PLATFORM_FAULT_STATES,
    SERVE_TASK,
    Attempt,
    AttemptState,
    Endpoint,
    EndpointStat,
    EndpointState,
    Job,
    JobState,
    Partition,
    Plan,
    Tenant,
    utcnow,
)
from scheduler.services import own_models
from scheduler.services.batch import attempts
from scheduler.services.batch.job_state import add_event, finalize_job
from scheduler.services.capacity import fleet
from scheduler.services.tenancy import notifications, rates
from scheduler.services.tenancy.scope import Scope, restrict, sees
from vipu import emulator
from vipu.emulator.catalogue import WORKLOAD_NAMES
from vipu.emulator.serving import DEFAULT_SERVE_BATCHES, choose_serving_ipus, serve_plan, signature_of

if TYPE_CHECKING:
    import redis

log = logging.getLogger("ipucloud.endpoints")

# The cluster seconds of a replica's cost its holder job reserves from the grant (capped by what is
# left): what the scheduler plans it around, as a job's predicted run time. A replica runs until it is
# drained; past the window it is billed from the grant directly, as any tick is.
WINDOW_S = 3600.0
FAILURE_LIMIT = 3  # replicas that fail to start in a row before the endpoint is `failed`
QUOTA = "quota"
ROUTE_REFRESH_S = 10.0  # wall seconds between republishing every live route (a lost publish heals)


# The data plane's Redis protocol (scheduler/inference.py), imported where it is used, so this module
# and its tests stand without it.


def _inference() -> Any:
    """The data plane's module, or None in a build without it (routes then go unpublished and the
    autoscaler sees no traffic: endpoints hold their replicas as asked)."""
    try:
        return importlib.import_module("scheduler.inference")
    except ModuleNotFoundError as exc:
        if exc.name != "scheduler.inference":
            raise
        return None


class WindowLike(Protocol):
    """`inference.Window`, the endpoint's last minute, as this module reads it."""

    @property
    def requests(self) -> int: ...
    @property
    def answered(self) -> int: ...
    @property
    def rejected_429(self) -> int: ...
    @property
    def unavailable_503(self) -> int: ...
    @property
    def cold_starts(self) -> int: ...
    @property
    def rps(self) -> float: ...
    @property
    def mean_batch(self) -> float: ...
    @property
    def queue_delay_ms(self) -> float: ...
    @property
    def p50_ms(self) -> float: ...
    @property
    def p90_ms(self) -> float: ...
    @property
    def p99_ms(self) -> float: ...
    @property
    def queued(self) -> int: ...
    @property
    def ready_replicas(self) -> int: ...
    @property
    def arrival_rps(self) -> float: ...


def read_windows(
    client: redis.Redis, endpoint_ids: Sequence[str], now: float | None = None
) -> dict[str, WindowLike]:
    """Each endpoint's last minute of traffic (`inference.windows`); empty when Redis or the data plane
    cannot say (the autoscaler then holds its replicas as they are)."""
    if not endpoint_ids:
        return {}
    inference = _inference()
    if inference is None:
        return {}
    try:
        return dict(inference.windows(client, list(endpoint_ids), seconds=60.0, now=now))
    except Exception as exc:  # a hint for the autoscaler: never the reason a pass fails
        log.warning("could not read the endpoints' traffic: %s", exc)
        return {}


@dataclass(frozen=True)
class RouteFields:
    """What `inference.Route` carries of an endpoint, read while its row is at hand."""

    endpoint_id: str
    tenant_id: str
    name: str
    state: str
    signature: dict[str, Any]
    max_batch_size: int
    max_wait_ms: float
    max_queue: int
    cold_start_timeout_s: float

    @classmethod
    def of(cls, ep: Endpoint) -> RouteFields:
        return cls(
            endpoint_id=ep.id,
            tenant_id=ep.tenant_id,
            name=ep.name,
            state=ep.state,
            signature=dict(ep.signature),
            max_batch_size=int(ep.batching["max_batch_size"]),
            max_wait_ms=float(ep.batching["max_wait_ms"]),
            max_queue=ep.max_queue,
            cold_start_timeout_s=float(ep.cold_start_timeout_s),
        )

    @property
    def live(self) -> bool:
        return self.state in LIVE_ENDPOINT_STATES


def publish_routes(client: redis.Redis, routes: Iterable[RouteFields]) -> int:
    """Publish each live endpoint's route and remove each stopped one's; returns how many were
    written. Called after the commit that changed them."""
    done = 0
    inference = _inference()
    if inference is None:
        return 0
    for r in routes:
        try:
            if r.live:
                inference.publish_route(
                    client,
                    inference.Route(
                        endpoint_id=r.endpoint_id,
                        tenant_id=r.tenant_id,
                        name=r.name,
                        state=r.state,
                        signature=r.signature,
                        max_batch_size=r.max_batch_size,
                        max_wait_ms=r.max_wait_ms,
                        max_queue=r.max_queue,
                        cold_start_timeout_s=r.cold_start_timeout_s,
                    ),
                )
            else:
                inference.remove_route(client, r.endpoint_id)
            done += 1
        except Exception as exc:  # the serve pass publishes every live route again within ROUTE_REFRESH_S
            log.warning("could not publish the route of %s: %s", r.endpoint_id, exc)
    return done


def routes_after_commit(session: Session, routes: Sequence[RouteFields]) -> None:
    """Publish these routes once the session's transaction commits (never if it rolls back)."""
    from sqlalchemy import event

    from scheduler import runtime

    pending: list[RouteFields] = session.info.setdefault("ipucloud.routes", [])
    if not pending:

        def flush(s: Session) -> None:
            todo = s.info.pop("ipucloud.routes", [])
            try:
                client = runtime.current().redis
            except Exception as exc:
                log.warning("no Redis to publish routes on: %s", exc)
                return
            publish_routes(client, todo)

        event.listen(session, "after_commit", flush, once=True)
        event.listen(session, "after_rollback", lambda s: s.info.pop("ipucloud.routes", None), once=True)
    pending.extend(routes)


# Creating ------------------------------------------------------------------------------------------


class BatchFigure(TypedDict):
    """One batch size of a serve plan: a request's latency in it and the replica's throughput."""

    batch_size: int
    latency_ms: float
    throughput: float


class ServeFigures(TypedDict):
    """A replica of the endpoint on one machine type, as the emulator lays it out."""

    machine: str
    ipus: int
    max_batch_size: int
    compile_s: float
    load_s: float
    pipeline_stages: int
    batches: list[BatchFigure]


def _batch_sizes(most: int) -> list[int]:
    sizes = [b for b in DEFAULT_SERVE_BATCHES if b < most]
    return [*sizes, most]


def _figures(sp: Any, machine: str) -> ServeFigures:
    return {
        "machine": machine,
        "ipus": sp.ipus,
        "max_batch_size": sp.max_batch_size,
        "compile_s": round(sp.compile_s, 3),
        "load_s": round(sp.load_s, 3),
        "pipeline_stages": sp.pipeline_stages,
        "batches": [
            {
                "batch_size": b,
                "latency_ms": round(sp.latency_s(b) * 1000, 4),
                "throughput": round(sp.throughput(b), 3),
            }
            for b in _batch_sizes(sp.max_batch_size)
        ],
    }


@dataclass
class _Planned:
    workload: dict[str, Any]
    serve: dict[str, ServeFigures]  # by machine type
    signature: dict[str, Any]
    max_batch_size: int  # what every type's replica holds: at most the one asked


def _plan(
    *,
    model: str,
    source: Any,
    seq_len: int | None,
    dims: Mapping[str, int] | None,
    precision: str,
    ipus: int | str,
    batch: int,
    candidates: Sequence[str],
) -> _Planned:
    """Lay the model out on a replica of each candidate type; refuse (422, nothing held) when it fits
    on none."""
    workload: dict[str, Any] = {"model": model, "task": "infer", "batch_size": batch, "precision": precision}
    if seq_len is not None:
        workload["seq_len"] = seq_len
    if dims:
        workload["dims"] = dict(dims)
    try:
        spec = emulator.WorkloadSpec.from_dict(workload, source=source)
        signature = signature_of(spec).to_dict()
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc), field=getattr(exc, "field", None))
    except ValueError as exc:
        raise InvalidRequest(str(exc))
    serve: dict[str, ServeFigures] = {}
    refusals: list[str] = []
    for kind in candidates:
        try:
            n = choose_serving_ipus(spec, machine=kind, max_batch_size=batch) if ipus == "auto" else int(ipus)
            sp = serve_plan(spec, machine=kind, ipus=n, max_batch_size=batch)
        except emulator.CompileError as exc:
            refusals.append(f"{kind}: {exc}")
            continue
        except (emulator.WorkloadError, ValueError) as exc:
            refusals.append(f"{kind}: {exc}")
            continue
        serve[kind] = _figures(sp, kind)
    if not serve:
        raise DoesNotFit(
            "The model cannot be served on "
            + ("any machine type" if len(candidates) > 1 else candidates[0])
            + ": "
            + "; ".join(refusals),
            ipus=None if ipus == "auto" else int(ipus),
        )
    held = min(f["max_batch_size"] for f in serve.values())
    # The stored workload is a job's: batch_size is the largest batch every replica forms.
    return _Planned({**workload, "batch_size": held}, serve, signature, held)


def _lock_tenant(session: Session, tenant_id: str) -> Tenant:
    return session.execute(
        select(Tenant)
        .where(Tenant.id == tenant_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()


def _check_standing(tenant: Tenant, now: datetime) -> None:
    if tenant.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {tenant.status}.")
    if tenant.expires_at is not None and tenant.expires_at <= now:
        raise TenantInactive(f"The trial of {tenant.name} ended on {tenant.expires_at:%Y-%m-%d}.")


def _held_ipus(session: Session, tenant_id: str, but: str | None = None) -> int:
    """IPUs the tenant's live endpoints may hold at their maxima."""
    stmt = select(func.coalesce(func.sum(Endpoint.replicas_max * Endpoint.ipus_per_replica), 0)).where(
        Endpoint.tenant_id == tenant_id, Endpoint.state.in_(LIVE_ENDPOINT_STATES)
    )
    if but is not None:
        stmt = stmt.where(Endpoint.id != but)
    return int(session.execute(stmt).scalar_one())


def _check_replicas(plan: Plan, replicas_max: int, ipus: int, held: int) -> None:
    if replicas_max > plan.max_endpoint_replicas:
        raise LimitExceeded(
            f"The {plan.name} plan scales an endpoint to at most {plan.max_endpoint_replicas} replicas; "
            f"this one asks for up to {replicas_max}.",
            limit="max_endpoint_replicas",
        )
    if held + replicas_max * ipus > plan.max_endpoint_ipus:
        raise LimitExceeded(
            f"The {plan.name} plan lets endpoints hold {plan.max_endpoint_ipus} IPUs together; yours "
            f"may hold {held} already and this one up to {replicas_max} x {ipus}.",
            limit="max_endpoint_ipus",
        )


def create_endpoint(*, session: Session, tenant_id: str, spec: EndpointSpec) -> Endpoint:
    """Admit an endpoint: validated against the emulator and the plan, its minimum replicas' holder
    jobs queued with their windows reserved. A refusal holds nothing."""
    plan = session.execute(
        select(Plan).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == tenant_id)
    ).scalar_one()
    pods = fleet.pods_by_type(session=session, max_age_s=fleet.PODS_CACHE_S)
    offered = rates.offers(plan=plan, machine=spec.machine, present=pods, what="endpoints")
    candidates = offered.kinds
    # A tenant's own model: share-locked until the commit, so it cannot be removed meanwhile.
    source = own_models.resolve_source(session=session, tenant_id=tenant_id, model=spec.model, lock=True)
    planned = _plan(
        model=source.model_id if source is not None else spec.model,
        source=source,
        seq_len=spec.seq_len,
        dims=spec.dims,
        precision=spec.precision,
        ipus=spec.ipus_per_replica,
        batch=spec.batching.max_batch_size,
        candidates=candidates,
    )
    refusals = []
    for kind, figures in list(planned.serve.items()):
        try:
            offered.check_size(kind, figures["ipus"], "a replica needs")
            fleet.check_fleet_can_ever_host(
                session=session, size=figures["ipus"], machine_type=kind, pods=pods
            )
        except (LimitExceeded, InvalidRequest, DoesNotFit, Conflict) as exc:
            refusals.append(exc)
            del planned.serve[kind]
    if not planned.serve:
        raise (
            refusals[0]
            if len(refusals) == 1
            else type(refusals[0])(
                "No machine type can hold a replica: " + "; ".join(e.detail for e in refusals),
                **{k: v for k, v in refusals[0].extra.items() if k == "limit"},
            )
        )
    ipus = max(f["ipus"] for f in planned.serve.values())
    now = utcnow()
    # The tenant's row first: the counts below and the reservation are then judged on exact figures.
    locked = _lock_tenant(session, tenant_id)
    _check_standing(locked, now)
    live = int(
        session.execute(
            select(func.count())
            .select_from(Endpoint)
            .where(Endpoint.tenant_id == tenant_id, Endpoint.state.in_(LIVE_ENDPOINT_STATES))
        ).scalar_one()
    )
    if live >= plan.max_endpoints:
        raise LimitExceeded(
            f"The {plan.name} plan allows {plan.max_endpoints} endpoints; delete one first.",
            limit="max_endpoints",
        )
    _check_replicas(plan, spec.replicas.max, ipus, _held_ipus(session, tenant_id))
    taken = session.execute(
        select(Endpoint.id).where(
            Endpoint.tenant_id == tenant_id,
            Endpoint.name == spec.name,
            Endpoint.state.not_in((EndpointState.STOPPED, EndpointState.FAILED)),
        )
    ).first()
    if taken is not None:
        raise Conflict(f"You have an endpoint named {spec.name!r} already ({taken[0]}).", field="name")
    desired = spec.replicas.min
    ep = Endpoint(
        id=new_id("ep"),
        tenant_id=tenant_id,
        name=spec.name,
        model=planned.workload["model"],
        model_name=source.label if source is not None else spec.model,
        workload=planned.workload,
        machine=spec.machine or "any",
        ipus_per_replica=ipus,
        ipus_requested=str(spec.ipus_per_replica),
        serve=dict(planned.serve),
        signature=planned.signature,
        replicas_min=spec.replicas.min,
        replicas_max=spec.replicas.max,
        desired_replicas=desired,
        autoscaling=spec.autoscaling.model_dump(mode="json"),
        batching={"max_batch_size": planned.max_batch_size, "max_wait_ms": spec.batching.max_wait_ms},
        max_queue=spec.max_queue,
        cold_start_timeout_s=spec.cold_start_timeout_s,
        preemptible=spec.preemptible,
        state=EndpointState.PROVISIONING if desired else EndpointState.SCALED_TO_ZERO,
        reason=(
            f"starting {desired} replica{'s' if desired != 1 else ''}"
            if desired
            else "no replica until a request comes"
        ),
        failures=0,
        checked_at=now,
        created_at=now,
        updated_at=now,
    )
    session.add(ep)
    session.flush()
    if desired:
        made = _add_replicas(session, ep, plan, locked, desired, now)
        if made < desired:
            left = billing.left_ipu_ms(locked)
            raise QuotaExceeded(
                "The grant is spent: no replica can be held "
                f"({billing.ipu_hours(max(0, left)):.3f} IPU-hours left).",
                remaining_ipu_hours=billing.ipu_hours(max(0, left)),
            )
    routes_after_commit(session, [RouteFields.of(ep)])
    return ep


def _replica_options(ep: Endpoint, plan: Plan) -> dict[str, dict[str, float]]:
    offered = rates.offers(plan=plan, preemptible=ep.preemptible)
    return {kind: offered.option(kind, int(f["ipus"]), WINDOW_S) for kind, f in ep.serve.items()}


def _add_replicas(session: Session, ep: Endpoint, plan: Plan, tenant: Tenant, n: int, now: datetime) -> int:
    """Queue `n` replica holder jobs (the tenant's row locked by the caller), each reserving its window
    of cost or what is left of the grant; returns how many were made (fewer once the grant is spent)."""
    options = _replica_options(ep, plan)
    window = max(billing.option_cost_ipu_ms(o) for o in options.values())
    fastest = next(iter(options))
    named = ep.machine if ep.machine != "any" else None
    made = 0
    for _ in range(n):
        left = billing.left_ipu_ms(tenant)
        if left <= 0:
            break
        reserve = min(window, left)
        tenant.reserved_ipu_ms += reserve
        job = Job(
            id=new_id("job"),
            tenant_id=ep.tenant_id,
            name=f"endpoint {ep.name} replica",
            spec={
                "workload": dict(ep.workload),
                "ipus": int(options[fastest]["ipus"]),
                "machine": ep.machine,
                "endpoint": ep.id,
            },
            model=ep.model,
            task=SERVE_TASK,
            ipus=int(options[fastest]["ipus"]),
            ipus_requested=ep.ipus_requested,
            machine_type=named,
            options=options,
            prefer="time",
            partition_name=None,
            endpoint_id=ep.id,
            priority=0,
            max_runtime_s=None,
            preemptible=ep.preemptible,
            predicted_runtime_s=WINDOW_S,
            reserved_ipu_ms=reserve,
            state=JobState.QUEUED,
            attempts=0,
            cancel_requested=False,
            created_at=now,
            updated_at=now,
        )
        session.add(job)
        session.flush()
        add_event(
            session,
            job.id,
            "state",
            f"replica of endpoint {ep.name} queued: {job.ipus} IPUs ({ep.machine}); "
            f"{billing.ipu_hours(reserve):.4f} IPU-hours reserved",
            data={"state": JobState.QUEUED, "endpoint": ep.id},
            at=now,
        )
        made += 1
    return made


# Reading -------------------------------------------------------------------------------------------


def get_endpoint(*, session: Session, endpoint_id: str, scope: Scope) -> Endpoint:
    """An endpoint by id; another tenant's is indistinguishable from a missing one."""
    row = session.get(Endpoint, endpoint_id)
    if row is None or not sees(scope, row.tenant_id):
        raise NotFound(f"No endpoint {endpoint_id}.")
    return row


def list_endpoints(
    *, session: Session, scope: Scope, after: str | None, limit: int, state: str | None = None
) -> list[Endpoint]:
    """The scope's endpoints, newest first; `after` is the id of the last one of the previous page."""
    stmt = restrict(select(Endpoint).order_by(Endpoint.id.desc()).limit(limit), Endpoint.tenant_id, scope)
    if state is not None:
        stmt = stmt.where(Endpoint.state == state)
    if after is not None:
        stmt = stmt.where(Endpoint.id < after)
    return list(session.execute(stmt).scalars())


class ReplicaView(TypedDict):
    """One replica: its holder job, state and where it runs."""

    id: str
    state: str
    ipus: int
    machine: str | None
    partition: str | None
    started_at: datetime | None
    ready_at: datetime | None
    billed_ipu_hours: float


@dataclass(frozen=True)
class Replica:
    job: Job
    attempt: Attempt | None
    state: str
    ready_at: datetime | None
    partition: str | None = None


def replica_state(job: Job, attempt: Attempt | None, now: datetime) -> tuple[str, datetime | None]:
    """A replica's state, derived from its holder job and attempt (module docstring), and when it was or
    will be ready (wall clock) once its attempt runs."""
    if job.cancel_requested and job.state not in FINAL_JOB_STATES:
        return "draining", None
    if job.state in FINAL_JOB_STATES:
        return "stopped", None
    if (
        attempt is None
        or attempt.state != AttemptState.RUNNING
        or attempt.started_at is None
        or job.state != JobState.RUNNING
    ):
        return "queued", None
    timeline = attempt.timeline or {}
    if "compile_s" not in timeline or "load_s" not in timeline:
        return "compiling", None
    clock = Clock(float(timeline.get("scale", 1.0)) or 1.0)  # the one its attempt was taken at
    warm = float(timeline["compile_s"]) + float(timeline["load_s"])
    ready_at = clock.wall_after(attempt.started_at, warm)
    t = clock.cluster_since(attempt.started_at, now)
    if t < float(timeline["compile_s"]):
        return "compiling", ready_at
    if t < warm:
        return "loading", ready_at
    return "ready", ready_at


def replicas_of(
    *, session: Session, endpoint_ids: Sequence[str], now: datetime, live_only: bool = True
) -> dict[str, list[Replica]]:
    """Each endpoint's replicas (its holder jobs not ended, oldest first) with their derived states."""
    out: dict[str, list[Replica]] = {e: [] for e in endpoint_ids}
    if not endpoint_ids:
        return out
    stmt = select(Job).where(Job.endpoint_id.in_(list(endpoint_ids)), Job.task == SERVE_TASK)
    if live_only:
        stmt = stmt.where(Job.state.in_((JobState.QUEUED, JobState.RUNNING)))
    jobs = list(session.execute(stmt.order_by(Job.id)).scalars())
    current = (
        {
            a.job_id: a
            for a in session.execute(
                select(Attempt).where(
                    Attempt.job_id.in_([j.id for j in jobs if j.attempts]),
                    Attempt.state.in_(LIVE_ATTEMPT_STATES),
                )
            ).scalars()
        }
        if jobs
        else {}
    )
    names = (
        dict(
            session.execute(
                select(Partition.pk, Partition.name).where(
                    Partition.pk.in_({a.partition_pk for a in current.values()})
                )
            )
            .tuples()
            .all()
        )
        if current
        else {}
    )
    for job in jobs:
        attempt = current.get(job.id)
        state, ready_at = replica_state(job, attempt, now)
        assert job.endpoint_id is not None
        where = names.get(attempt.partition_pk) if attempt is not None else None
        out[job.endpoint_id].append(Replica(job, attempt, state, ready_at, where))
    return out


def billed_ipu_ms(*, session: Session, endpoint_ids: Sequence[str]) -> dict[str, int]:
    """What each endpoint's replicas were billed so far (meter ticks and settles)."""
    if not endpoint_ids:
        return {}
    rows = session.execute(
        select(Job.endpoint_id, func.coalesce(func.sum(Attempt.metered_ipu_ms), 0))
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Job.endpoint_id.in_(list(endpoint_ids)))
        .group_by(Job.endpoint_id)
    ).tuples()
    return {str(e): int(v) for e, v in rows}


# Changing and deleting -------------------------------------------------------------------------------


def _event(session: Session, ep: Endpoint, type_: str, *, key: str, now: datetime, **extra: Any) -> None:
    """An endpoint's event: thin, its id and where to read it."""
    data = {"id": ep.id, "name": ep.name, "state": str(ep.state), "url": f"/api/v1/endpoints/{ep.id}"}
    notifications.emit(
        session, tenant_id=ep.tenant_id, type_=type_, key=f"{ep.id}:{key}", data={**data, **extra}, at=now
    )


def _scaled(session: Session, ep: Endpoint, was: int, reason: str, now: datetime) -> None:
    """`endpoint.scaled` when the wanted replica count changed from `was` (the autoscaler or a PATCH)."""
    if ep.desired_replicas != was:
        _event(
            session,
            ep,
            "endpoint.scaled",
            key=f"{was}-{ep.desired_replicas}:{now.isoformat()}",
            now=now,
            **{"from": was, "to": ep.desired_replicas, "reason": reason},
        )


def _lock(session: Session, endpoint_id: str, scope: Scope) -> Endpoint:
    """The scope's endpoint, locked until commit; 404 before any lock, 409 once it has stopped."""
    get_endpoint(session=session, endpoint_id=endpoint_id, scope=scope)
    row = session.execute(
        select(Endpoint)
        .where(Endpoint.id == endpoint_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    if row.state not in LIVE_ENDPOINT_STATES:
        raise Conflict(f"Endpoint {endpoint_id} is {row.state} ({row.reason}).", state=row.state)
    return row


def change_endpoint(*, session: Session, endpoint_id: str, scope: Scope, change: EndpointChange) -> Endpoint:
    """Change replicas, autoscaling, batching or the queue while the endpoint serves. New replica counts
    are reached by the serve pass (replicas added, or drained one at a time); a new batch size is
    planned at once (422 when it fits no replica of the endpoint's size) and reaches replicas started
    after it, the old ones being drained once the new ones are ready."""
    ep = _lock(session, endpoint_id, scope)
    now = utcnow()
    was = ep.desired_replicas
    plan = session.execute(
        select(Plan).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == ep.tenant_id)
    ).scalar_one()
    if change.batching is not None:
        batch = change.batching.max_batch_size
        if batch != ep.batching["max_batch_size"]:
            source = None
            if ep.model not in WORKLOAD_NAMES:
                source = own_models.source_by_id(session=session, model_id=ep.model)
            planned = _plan(
                model=ep.model,
                source=source,
                seq_len=ep.workload.get("seq_len"),
                dims=ep.workload.get("dims"),
                precision=str(ep.workload.get("precision", "fp16")),
                ipus=ep.ipus_per_replica if ep.ipus_requested != "auto" else "auto",
                batch=batch,
                candidates=tuple(ep.serve),
            )
            grown = max(f["ipus"] for f in planned.serve.values())
            if grown > plan.max_partition_size:
                raise LimitExceeded(
                    f"A replica for batches of {batch} needs {grown} IPUs; the {plan.name} plan allows "
                    f"partitions of at most {plan.max_partition_size}.",
                    limit="max_partition_size",
                )
            replicas_max = change.replicas.max if change.replicas is not None else ep.replicas_max
            _check_replicas(plan, replicas_max, grown, _held_ipus(session, ep.tenant_id, but=ep.id))
            ep.workload = planned.workload
            ep.serve = dict(planned.serve)
            ep.ipus_per_replica = grown
            batch = planned.max_batch_size
        ep.batching = {"max_batch_size": batch, "max_wait_ms": change.batching.max_wait_ms}
    if change.replicas is not None:
        _check_replicas(
            plan, change.replicas.max, ep.ipus_per_replica, _held_ipus(session, ep.tenant_id, but=ep.id)
        )
        ep.replicas_min, ep.replicas_max = change.replicas.min, change.replicas.max
        ep.desired_replicas = min(max(ep.desired_replicas, ep.replicas_min), ep.replicas_max)
        _scaled(session, ep, was, f"replicas set to {ep.replicas_min}..{ep.replicas_max}", now)
    if change.autoscaling is not None:
        ep.autoscaling = change.autoscaling.model_dump(mode="json")
    if change.max_queue is not None:
        ep.max_queue = change.max_queue
    if change.cold_start_timeout_s is not None:
        ep.cold_start_timeout_s = change.cold_start_timeout_s
    ep.updated_at = now
    session.flush()
    routes_after_commit(session, [RouteFields.of(ep)])
    return ep


def delete_endpoint(*, session: Session, endpoint_id: str, scope: Scope) -> Endpoint:
    """Stop an endpoint: its route goes (new requests are refused), its replicas are drained and billed
    up to now, and its name may be used again."""
    ep = _lock(session, endpoint_id, scope)
    now = utcnow()
    live = replicas_of(session=session, endpoint_ids=[ep.id], now=now)[ep.id]
    _drain(session, [r.job for r in live], f"endpoint {ep.name} deleted")
    _stop(ep, "deleted", "deleted by its owner", now)
    session.flush()
    routes_after_commit(session, [RouteFields.of(ep)])
    return ep


def _stop(ep: Endpoint, why: str, detail: str, now: datetime) -> None:
    ep.state = EndpointState.STOPPED
    ep.reason = f"{why}: {detail}"[:1000]
    ep.desired_replicas = 0
    ep.stopped_at = now
    ep.updated_at = now


def _drain(session: Session, jobs: Sequence[Job], reason: str) -> list[str]:
    """Stop these replicas through the cancel path: a queued one ends now, a running one's attempt is
    ended (billed up to now) and its agent told to stop. Returns the jobs drained."""
    ids = sorted(j.id for j in jobs)
    if not ids:
        return []
    # FOR NO KEY UPDATE, as attempts._lock_jobs: an agent's meter event (a foreign key to the job)
    # written while it holds the attempt must not wait for this lock while this waits for the attempt.
    locked = list(
        session.execute(
            select(Job)
            .where(Job.id.in_(ids))
            .order_by(Job.id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        ).scalars()
    )
    for job in locked:
        if job.state in FINAL_JOB_STATES:
            continue
        job.cancel_requested = True
        job.updated_at = utcnow()
    live = list(
        session.execute(
            select(Attempt.id).where(Attempt.job_id.in_(ids), Attempt.state.in_(LIVE_ATTEMPT_STATES))
        ).scalars()
    )
    attempts.stop_running(
        session=session, attempt_ids=live, outcome=AttemptState.CANCELLED, reason=reason, max_attempts=1
    )
    drained = []
    for job in locked:
        if job.state not in FINAL_JOB_STATES:
            finalize_job(session=session, job=job, state=JobState.CANCELLED, reason=reason)
        drained.append(job.id)
    return drained


# The autoscaler ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalePolicy:
    """An endpoint's scaling terms: replica bounds, the target and delays in cluster seconds, the clock
    turning them into wall seconds, and a replica's throughput at its largest batch (requests/s on the
    wall clock) when the serve plan gives one."""

    replicas_min: int
    replicas_max: int
    target_queue_delay_ms: float
    scale_up_delay_s: float
    scale_down_delay_s: float
    scale_to_zero_after_s: float | None
    clock: Clock = UNSCALED
    capacity_rps: float | None = None


@dataclass(frozen=True)
class ScaleState:
    """The autoscaler's memory between passes (wall clock)."""

    desired: int
    above_since: datetime | None = None
    below_since: datetime | None = None
    idle_since: datetime | None = None


# Scale down only while the rest would run below this share of their capacity, so a replica removed
# is not added back a moment later.
DOWN_UTILISATION = 0.7


def decide_scale(
    policy: ScalePolicy, state: ScaleState, window: WindowLike | None, serving: int, now: datetime
) -> tuple[ScaleState, str | None]:
    """How many replicas an endpoint wants now, and why it changed (None: unchanged).

    Up when the mean queue delay stays above target for `scale_up_delay_s` while every wanted replica
    serves (replicas still starting would only be doubled up): to as many as the requests arriving
    need at a replica's throughput at the configured batch (`capacity_rps`), at once, or, when that
    says no more (a backlog to drain, no plan figures), by the ratio of delay to target, at most
    doubling; never past `replicas_max` (which create and change keep within the plan's limits).
    Down by one after the queue delay stays under half the target and the load would fit in
    one replica fewer for `scale_down_delay_s`. To zero after `scale_to_zero_after_s` with no request
    (only with replicas.min 0). From zero at once when a request waits. No window (the data plane
    cannot say): as it is."""
    lo, hi = policy.replicas_min, policy.replicas_max
    desired = min(max(state.desired, lo), hi)
    why: str | None = None if desired == state.desired else f"within replicas {lo}..{hi}"
    if window is None:
        return replace(state, desired=desired), why

    def waited(since: datetime | None, cluster_s: float) -> bool:
        return since is not None and policy.clock.cluster_since(since, now) >= cluster_s

    busy = window.requests > 0 or window.queued > 0
    idle_since = None if busy else (state.idle_since or now)
    above, below = state.above_since, state.below_since
    if desired == 0:
        if busy:
            up = max(1, lo)
            return ScaleState(up, None, None, None), f"a request waits: starting {up} (cold start)"
        return ScaleState(0, None, None, idle_since), why
    target = policy.target_queue_delay_ms
    if busy and window.queue_delay_ms > target:
        above = above or now
        below = None
        if waited(above, policy.scale_up_delay_s) and serving >= desired and desired < hi:
            by_delay = min(2 * desired, max(desired + 1, math.ceil(desired * window.queue_delay_ms / target)))
            need = replicas_needed(window.arrival_rps, policy.capacity_rps)
            grown = min(hi, max(by_delay, need))
            why = (
                f"queue delay {window.queue_delay_ms:.1f} ms above the target {target:g} ms for "
                f"{policy.scale_up_delay_s:g} s"
            )
            if need > by_delay:
                why += (
                    f", {window.arrival_rps:.0f} requests/s arriving need {need} replicas of "
                    f"{policy.capacity_rps:.0f}/s"
                )
            why += f": {desired} -> {grown} replicas"
            return ScaleState(grown, now, None, idle_since), why
        return ScaleState(desired, above, below, idle_since), why
    above = None
    if (
        lo == 0
        and policy.scale_to_zero_after_s is not None
        and waited(idle_since, policy.scale_to_zero_after_s)
    ):
        return ScaleState(0, None, None, idle_since), (
            f"no request for {policy.scale_to_zero_after_s:g} s: scaled to zero"
        )
    fits = policy.capacity_rps is None or window.rps <= DOWN_UTILISATION * policy.capacity_rps * (desired - 1)
    if desired > max(lo, 1) and window.queue_delay_ms <= target / 2 and fits:
        below = below or now
        if waited(below, policy.scale_down_delay_s):
            why = (
                f"load fits in {desired - 1} replicas for {policy.scale_down_delay_s:g} s: "
                f"{desired} -> {desired - 1}"
            )
            return ScaleState(desired - 1, None, now, idle_since), why
    else:
        below = None
    return ScaleState(desired, above, below, idle_since), why


def replicas_needed(arrival_rps: float, capacity_rps: float | None) -> int:
    """Replicas that serve `arrival_rps` at `capacity_rps` each (0: the figures cannot say)."""
    if not capacity_rps or capacity_rps <= 0 or arrival_rps <= 0:
        return 0
    # A hair over a whole number of replicas is that number (a measured rate wobbles).
    return max(1, math.ceil(arrival_rps / capacity_rps - 1e-6))


def _throughput_at(figures: ServeFigures, batch: int) -> float | None:
    """A replica's planned throughput (cluster requests/s) at the largest planned batch up to `batch`."""
    rows = [r for r in figures["batches"] if int(r["batch_size"]) <= batch] or list(figures["batches"][:1])
    return float(rows[-1]["throughput"]) if rows else None


def policy_of(ep: Endpoint, clock: Clock) -> ScalePolicy:
    a = ep.autoscaling
    capacity = None
    batch = int(ep.batching["max_batch_size"])
    # At the configured batch, on the slowest machine type the replicas may be placed on. The plan's
    # figures are cluster requests/s; a wall second holds `to_cluster(1.0)` cluster seconds.
    each = [t for t in (_throughput_at(f, batch) for f in ep.serve.values()) if t is not None]
    if each:
        capacity = min(each) * clock.to_cluster(1.0)
    zero = a.get("scale_to_zero_after_s")
    return ScalePolicy(
        replicas_min=ep.replicas_min,
        replicas_max=ep.replicas_max,
        target_queue_delay_ms=float(a["target_queue_delay_ms"]),
        scale_up_delay_s=float(a["scale_up_delay_s"]),
        scale_down_delay_s=float(a["scale_down_delay_s"]),
        scale_to_zero_after_s=None if zero is None else float(zero),
        clock=clock,
        capacity_rps=capacity,
    )


# The scheduler's serve pass ------------------------------------------------------------------------------


@dataclass
class ServeResult:
    created: int = 0
    drained: int = 0
    stopped: list[tuple[str, str]] = field(default_factory=list)
    routes: list[RouteFields] = field(default_factory=list)
    rolled_up: int = 0
    running: dict[str, list[int]] = field(default_factory=dict)
    """Per endpoint, its replicas' running attempts: the data plane fails over what any other holds."""


def live_endpoint_ids(*, session: Session) -> list[str]:
    return list(
        session.execute(
            select(Endpoint.id).where(Endpoint.state.in_(LIVE_ENDPOINT_STATES)).order_by(Endpoint.id)
        ).scalars()
    )


def _matches(job: Job, ep: Endpoint) -> bool:
    """Whether a replica runs the endpoint's present layout (a batching change makes older ones stale)."""
    return bool(job.spec.get("workload") == ep.workload)


def _drain_order(r: Replica) -> tuple[int, str]:
    # Those not serving yet go first (nothing is lost), then the newest of those serving.
    rank = {"queued": 0, "compiling": 1, "loading": 2, "ready": 3}.get(r.state, 0)
    return rank, "".join(chr(0x10FFFF - ord(c)) for c in r.job.id)


def serve_pass(
    *,
    session: Session,
    now: datetime,
    clock: Clock,
    windows: Mapping[str, WindowLike],
    refresh_routes: bool = False,
) -> ServeResult:
    """Scale, replace, stop and roll up every live endpoint (the scheduler leader's transaction).
    `windows` are the endpoints' last minute from the data plane (`read_windows`); `refresh_routes`
    returns every live endpoint's route to publish again, not only those that changed."""
    result = ServeResult()
    rows = list(
        session.execute(
            select(Endpoint)
            .where(Endpoint.state.in_(LIVE_ENDPOINT_STATES))
            .order_by(Endpoint.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalars()
    )
    if not rows:
        return result
    ids = [ep.id for ep in rows]
    live = replicas_of(session=session, endpoint_ids=ids, now=now)
    result.running = {
        eid: [r.attempt.id for r in reps if r.attempt is not None and r.attempt.state == AttemptState.RUNNING]
        for eid, reps in live.items()
    }
    oldest_check = min((ep.checked_at or ep.created_at) for ep in rows)
    ended: dict[str, list[Job]] = {}
    for job in session.execute(
        select(Job)
        .where(
            Job.endpoint_id.in_(ids),
            Job.state.in_(tuple(FINAL_JOB_STATES)),
            Job.finished_at > oldest_check,
            Job.cancel_requested.is_(False),
        )
        .order_by(Job.id)
    ).scalars():
        assert job.endpoint_id is not None
        ended.setdefault(job.endpoint_id, []).append(job)
    faulted = _faulted_since(session, ids, oldest_check)
    grow: list[tuple[Endpoint, int]] = []
    became_ready: list[tuple[Endpoint, str]] = []
    for ep in rows:
        before = (ep.state, ep.reason)
        checked = ep.checked_at or ep.created_at
        replicas = live[ep.id]
        # Replicas that ended by themselves since the last pass: replaced, unless the grant is spent.
        gone = [j for j in ended.get(ep.id, []) if j.finished_at is not None and j.finished_at > checked]
        fault_at = faulted.get(ep.id)
        # The watermark is the latest end looked at (the clocks that wrote them), not this pass's now:
        # an end is looked at once, whichever process's clock stamped it.
        seen = [checked, *(j.finished_at for j in gone if j.finished_at is not None)]
        if fault_at is not None and fault_at > checked:
            seen.append(fault_at)
        ep.checked_at = max(seen)
        quota = next((j for j in gone if j.state == JobState.FAILED and "grant" in (j.reason or "")), None)
        if quota is not None:
            _drain(session, [r.job for r in replicas], f"endpoint {ep.name} stopped: the grant is spent")
            _stop(ep, QUOTA, "the tenant's IPU-hour grant is spent", now)
            result.stopped.append((ep.id, QUOTA))
            result.routes.append(RouteFields.of(ep))
            continue
        failed = [j for j in gone if j.state == JobState.FAILED]
        if any(r.state == "ready" for r in replicas):
            ep.failures = 0
        ep.failures += len(failed)
        if failed and ep.failures >= FAILURE_LIMIT:
            _drain(session, [r.job for r in replicas], f"endpoint {ep.name} failed")
            ep.state = EndpointState.FAILED
            ep.reason = f"{ep.failures} replicas failed to start in a row; the last: {failed[-1].reason}"[
                :1000
            ]
            ep.desired_replicas = 0
            ep.stopped_at = now
            ep.updated_at = now
            # Failed is final: one event per endpoint.
            _event(session, ep, "endpoint.failed", key="failed", now=now, reason=ep.reason)
            result.stopped.append((ep.id, "failed"))
            result.routes.append(RouteFields.of(ep))
            continue
        if gone or (fault_at is not None and fault_at > checked):
            ep.degraded_since = ep.degraded_since or now
        current = [r for r in replicas if _matches(r.job, ep) and r.state != "draining"]
        stale = [r for r in replicas if not _matches(r.job, ep) and r.state != "draining"]
        serving = sum(1 for r in replicas if r.state == "ready")
        state0 = ScaleState(ep.desired_replicas, ep.above_since, ep.below_since, ep.idle_since)
        scaled, why = decide_scale(policy_of(ep, clock), state0, windows.get(ep.id), serving, now)
        ep.desired_replicas = scaled.desired
        ep.above_since, ep.below_since, ep.idle_since = (
            scaled.above_since,
            scaled.below_since,
            scaled.idle_since,
        )
        if why is not None and scaled.desired != state0.desired:
            log.info("endpoint %s: %s", ep.id, why)
        _scaled(session, ep, state0.desired, why or "autoscaler", now)
        # Reach the wanted count: drain the extra (those not serving first), queue what is missing.
        extra = len(current) - scaled.desired
        if extra > 0:
            victims = sorted(current, key=_drain_order)[:extra]
            result.drained += len(
                _drain(session, [r.job for r in victims], f"endpoint {ep.name} scaled down")
            )
            current = [r for r in current if r not in victims]
        elif extra < 0:
            grow.append((ep, -extra))
        # Replicas of an older layout serve until as many of the new one do.
        ready_now = sum(1 for r in current if r.state == "ready")
        if stale and (ready_now >= scaled.desired):
            result.drained += len(_drain(session, [r.job for r in stale], f"endpoint {ep.name} changed"))
            stale = []
        ready = ready_now + sum(1 for r in stale if r.state == "ready")
        _set_state(ep, scaled.desired, ready, len(current) + len(stale), why)
        if (ep.state, ep.reason) != before:
            ep.updated_at = now
        if ep.state == EndpointState.READY and before[0] != EndpointState.READY:
            became_ready.append((ep, str(before[0])))
        if ep.state != before[0] or refresh_routes:
            result.routes.append(RouteFields.of(ep))
    # Last, since it locks the tenants' rows: the replicas to add.
    if grow:
        plans = dict(
            session.execute(
                select(Tenant.id, Plan)
                .join(Plan, Plan.name == Tenant.plan_name)
                .where(Tenant.id.in_({ep.tenant_id for ep, _ in grow}))
            )
            .tuples()
            .all()
        )
        for ep, n in sorted(grow, key=lambda g: (g[0].tenant_id, g[0].id)):
            tenant = _lock_tenant(session, ep.tenant_id)
            made = _add_replicas(session, ep, plans[ep.tenant_id], tenant, n, now)
            result.created += made
            if made == 0 and billing.left_ipu_ms(tenant) <= 0:
                _drain(
                    session,
                    [r.job for r in live[ep.id]],
                    f"endpoint {ep.name} stopped: the grant is spent",
                )
                _stop(ep, QUOTA, "the tenant's IPU-hour grant is spent", now)
                result.stopped.append((ep.id, QUOTA))
                result.routes.append(RouteFields.of(ep))
    # After the additions: one that stopped there (its grant spent) did not become ready.
    for ep, was in became_ready:
        if ep.state == EndpointState.READY:
            _event(session, ep, "endpoint.ready", key=f"{was}:{now.isoformat()}", now=now, previous_state=was)
    result.rolled_up = _roll_up(session, rows, windows, live, now)
    return result


def _faulted_since(session: Session, endpoint_ids: Sequence[str], since: datetime) -> dict[str, datetime]:
    """Per endpoint, the latest end after `since` of a replica's attempt that a platform fault ended (a
    lost agent, a failed machine, a preemption): its job is queued again, to be placed anew."""
    return {
        str(e): at
        for e, at in session.execute(
            select(Job.endpoint_id, func.max(Attempt.ended_at))
            .join(Attempt, Attempt.job_id == Job.id)
            .where(
                Job.endpoint_id.in_(list(endpoint_ids)),
                Attempt.state.in_(tuple(PLATFORM_FAULT_STATES)),
                Attempt.ended_at > since,
            )
            .group_by(Job.endpoint_id)
        ).tuples()
        if at is not None
    }


def _set_state(ep: Endpoint, desired: int, ready: int, held: int, why: str | None) -> None:
    """The endpoint's state and reason from its replicas (see EndpointState)."""
    if ready >= desired and ep.degraded_since is not None:
        ep.degraded_since = None
    if desired == 0 and held == 0:
        ep.state, ep.reason = EndpointState.SCALED_TO_ZERO, why or "idle: no replica held"
    elif desired == 0:
        ep.state, ep.reason = (
            EndpointState.SCALED_TO_ZERO,
            f"draining {held} replica{'s' if held != 1 else ''}",
        )
    elif ep.degraded_since is not None:
        ep.state = EndpointState.DEGRADED
        ep.reason = f"{ready} of {desired} replicas serving: replacing a replica that was lost or failed"
    elif ready == 0:
        ep.state = EndpointState.PROVISIONING
        ep.reason = f"starting {desired} replica{'s' if desired != 1 else ''} (queued, compiling or loading)"
    else:
        ep.state = EndpointState.READY
        ep.reason = (
            f"{ready} of {desired} replicas serving" + (f"; {why}" if why else "")
            if ready < desired
            else f"{ready} replica{'s' if ready != 1 else ''} serving" + (f"; {why}" if why else "")
        )
    ep.reason = ep.reason[:1000] if ep.reason else None


def _minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def _roll_up(
    session: Session,
    rows: Sequence[Endpoint],
    windows: Mapping[str, WindowLike],
    live: Mapping[str, Sequence[Replica]],
    now: datetime,
) -> int:
    """One `endpoint_stats` row per endpoint per minute: the minute just ended, as the last minute's
    window says once it has passed (the first pass of a minute writes the one before)."""
    written = 0
    this = _minute(now)
    for ep in rows:
        if ep.state not in LIVE_ENDPOINT_STATES:
            continue
        last = ep.rolled_up_to
        w = windows.get(ep.id)
        if w is None or (last is not None and last >= this - timedelta(minutes=1)):
            continue
        minute = this - timedelta(minutes=1)
        if session.get(EndpointStat, (ep.id, minute)) is None:
            session.add(
                EndpointStat(
                    endpoint_id=ep.id,
                    minute=minute,
                    tenant_id=ep.tenant_id,
                    requests=int(w.requests),
                    errors=int(getattr(w, "unavailable_503", 0)),
                    rejected=int(getattr(w, "rejected_429", 0)),
                    cold_starts=int(getattr(w, "cold_starts", 0)),
                    p50_ms=_num(getattr(w, "p50_ms", None)),
                    p90_ms=_num(getattr(w, "p90_ms", None)),
                    p99_ms=_num(getattr(w, "p99_ms", None)),
                    mean_batch=_num(getattr(w, "mean_batch", None)),
                    queue_delay_ms=_num(getattr(w, "queue_delay_ms", None)),
                    replicas=sum(1 for r in live.get(ep.id, ()) if r.state == "ready"),
                    desired=ep.desired_replicas,
                )
            )
            written += 1
        ep.rolled_up_to = minute
    return written


def _num(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    return None if math.isnan(v) or math.isinf(v) else round(v, 4)


# Views ------------------------------------------------------------------------------------------------


class StatView(TypedDict):
    """One minute of an endpoint's history."""

    minute: datetime
    requests: int
    errors: int
    rejected: int
    cold_starts: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    mean_batch: float | None
    queue_delay_ms: float | None
    replicas: int
    desired: int


def history(*, session: Session, endpoint_id: str, since: datetime, limit: int = 1440) -> list[StatView]:
    """An endpoint's minutes since `since`, oldest first."""
    rows = session.execute(
        select(EndpointStat)
        .where(EndpointStat.endpoint_id == endpoint_id, EndpointStat.minute >= since)
        .order_by(EndpointStat.minute)
        .limit(limit)
    ).scalars()
    return [
        {
            "minute": r.minute,
            "requests": r.requests,
            "errors": r.errors,
            "rejected": r.rejected,
            "cold_starts": r.cold_starts,
            "p50_ms": r.p50_ms,
            "p90_ms": r.p90_ms,
            "p99_ms": r.p99_ms,
            "mean_batch": r.mean_batch,
            "queue_delay_ms": r.queue_delay_ms,
            "replicas": r.replicas,
            "desired": r.desired,
        }
        for r in rows
    ]


class WindowView(TypedDict):
    """The endpoint's last minute as the data plane counts it."""

    requests: int
    answered: int
    rejected_429: int
    unavailable_503: int
    cold_starts: int
    rps: float
    mean_batch: float | None
    queue_delay_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    queued: int
    ready_replicas: int


def window_json(w: WindowLike | None) -> WindowView | None:
    if w is None:
        return None
    return {
        "requests": int(w.requests),
        "answered": int(w.answered),
        "rejected_429": int(w.rejected_429),
        "unavailable_503": int(w.unavailable_503),
        "cold_starts": int(w.cold_starts),
        "rps": round(float(w.rps), 4),
        "mean_batch": _num(w.mean_batch),
        "queue_delay_ms": _num(w.queue_delay_ms),
        "p50_ms": _num(w.p50_ms),
        "p90_ms": _num(w.p90_ms),
        "p99_ms": _num(w.p99_ms),
        "queued": int(w.queued),
        "ready_replicas": int(w.ready_replicas),
    }


class EndpointJson(TypedDict):
    """An endpoint as the API shows it (`EndpointOut`)."""

    id: str
    name: str
    url: str
    model: str
    model_id: str
    state: str
    reason: str | None
    machine: str
    ipus_per_replica: int
    ipus_requested: str
    workload: dict[str, Any]
    replicas: dict[str, int]
    autoscaling: dict[str, Any]
    batching: dict[str, Any]
    max_queue: int
    cold_start_timeout_s: float
    preemptible: bool
    signature: dict[str, Any]
    serve_plans: list[ServeFigures]
    replica_list: list[ReplicaView]
    billed_ipu_hours: float
    created_at: datetime
    updated_at: datetime
    stopped_at: datetime | None


def endpoint_json(
    *, ep: Endpoint, replicas: Sequence[Replica], billed_ipu_ms: int, base_url: str
) -> EndpointJson:
    return {
        "id": ep.id,
        "name": ep.name,
        "url": f"{base_url.rstrip('/')}/api/v1/endpoints/{ep.id}",
        "model": ep.model_name,
        "model_id": ep.model,
        "state": ep.state,
        "reason": ep.reason,
        "machine": ep.machine,
        "ipus_per_replica": ep.ipus_per_replica,
        "ipus_requested": ep.ipus_requested,
        "workload": dict(ep.workload),
        "replicas": {
            "min": ep.replicas_min,
            "max": ep.replicas_max,
            "desired": ep.desired_replicas,
            "ready": sum(1 for r in replicas if r.state == "ready"),
        },
        "autoscaling": dict(ep.autoscaling),
        "batching": dict(ep.batching),
        "max_queue": ep.max_queue,
        "cold_start_timeout_s": ep.cold_start_timeout_s,
        "preemptible": ep.preemptible,
        "signature": dict(ep.signature),
        "serve_plans": list(ep.serve.values()),
        "replica_list": [
            {
                "id": r.job.id,
                "state": r.state,
                "ipus": r.job.ipus,
                "machine": r.attempt.machine_type if r.attempt is not None else r.job.machine_type,
                "partition": r.partition,
                "started_at": r.attempt.started_at if r.attempt is not None else None,
                "ready_at": r.ready_at,
                "billed_ipu_hours": billing.ipu_hours(
                    r.attempt.metered_ipu_ms if r.attempt is not None else 0
                ),
            }
            for r in replicas
        ],
        "billed_ipu_hours": billing.ipu_hours(billed_ipu_ms),
        "created_at": ep.created_at,
        "updated_at": ep.updated_at,
        "stopped_at": ep.stopped_at,
    }


def endpoint_counts(*, session: Session) -> dict[str, int]:
    """Endpoints by state, for the Prometheus gauges."""
    return {
        str(state): int(n)
        for state, n in session.execute(
            select(Endpoint.state, func.count()).group_by(Endpoint.state)
        ).tuples()
    }


def replica_counts(*, session: Session, now: datetime) -> dict[tuple[str, str], int]:
    """Replicas per (endpoint, state) of every live endpoint, for the Prometheus gauges."""
    ids = live_endpoint_ids(session=session)
    out: dict[tuple[str, str], int] = {}
    for ep_id, reps in replicas_of(session=session, endpoint_ids=ids, now=now).items():
        for r in reps:
            out[(ep_id, r.state)] = out.get((ep_id, r.state), 0) + 1
    return out
