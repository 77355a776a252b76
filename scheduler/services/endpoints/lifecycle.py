"""An endpoint's life as its owner drives it: created (validated against the emulator and the plan,
its minimum replicas queued), read, changed while it serves, deleted.

An endpoint's events (`endpoint.ready`, `endpoint.scaled`, `endpoint.failed`; docs/notifications.md)
are written in the transaction that changes its state or its wanted replicas, under its row's lock:
their ids name the endpoint, the change and its instant, so each change writes one, however often a
pass is replayed."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler import billing
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
from scheduler.models import LIVE_ENDPOINT_STATES, Endpoint, EndpointState, Plan, Tenant, utcnow
from scheduler.services import own_models
from scheduler.services.capacity import fleet
from scheduler.services.endpoints.plans import _check_replicas, _held_ipus, _plan, _Planned
from scheduler.services.endpoints.replicas import _add_replicas, _drain, _lock_tenant, replicas_of
from scheduler.services.endpoints.routes import RouteFields, routes_after_commit
from scheduler.services.tenancy import notifications, rates
from scheduler.services.tenancy.scope import Scope, restrict, sees
from vipu.emulator.catalogue import WORKLOAD_NAMES

if TYPE_CHECKING:
    from vipu.emulator.onnxgraph import OnnxWorkload


def _check_standing(tenant: Tenant, now: datetime) -> None:
    if tenant.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {tenant.status}.")
    if tenant.expires_at is not None and tenant.expires_at <= now:
        raise TenantInactive(f"The trial of {tenant.name} ended on {tenant.expires_at:%Y-%m-%d}.")


def create_endpoint(*, session: Session, tenant_id: str, spec: EndpointSpec) -> Endpoint:
    """Admit an endpoint: validated against the emulator and the plan, its minimum replicas' holder
    jobs queued with their windows reserved. A refusal holds nothing."""
    plan = _plan_of(session, tenant_id)
    planned, source = _lay_out(session, plan, tenant_id, spec)
    ipus = max(f["ipus"] for f in planned.serve.values())
    now = utcnow()
    # The tenant's row first: the counts below and the reservation are then judged on exact figures.
    locked = _lock_tenant(session, tenant_id)
    _check_standing(locked, now)
    _check_room(session, plan, tenant_id, spec, ipus)
    ep = _new_endpoint(tenant_id, spec, planned, source, ipus, now)
    desired = ep.desired_replicas
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


def _plan_of(session: Session, tenant_id: str) -> Plan:
    """The tenant's plan: its endpoint limits and the rates its replicas reserve at."""
    return session.execute(
        select(Plan).join(Tenant, Tenant.plan_name == Plan.name).where(Tenant.id == tenant_id)
    ).scalar_one()


def _lay_out(
    session: Session, plan: Plan, tenant_id: str, spec: EndpointSpec
) -> tuple[_Planned, OnnxWorkload | None]:
    """The model laid out on a replica of each machine type the plan offers and the fleet can ever
    host (with the tenant's own graph, when it names one); refused, holding nothing, when none can."""
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
    return planned, source


def _check_room(session: Session, plan: Plan, tenant_id: str, spec: EndpointSpec, ipus: int) -> None:
    """Refuse an endpoint the plan has no room for (endpoints, replicas, IPUs) or whose name is taken."""
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


def _new_endpoint(
    tenant_id: str,
    spec: EndpointSpec,
    planned: _Planned,
    source: OnnxWorkload | None,
    ipus: int,
    now: datetime,
) -> Endpoint:
    """The endpoint's row as admitted: its minimum replicas wanted, checked from now."""
    desired = spec.replicas.min
    return Endpoint(
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
    plan = _plan_of(session, ep.tenant_id)
    if change.batching is not None:
        batch = change.batching.max_batch_size
        if batch != ep.batching["max_batch_size"]:
            batch = _replan(session, ep, plan, change, batch)
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


def _replan(session: Session, ep: Endpoint, plan: Plan, change: EndpointChange, batch: int) -> int:
    """Lay the endpoint's model out anew for batches of `batch` (422 when it fits no replica the plan
    allows) and keep the layout; returns the batch every replica forms."""
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
    return planned.max_batch_size


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
