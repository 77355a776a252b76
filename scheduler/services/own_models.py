"""Tenants' own models: ONNX graphs stored without their weights, with a per-plan count and size quota.

The graph (weights stripped: a few hundred kilobytes for BERT-Large) is kept in the database, so every
API process and every host agent reads it through the connection it already has: no shared file system
between hosts, and a model is gone with its row. A model is immutable; a job names it by id or name, and
the job's stored spec carries the id, so the worker plans exactly the graph the job was admitted with.
A model that queued or running jobs use cannot be removed.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.errors import (
    Conflict,
    InvalidModel,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    PayloadTooLarge,
    TenantInactive,
)
from scheduler.ids import is_valid_id, new_id
from scheduler.models import Job, JobState, OwnModel, Plan, Tenant, utcnow
from vipu.emulator import WorkloadError
from vipu.emulator.catalogue import WORKLOAD_NAMES
from vipu.emulator.spec import MAX_DIMS

# vipu.emulator.onnxgraph is imported where a graph is handled: it brings in onnx (and ml_dtypes),
# about a second of every API, scheduler and worker process's start-up, most of which never see one.
if TYPE_CHECKING:
    from vipu.emulator.onnxgraph import GraphError, OnnxGraph, OnnxWorkload, Stripped

ID_PREFIX = "mdl"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
OPERATOR = re.compile(r"^([A-Za-z0-9_.]{1,100}::)?[A-Za-z][A-Za-z0-9_]{0,99}$")
MAX_ELEMENTWISE = 64
_LIVE = (JobState.QUEUED.value, JobState.RUNNING.value)


@dataclass(frozen=True)
class Analysed:
    """An upload checked and described, ready to store: everything but the database's say."""

    stripped: Stripped
    graph: OnnxGraph
    summary: dict[str, Any]
    dims: dict[str, int]
    elementwise: tuple[str, ...]


def parse_dims(raw: str | Mapping[str, Any] | None) -> dict[str, int]:
    """``dims`` as a JSON object (a form field) or a mapping: dimension name -> size."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            if len(raw) > 10_000:
                raise ValueError("too long")
            value = json.loads(raw)
        except (ValueError, RecursionError):  # 1,000 nested arrays exhaust the decoder's stack
            raise InvalidRequest('dims must be a JSON object such as {"sequence": 128}.', field="dims")
    else:
        value = dict(raw)
    if not isinstance(value, dict) or len(value) > MAX_DIMS:
        raise InvalidRequest(f"dims must be a JSON object of at most {MAX_DIMS} sizes.", field="dims")
    out: dict[str, int] = {}
    for name, size in value.items():
        if not 1 <= len(name) <= 100 or isinstance(size, bool) or not isinstance(size, int):
            raise InvalidRequest(
                f"dims: {name!r} must name a dimension and give an integer size.", field="dims"
            )
        if not 1 <= size <= 1_048_576:
            raise InvalidRequest(f"dims: {name} must be from 1 to 1,048,576, got {size}.", field="dims")
        out[name] = size
    return out


def parse_elementwise(raw: str | Sequence[str] | None) -> tuple[str, ...]:
    """Operators declared element-wise: a comma-separated list or a sequence (``Op`` or ``domain::Op``)."""
    if raw is None or raw == "":
        return ()
    # ASCII blanks only: a no-break space is not "no operator" but a name no operator has.
    parts = raw.split(",") if isinstance(raw, str) else [str(p) for p in raw]
    items = [p.strip(" \t") for p in parts]
    items = [p for p in items if p]
    if len(items) > MAX_ELEMENTWISE:
        raise InvalidRequest(f"elementwise lists at most {MAX_ELEMENTWISE} operators.", field="elementwise")
    for op in items:
        if not OPERATOR.fullmatch(op):  # fullmatch: `$` alone lets a trailing newline through
            raise InvalidRequest(
                f"elementwise: {op!r} is not an operator name (Op or domain::Op).", field="elementwise"
            )
    return tuple(sorted(set(items)))


# The size at which an upload is described (its FLOPs, memory, parameters per sample) for each dynamic
# dimension it was given no size for: a job binds its own (seq_len or dims).
DESCRIBE_DIM_SIZE = 128


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidRequest(
            "name: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit.", field="name"
        )
    if name in WORKLOAD_NAMES:
        raise InvalidRequest(f"name: {name!r} is a catalogue workload; choose another name.", field="name")
    if name.startswith(f"{ID_PREFIX}_"):
        raise InvalidRequest(f"name: names may not start with {ID_PREFIX}_ (model ids do).", field="name")
    return name


def name_from_filename(filename: str | None) -> str | None:
    """A model name from an uploaded file's name (``bert.onnx`` -> ``bert``); ``check_name`` judges it."""
    if not filename:
        return None
    stem = Path(filename.replace("\\", "/")).name
    stem = stem[:-5] if stem.lower().endswith(".onnx") else stem
    candidate = re.sub(r"[^A-Za-z0-9._-]", "-", stem).strip("-._")[:64]
    return candidate or None


