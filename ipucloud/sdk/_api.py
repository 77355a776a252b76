"""Every API operation, written once: `Operations`, assembled from one class per area, each in its
own module (`_ops_jobs.py` `JobOps`, `_ops_sessions.py` `SessionOps`, ..., `_webhooks.py`); those
modules are the one place that knows routes, bodies and response types.

Each method of `Operations` returns the `Call` to send; `@operation` makes it a method of `Client`
that returns the answer and of `AsyncClient` that awaits it (`@paginated` does the same for the
`iter_*` methods, over pages). Only what truly differs between the two (uploading a file, following a
stream, polling) is written in `client.py` and `aclient.py`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import orjson

from ipucloud.sdk._core import Call, model, text
from ipucloud.sdk._ops_account import AccountOps
from ipucloud.sdk._ops_catalogue import CatalogueOps
from ipucloud.sdk._ops_common import JOB_FIELDS, V1, WORKLOAD_FIELDS, job_spec, seg
from ipucloud.sdk._ops_endpoints import EndpointOps
from ipucloud.sdk._ops_fleet import FleetOps
from ipucloud.sdk._ops_jobs import JobOps
from ipucloud.sdk._ops_models import ModelOps
from ipucloud.sdk._ops_sessions import SessionOps
from ipucloud.sdk._ops_tenancy import TenancyOps
from ipucloud.sdk._webhooks import WebhookOperations
from ipucloud.sdk.models import OnnxModel

__all__ = [
    "JOB_FIELDS",
    "V1",
    "WORKLOAD_FIELDS",
    "Operations",
    "job_spec",
    "logs_stream_path",
    "push_model",
    "seg",
    "stream_call",
    "stripped_graph",
]


# Own models and streams: the parts of the clients that are not one `Call` -------------------------


def stripped_graph(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    """The file's name and its graph without weights, read with seeks past the weight data: a 1.3 GB
    export travels as a few hundred kilobytes. External weight files are never read."""
    from vipu.emulator.onnxgraph.strip import strip_file

    return Path(path).name, strip_file(Path(path)).data


def push_model(
    filename: str,
    graph: bytes,
    name: str | None,
    dims: Mapping[str, int] | None,
    elementwise: list[str] | None,
) -> Call[OnnxModel]:
    fields: dict[str, str] = {}
    if name:
        fields["name"] = name
    if dims:
        fields["dims"] = orjson.dumps(dict(dims)).decode()
    if elementwise:
        fields["elementwise"] = ",".join(elementwise)
    return Call(
        "POST", f"{V1}/models", model(OnnxModel), files={"file": (filename, graph)}, data=fields or None
    )


def logs_stream_path(job_id: str) -> str:
    return f"{V1}/jobs/{seg(job_id)}/logs"


def stream_call(job_id: str) -> Call[str]:
    """The log stream's request, for its headers: the clients send it with httpx's `stream`."""
    return Call("GET", logs_stream_path(job_id), text)


class Operations(
    CatalogueOps,
    ModelOps,
    SessionOps,
    EndpointOps,
    JobOps,
    AccountOps,
    TenancyOps,
    FleetOps,
    WebhookOperations,
):
    """The methods `Client` and `AsyncClient` share (see the module's docstring): one class per area,
    each in its own `_ops_<area>.py`."""
