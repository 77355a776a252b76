"""An endpoint's model laid out on a replica of each machine type (the emulator's serve plans) and
checked against what the tenant's plan allows: what create and change refuse with, before anything is
held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.errors import DoesNotFit, InvalidRequest, LimitExceeded
from scheduler.models import LIVE_ENDPOINT_STATES, Endpoint, Plan
from vipu import emulator
from vipu.emulator.serving import DEFAULT_SERVE_BATCHES, choose_serving_ipus, serve_plan, signature_of


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