def _invalid(exc: GraphError) -> InvalidModel:
    return InvalidModel(f"Model not accepted: {exc.message}", reason=exc.code, names=list(exc.names)[:50])


def analyse(
    *,
    data: bytes | str | Path | BinaryIO,
    dims: Mapping[str, int],
    elementwise: Sequence[str],
    max_graph_bytes: int,
) -> Analysed:
    """Strip, check and describe an upload (no database). Every problem is a 4xx ``DomainError``."""
    from vipu.emulator.onnxgraph import GraphError, GraphTooLarge, StripError, describe, load_graph, strip_any

    try:
        stripped = strip_any(data, max_graph_bytes)
    except GraphTooLarge as exc:
        raise PayloadTooLarge(
            f"The graph without its weights is larger than {exc.limit:,} bytes.", limit=exc.limit
        )
    except StripError as exc:
        reason = "not-onnx" if str(exc).startswith(("not an ONNX", "empty file")) else "corrupt"
        raise InvalidModel(f"Model not accepted: {exc}", reason=reason, names=[])
    declared = tuple(elementwise)
    try:
        graph = load_graph(stripped.data, declared)
        missing = [d for d in graph.dynamic_dims if d not in dims]
        unknown = [d for d in dims if d not in graph.dynamic_dims]
        if unknown:
            have = ", ".join(repr(d) for d in graph.dynamic_dims) or "none besides the batch"
            raise InvalidRequest(
                f"dims: the graph has no dynamic dimension {unknown[0]!r}; its dynamic dimensions: {have}.",
                field="dims",
            )
        # The sizes of a dynamic dimension belong to the job (seq_len or dims), as a dynamic export
        # (a batch and a sequence axis) means: the graph is kept with its symbols and described at
        # a stated size for each the upload left open; a job that names the model binds them.
        described_at = {**{d: DESCRIBE_DIM_SIZE for d in missing}, **dims}
        summary = describe(graph, described_at)
        summary["dims"] = dict(dims)
        summary["described_at"] = described_at
        if missing:
            summary["notes"] = [
                f"described at {', '.join(f'{d}={DESCRIBE_DIM_SIZE}' for d in missing)}: the graph leaves "
                f"{'it' if len(missing) == 1 else 'them'} dynamic, and each job, estimate or endpoint sets "
                "the size with seq_len or dims",
                *summary["notes"],
            ]
    except GraphError as exc:
        raise _invalid(exc)
    except WorkloadError as exc:
        raise InvalidModel(f"Model not accepted: {exc.message}", reason="unknown-shape", names=[])
    return Analysed(stripped=stripped, graph=graph, summary=summary, dims=dict(dims), elementwise=declared)


# -------------------------------------------------------------------------------------------- storage


def check_standing(tenant: Any, now: datetime) -> None:
    """An expired trial (or a suspended tenant) stores no model, as it submits no job: TenantInactive."""
    if tenant.status != "active":
        raise TenantInactive(f"Tenant {tenant.name} is {tenant.status}.")
    if tenant.expires_at is not None and tenant.expires_at <= now:
        raise TenantInactive(
            f"The trial of {tenant.name} ended on {tenant.expires_at:%Y-%m-%d}: its models can be read "
            "and removed, not uploaded."
        )


