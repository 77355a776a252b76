"""What the control plane asks of the emulator: validate a workload, size it, predict its run time.

Results are cached by the request's fields: the planner is deterministic, and admission calls it
on every submission.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from scheduler.db import Database
from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import WorkloadRequest
from scheduler.services import own_models
from vipu import emulator
from vipu.emulator.catalogue import WORKLOAD_NAMES
from vipu.emulator.spec import GraphSource

# Admission predicts on the slower machine when the job may land on either, so that the quota
# reserved covers the run wherever it is placed.
DEFAULT_MACHINE = "m2000"


@dataclass(frozen=True)
class Resolved:
    ipus: int
    machine: str
    predicted_runtime_s: float


def to_workload_spec(req: WorkloadRequest, source: GraphSource | None = None) -> emulator.WorkloadSpec:
    """The emulator's spec of a request; ``source`` is the tenant's own graph it names (``own_models``)."""
    try:
        return emulator.WorkloadSpec(
            model=getattr(source, "model_id", req.model) if source is not None else req.model,
            task=req.task,
            batch_size=req.batch_size,
            seq_len=req.seq_len,
            precision=req.precision,
            steps=req.steps,
            samples=req.samples,
            dims=req.dims,
            optimizer=req.optimizer,
            source=source,
        )
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc), field=getattr(exc, "field", None))
    except ValueError as exc:
        raise InvalidRequest(str(exc))


def resolve(
    req: WorkloadRequest, ipus: int | Literal["auto"], machine: str | None, source: GraphSource | None = None
) -> Resolved:
    return _resolve_cached(req.model_dump_json(), str(ipus), machine, source)


@lru_cache(maxsize=4096)
def _resolve_cached(req_json: str, ipus: str, machine: str | None, source: GraphSource | None) -> Resolved:
    req = WorkloadRequest.model_validate_json(req_json)
    spec = to_workload_spec(req, source)
    m = machine or DEFAULT_MACHINE
    try:
        size = emulator.choose_ipus_auto(spec, m) if ipus == "auto" else int(ipus)
        emulator.plan(spec, size, m)
    except emulator.CompileError as exc:
        raise DoesNotFit(str(exc), ipus=None if ipus == "auto" else int(ipus), machine=m)
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc))
    return Resolved(ipus=size, machine=m, predicted_runtime_s=emulator.predicted_runtime_s(spec, size, m))


def plan_job(
    *,
    db: Database,
    workload: Mapping[str, Any],
    ipus: int,
    machine: str,
    pods: int | None = None,
    gw_links: bool | None = None,
) -> tuple[emulator.Plan, emulator.WorkloadSpec]:
    """The plan of a job's stored ``workload`` on its partition: what a worker runs.

    The workload names a catalogue model or (by id, as admission stored it) a tenant's own graph, which
    is read from the database on first use and cached, so a host agent plans an uploaded model exactly as
    the API admitted it, on any host. Raises ``emulator.CompileError`` (does not fit that partition) or
    ``emulator.WorkloadError`` (bad spec, or a model that no longer exists).
    """
    model = workload.get("model")
    source = None
    if isinstance(model, str) and model not in WORKLOAD_NAMES:
        source = own_models.cached_source(model)
        if source is None:
            with db.read() as s:
                source = own_models.source_by_id(session=s, model_id=model)
        if source is None:
            raise emulator.WorkloadError("model", f"model {model} no longer exists")
    spec = emulator.WorkloadSpec.from_dict(workload, source=source)
    return emulator.plan(spec, ipus, machine, pods=pods, gw_links=gw_links), spec
