"""What the `_ops_*.py` modules share: the API prefix, path segments, job specs, body helpers."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from ipucloud.sdk._core import model
from ipucloud.sdk.models import Page

V1 = "/api/v1"
_answer = model  # for operations with a `model` parameter of their own (create_endpoint)

WORKLOAD_FIELDS = (
    "model",
    "task",
    "batch_size",
    "seq_len",
    "precision",
    "steps",
    "samples",
    "dims",
    "optimizer",
)
JOB_FIELDS = (
    "name",
    "ipus",
    "machine",
    "prefer",
    "partition",
    "session",
    "priority",
    "max_runtime_s",
    "preemptible",
    "never_preempt",
    "checkpoint_every_s",
    "array",
    "sweep",
    "depends_on",
    "on_unsatisfiable",
    "singleton",
)


def seg(value: str) -> str:
    """One path segment: ids come from users, so `/` or `..` must not change the route."""
    return quote(str(value), safe="")


def job_spec(spec: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A job spec from a mapping (e.g. a JSON/YAML file) and keyword overrides.

    Workload fields may be given flat (`model=`, `steps=`) or inside `workload`; None means
    "not given", so a flag left unset never overrides the file.
    """
    out: dict[str, Any] = {k: v for k, v in dict(spec or {}).items()}
    workload: dict[str, Any] = dict(out.get("workload") or {})
    for key in WORKLOAD_FIELDS:
        if key in out and key not in JOB_FIELDS:
            workload[key] = out.pop(key)
    for key, value in fields.items():
        if value is None:
            continue
        if key == "workload":
            # `workload={...}` as a keyword: its fields, under any flat ones given beside it.
            workload = {**dict(value), **{k: v for k, v in workload.items() if k in fields}}
        elif key in WORKLOAD_FIELDS:
            workload[key] = value
        else:
            out[key] = value
    if "steps" in fields and fields["steps"] is not None:
        workload.pop("samples", None)
    if "samples" in fields and fields["samples"] is not None:
        workload.pop("steps", None)
    out["workload"] = workload
    out.setdefault("ipus", "auto")
    if "name" not in out and workload.get("model"):
        out["name"] = str(workload["model"])
    return out


def _page(item: type[Any]) -> Any:
    return model(Page[item])  # type: ignore[valid-type]


def _iso(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _jsonable(changes: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in changes.items()}