def may_upload(*, session: Session, tenant_id: str) -> None:
    """`check_standing` before an upload is read, so a refused tenant's file is not spooled first."""
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("No such tenant.")
    check_standing(tenant, utcnow())


def create_model(*, session: Session, tenant_id: str, name: str, analysed: Analysed) -> OwnModel:
    """Store an analysed upload under the tenant's plan quota (judged under the tenant's row lock)."""
    check_name(name)
    row = session.execute(
        select(Tenant.name, Tenant.status, Tenant.expires_at, Plan.max_models, Plan.max_model_bytes)
        .join(Plan, Plan.name == Tenant.plan_name)
        .where(Tenant.id == tenant_id)
        .with_for_update(of=Tenant, key_share=True)
    ).first()
    if row is None:
        raise NotFound("No such tenant.")
    check_standing(row, utcnow())
    count, used = session.execute(
        select(func.count(OwnModel.id), func.coalesce(func.sum(OwnModel.graph_bytes), 0)).where(
            OwnModel.tenant_id == tenant_id
        )
    ).one()
    size = len(analysed.stripped.data)
    if count + 1 > row.max_models:
        raise LimitExceeded(
            f"Your plan keeps at most {row.max_models} models and you have {count}; remove one first.",
            limit="max_models",
        )
    if used + size > row.max_model_bytes:
        raise LimitExceeded(
            f"Your plan keeps {row.max_model_bytes:,} bytes of model graphs; yours take {used:,} and this "
            f"one {size:,}. Remove a model first.",
            limit="max_model_bytes",
        )
    existing = session.execute(
        select(OwnModel.id).where(OwnModel.tenant_id == tenant_id, OwnModel.name == name)
    ).scalar_one_or_none()
    if existing is not None:
        raise Conflict(
            f"You already have a model named {name!r} ({existing}); remove it or choose another name.",
            model=existing,
        )
    model = OwnModel(
        id=new_id(ID_PREFIX),
        tenant_id=tenant_id,
        name=name,
        sha256=analysed.stripped.digest,
        graph=analysed.stripped.data,
        graph_bytes=size,
        uploaded_bytes=analysed.stripped.original_bytes,
        weights_stripped_bytes=analysed.stripped.weight_bytes_removed,
        dims=dict(analysed.dims),
        elementwise=list(analysed.elementwise),
        summary=analysed.summary,
        created_at=utcnow(),
    )
    try:
        with session.begin_nested():
            session.add(model)
            session.flush()
    except IntegrityError:
        raise Conflict(f"You already have a model named {name!r}; remove it or choose another name.")
    _cache_graph(analysed.graph)
    return model


def _by_ref(tenant_id: str, ref: str) -> Any:
    stmt = select(OwnModel).where(OwnModel.tenant_id == tenant_id)
    return stmt.where(OwnModel.id == ref) if is_valid_id(ref, ID_PREFIX) else stmt.where(OwnModel.name == ref)


def get_model(*, session: Session, tenant_id: str, ref: str) -> OwnModel:
    """A model of the tenant by id or name; another tenant's model is indistinguishable from none."""
    model = session.execute(_by_ref(tenant_id, ref)).scalar_one_or_none()
    if model is None:
        raise NotFound(f"No model {ref!r}.")
    return model


def list_models(*, session: Session, tenant_id: str, after: str | None, limit: int) -> list[OwnModel]:
    """Newest first; ``after`` is the id of the last model of the previous page."""
    stmt = select(OwnModel).where(OwnModel.tenant_id == tenant_id).order_by(OwnModel.id.desc()).limit(limit)
    if after is not None:
        stmt = stmt.where(OwnModel.id < after)
    return list(session.execute(stmt).scalars())


def delete_model(*, session: Session, tenant_id: str, ref: str) -> OwnModel:
    """Remove a model no queued or running job uses.

    The row is locked first; admission holds a share lock on it while it queues a job that names it, so
    a job admitted concurrently is either seen here (and the removal refused) or refused itself.
    """
    model = session.execute(_by_ref(tenant_id, ref).with_for_update()).scalar_one_or_none()
    if model is None:
        raise NotFound(f"No model {ref!r}.")
    live = list(
        session.execute(
            select(Job.id)
            .where(Job.tenant_id == tenant_id, Job.state.in_(_LIVE), Job.model == model.id)
            .order_by(Job.id)
            .limit(10)
        ).scalars()
    )
    if live:
        raise Conflict(
            f"Model {model.name} is used by queued or running jobs ({', '.join(live)}); cancel them or let "
            "them finish first.",
            jobs=live,
        )
    session.delete(model)
    session.flush()
    return model


# ----------------------------------------------------------------------------------- as a workload

# Bounded memo caches (`_CACHED` entries each), kept per process rather than in the runtime
# (scheduler/runtime.py): they hold only data derived from immutable inputs (a graph by its content
# digest, a stored model by its id: a model is never changed, only removed), so any process, runtime
# or test may share them without one seeing another's state.
_graphs: OrderedDict[tuple[str, tuple[str, ...]], OnnxGraph] = OrderedDict()
_sources: OrderedDict[str, OnnxWorkload] = OrderedDict()
_lock = threading.Lock()
_CACHED = 64


def _cache_graph(graph: OnnxGraph) -> None:
    key = (graph.digest, tuple(sorted(graph.declared_elementwise)))
    with _lock:
        _graphs[key] = graph
        _graphs.move_to_end(key)
        while len(_graphs) > _CACHED:
            _graphs.popitem(last=False)


def _graph_of(session: Session, model_id: str, sha256: str, elementwise: list[str]) -> OnnxGraph:
    key = (sha256, tuple(sorted(elementwise)))
    with _lock:
        hit = _graphs.get(key)
        if hit is not None:
            _graphs.move_to_end(key)
            return hit
    from vipu.emulator.onnxgraph import load_graph

    data = session.execute(select(OwnModel.graph).where(OwnModel.id == model_id)).scalar_one()
    graph = load_graph(data, tuple(elementwise))
    _cache_graph(graph)
    return graph


def _source(session: Session, row: Any) -> OnnxWorkload:
    with _lock:
        hit = _sources.get(row.id)
        if hit is not None:
            _sources.move_to_end(row.id)
            return hit
    from vipu.emulator.onnxgraph import OnnxWorkload

    graph = _graph_of(session, row.id, row.sha256, list(row.elementwise))
    source = OnnxWorkload(graph, row.name, scope=row.tenant_id, default_dims=row.dims, model_id=row.id)
    with _lock:
        _sources[row.id] = source
        while len(_sources) > _CACHED:
            _sources.popitem(last=False)
    return source


_COLUMNS = (
    OwnModel.id,
    OwnModel.tenant_id,
    OwnModel.name,
    OwnModel.sha256,
    OwnModel.dims,
    OwnModel.elementwise,
)


def resolve_source(
    *, session: Session, tenant_id: str, model: str, lock: bool = False
) -> OnnxWorkload | None:
    """The tenant's own graph a job's ``workload.model`` names (by id or name); None for a catalogue name.

    ``lock`` takes a share lock on the model's row for the rest of the transaction (admission), so the
    model cannot be removed under a job being queued.
    """
    if model in WORKLOAD_NAMES:
        return None
    stmt = select(*_COLUMNS).where(OwnModel.tenant_id == tenant_id)
    stmt = (
        stmt.where(OwnModel.id == model)
        if is_valid_id(model, ID_PREFIX)
        else stmt.where(OwnModel.name == model)
    )
    if lock:
        stmt = stmt.with_for_update(read=True)
    row = session.execute(stmt).first()
    if row is None:
        raise InvalidRequest(
            f"workload.model: no catalogue workload or model of yours named {model!r} (the catalogue: "
            f"{', '.join(WORKLOAD_NAMES)}; your models: GET /api/v1/models).",
            field="workload.model",
        )
    return _source(session, row)


def source_by_id(*, session: Session, model_id: str) -> OnnxWorkload | None:
    """A stored model by id, whoever owns it (a job's spec carries the id its tenant was admitted with)."""
    with _lock:
        hit = _sources.get(model_id)
    if hit is not None:
        return hit
    row = session.execute(select(*_COLUMNS).where(OwnModel.id == model_id)).first()
    return None if row is None else _source(session, row)


def cached_source(model_id: str) -> OnnxWorkload | None:
    with _lock:
        return _sources.get(model_id)
