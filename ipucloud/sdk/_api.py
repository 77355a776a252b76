"""Every API operation, written once: the one place that knows routes, bodies and response types.

Each method of `Operations` returns the `Call` to send; `@operation` makes it a method of `Client`
that returns the answer and of `AsyncClient` that awaits it (`@paginated` does the same for the
`iter_*` methods, over pages). Only what truly differs between the two (uploading a file, following a
stream, polling) is written in `client.py` and `aclient.py`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from ipucloud.sdk import inference
from ipucloud.sdk._core import Call, Pager, model, operation, paginated, text
from ipucloud.sdk._webhooks import WebhookOperations
from ipucloud.sdk.inference import Inference
from ipucloud.sdk.models import (
    AdminUsage,
    ApiKey,
    ApiKeyCreated,
    Array,
    ArrayAction,
    Catalogue,
    Endpoint,
    EndpointMetrics,
    Estimate,
    Fleet,
    Job,
    LogEntry,
    Logs,
    Machine,
    OnnxModel,
    Page,
    Partition,
    PartitionReset,
    Plan,
    Rack,
    RackHealth,
    Racks,
    Retired,
    ServersAdded,
    Session,
    Tenant,
    TenantCreated,
    TrialApplication,
    TrialDecision,
    Usage,
)

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


class Operations(WebhookOperations):
    """The methods `Client` and `AsyncClient` share (see the module's docstring)."""

    # Catalogue and estimates -------------------------------------------------------------------------

    @operation
    def workloads(self) -> Call[Catalogue]:
        """The workload catalogue and machine types."""
        return Call("GET", f"{V1}/workloads", model(Catalogue))

    @operation
    def estimate(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        model: str | None = None,
        task: str | None = None,
        batch_size: int | None = None,
        seq_len: int | None = None,
        precision: str | None = None,
        steps: int | None = None,
        samples: int | None = None,
        dims: Mapping[str, int] | None = None,
        optimizer: str | None = None,
        workload: Mapping[str, Any] | None = None,
        ipus: int | str | None = None,
        machine: str | None = None,
        prefer: str | None = None,
        partition: str | None = None,
        session: str | None = None,
        priority: int | None = None,
        max_runtime_s: int | None = None,
        preemptible: bool | None = None,
        checkpoint_every_s: int | None = None,
        notify: Mapping[str, Any] | None = None,
        depends_on: Mapping[str, Any] | None = None,
        on_unsatisfiable: str | None = None,
        singleton: bool | None = None,
        serve_batch_sizes: Sequence[int] | None = None,
        max_rows: int | None = None,
        **more: Any,
    ) -> Call[Estimate]:
        """Dry run of a job: whether it fits, its plan, time, what the grant would be charged (with
        the raw IPU-hours and the type's rate), what submitting it reserves, and the expected queue
        wait, for the machine type `prefer` would run it on (named in the answer). Takes what
        `submit_job` takes; with `serve_batch_sizes` (inference), also a serving replica's latency and
        throughput at each batch size.

        A job spec is `spec` (a mapping, e.g. a JSON or YAML file read), overridden by the keywords
        given; None means "not given". The workload: `model` (a catalogue workload or one of your
        uploaded models, by name or id), `task` (train or infer), `batch_size`, `seq_len`,
        `precision` (fp16 or fp32), `steps` or `samples`, `dims` (an uploaded model's dynamic
        dimensions), `optimizer`; or all of it as `workload`. The job: `name`, `ipus` (a power of two
        or "auto"), `machine` (a type, or "any"), `prefer` ("time" or "cost", with machine any),
        `partition` (a reserved one), `session` (an active session of yours), `priority` (-100..100),
        `max_runtime_s`, `preemptible` or `never_preempt`, `checkpoint_every_s`,
        `notify` (e.g. {"on": ["end"]}),
        `depends_on` ({"all": [{"job": ID, "type": "afterok"}]}), `on_unsatisfiable` ("cancel" or
        "hold"), `singleton`. `more`: any other field of the job spec (docs/cli.md). With `array` or
        `sweep` (what `submit_array` takes), a row per element (`elements`, at most `max_rows`) and the
        whole (`totals`), starts forecast within its `max_running`."""
        fields = _drop_none(
            name=name,
            model=model,
            task=task,
            batch_size=batch_size,
            seq_len=seq_len,
            precision=precision,
            steps=steps,
            samples=samples,
            dims=dims,
            optimizer=optimizer,
            workload=workload,
            ipus=ipus,
            machine=machine,
            prefer=prefer,
            partition=partition,
            session=session,
            priority=priority,
            max_runtime_s=max_runtime_s,
            preemptible=preemptible,
            checkpoint_every_s=checkpoint_every_s,
            notify=notify,
            depends_on=depends_on,
            on_unsatisfiable=on_unsatisfiable,
            singleton=singleton,
            **more,
        )
        full = job_spec(spec, **fields)
        body: dict[str, Any] = {"workload": full["workload"], "ipus": full.get("ipus", "auto")}
        if full.get("machine"):
            body["machine"] = full["machine"]
        # As the job would be submitted: the type it is answered for follows `prefer` (time or cost).
        for key in ("prefer", "max_runtime_s", "preemptible", "array", "sweep"):
            if full.get(key) is not None:
                body[key] = full[key]
        if max_rows is not None:
            body["max_rows"] = max_rows
        if serve_batch_sizes is not None:
            body["serve"] = {"batch_sizes": list(serve_batch_sizes)}
        return Call("POST", f"{V1}/estimates", _answer(Estimate), json=body)

    # Own models --------------------------------------------------------------------------------------

    @operation
    def list_models(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[OnnxModel]]:
        """One page of your tenant's uploaded models (`next_cursor` for the next)."""
        return Call("GET", f"{V1}/models", _page(OnnxModel), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_models(self, *, page_size: int = 100) -> Pager[OnnxModel]:
        """Every model your tenant uploaded, fetched page by page."""
        return lambda cursor: Operations.list_models.build(self, limit=page_size, cursor=cursor)

    @operation
    def get_model(self, ref: str) -> Call[OnnxModel]:
        """A model by id or name."""
        return Call("GET", f"{V1}/models/{seg(ref)}", model(OnnxModel))

    @operation
    def delete_model(self, ref: str) -> Call[OnnxModel]:
        """Remove a model (refused while queued or running jobs use it)."""
        return Call("DELETE", f"{V1}/models/{seg(ref)}", model(OnnxModel))

    # Sessions ----------------------------------------------------------------------------------------

    @operation
    def start_session(
        self,
        *,
        ipus: int,
        machine: str | None = None,
        max_duration_s: int | None = None,
        idle_timeout_s: int | None = None,
        gcds: int | None = None,
        name: str | None = None,
    ) -> Call[Session]:
        """Hold a partition: the session queues like a job, then its jobs (`submit_job(session=id)`)
        start at once. Durations in cluster seconds; the plan sets the defaults and the ceiling."""
        body = _drop_none(
            ipus=ipus,
            machine=machine,
            max_duration_s=max_duration_s,
            idle_timeout_s=idle_timeout_s,
            gcds=gcds,
            name=name,
        )
        return Call("POST", f"{V1}/sessions", model(Session), json=body)

    @operation
    def get_session(self, session_id: str) -> Call[Session]:
        """A session of yours by id: its state, partition, jobs and what it has cost."""
        return Call("GET", f"{V1}/sessions/{seg(session_id)}", model(Session))

    @operation
    def list_sessions(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Call[Page[Session]]:
        """One page of the caller's sessions, newest first."""
        params = {"state": state, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/sessions", _page(Session), params=params)

    @paginated
    def iter_sessions(self, *, state: str | None = None, page_size: int = 50) -> Pager[Session]:
        """Every session of your tenant, fetched page by page."""
        return lambda cursor: Operations.list_sessions.build(
            self, state=state, limit=page_size, cursor=cursor
        )

    @operation
    def change_session(
        self, session_id: str, *, max_duration_s: int | None = None, idle_timeout_s: int | None = None
    ) -> Call[Session]:
        """Give a session a longer maximum duration (a total from its start, reserved from the grant)
        or another idle timeout; repeating a change is harmless."""
        body = _drop_none(max_duration_s=max_duration_s, idle_timeout_s=idle_timeout_s)
        return Call("PATCH", f"{V1}/sessions/{seg(session_id)}", model(Session), json=body)

    @operation
    def end_session(self, session_id: str) -> Call[Session]:
        """End a session: its running jobs stop, its hold is billed up to now."""
        return Call("DELETE", f"{V1}/sessions/{seg(session_id)}", model(Session))

    # Inference endpoints -------------------------------------------------------------------------------

    @operation
    def create_endpoint(
        self,
        *,
        name: str,
        model: str,
        seq_len: int | None = None,
        dims: Mapping[str, int] | None = None,
        precision: str | None = None,
        machine: str | None = None,
        ipus_per_replica: int | str | None = None,
        replicas: Mapping[str, int] | None = None,
        autoscaling: Mapping[str, Any] | None = None,
        batching: Mapping[str, Any] | None = None,
        max_queue: int | None = None,
        cold_start_timeout_s: float | None = None,
        preemptible: bool | None = None,
    ) -> Call[Endpoint]:
        """Serve a model behind a URL: `replicas={"min": 0, "max": 4}`, `batching={"max_batch_size": 8,
        "max_wait_ms": 5}`, `autoscaling={"target_queue_delay_ms": 50, ...}` (docs/endpoints.md). The
        answer's `url` is the base of its KServe v2 routes."""
        body = _drop_none(
            name=name,
            model=model,
            seq_len=seq_len,
            dims=dict(dims) if dims is not None else None,
            precision=precision,
            machine=machine,
            ipus_per_replica=ipus_per_replica,
            replicas=dict(replicas) if replicas is not None else None,
            autoscaling=dict(autoscaling) if autoscaling is not None else None,
            batching=dict(batching) if batching is not None else None,
            max_queue=max_queue,
            cold_start_timeout_s=cold_start_timeout_s,
            preemptible=preemptible,
        )
        return Call("POST", f"{V1}/endpoints", _answer(Endpoint), json=body)

    @operation
    def get_endpoint(self, endpoint_id: str) -> Call[Endpoint]:
        """An inference endpoint of yours by id: state, replicas, model and limits."""
        return Call("GET", f"{V1}/endpoints/{seg(endpoint_id)}", model(Endpoint))

    @operation
    def list_endpoints(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Call[Page[Endpoint]]:
        """One page of the caller's endpoints, newest first."""
        params = {"state": state, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/endpoints", _page(Endpoint), params=params)

    @paginated
    def iter_endpoints(self, *, state: str | None = None, page_size: int = 50) -> Pager[Endpoint]:
        """Every inference endpoint of your tenant, fetched page by page."""
        return lambda cursor: Operations.list_endpoints.build(
            self, state=state, limit=page_size, cursor=cursor
        )

    @operation
    def change_endpoint(
        self,
        endpoint_id: str,
        *,
        replicas: Mapping[str, int] | None = None,
        autoscaling: Mapping[str, Any] | None = None,
        batching: Mapping[str, Any] | None = None,
        max_queue: int | None = None,
        cold_start_timeout_s: float | None = None,
    ) -> Call[Endpoint]:
        """Change replicas, autoscaling, batching or the queue while the endpoint serves."""
        body = _drop_none(
            replicas=dict(replicas) if replicas is not None else None,
            autoscaling=dict(autoscaling) if autoscaling is not None else None,
            batching=dict(batching) if batching is not None else None,
            max_queue=max_queue,
            cold_start_timeout_s=cold_start_timeout_s,
        )
        return Call("PATCH", f"{V1}/endpoints/{seg(endpoint_id)}", model(Endpoint), json=body)

    @operation
    def delete_endpoint(self, endpoint_id: str) -> Call[Endpoint]:
        """Stop an endpoint: its replicas are drained and billed up to now."""
        return Call("DELETE", f"{V1}/endpoints/{seg(endpoint_id)}", model(Endpoint))

    @operation
    def endpoint_metrics(self, endpoint_id: str, *, minutes: int = 60) -> Call[EndpointMetrics]:
        """The endpoint's last minute (requests/s, p50/p90/p99, batch, queue delay) and its history."""
        return Call(
            "GET",
            f"{V1}/endpoints/{seg(endpoint_id)}/metrics",
            model(EndpointMetrics),
            params={"minutes": minutes},
        )

    @operation
    def infer(
        self,
        endpoint_id: str,
        model_name: str,
        inputs: Mapping[str, Any],
        *,
        datatypes: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> Call[Inference]:
        """One inference request (Open Inference Protocol): `inputs` maps each input's name to an array
        whose batch axis holds the request's rows, in the model's datatype (`Endpoint.signature`, or
        name it in `datatypes`). Needs a key with the `invoke` scope. Not retried: a request that may
        have reached a replica is the caller's to send again."""
        body, headers = inference.request(inputs, datatypes=datatypes, request_id=request_id)
        return Call(
            "POST",
            f"{V1}/endpoints/{seg(endpoint_id)}/v2/models/{seg(model_name)}/infer",
            lambda r: inference.parse(r.content, r.headers),
            content=body,
            headers=headers,
        )

    # Jobs --------------------------------------------------------------------------------------------

    @operation
    def submit_job(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        model: str | None = None,
        task: str | None = None,
        batch_size: int | None = None,
        seq_len: int | None = None,
        precision: str | None = None,
        steps: int | None = None,
        samples: int | None = None,
        dims: Mapping[str, int] | None = None,
        optimizer: str | None = None,
        workload: Mapping[str, Any] | None = None,
        ipus: int | str | None = None,
        machine: str | None = None,
        prefer: str | None = None,
        partition: str | None = None,
        session: str | None = None,
        priority: int | None = None,
        max_runtime_s: int | None = None,
        preemptible: bool | None = None,
        never_preempt: bool | None = None,
        checkpoint_every_s: int | None = None,
        notify: Mapping[str, Any] | None = None,
        depends_on: Mapping[str, Any] | None = None,
        on_unsatisfiable: str | None = None,
        singleton: bool | None = None,
        idempotency_key: str | None = None,
        **more: Any,
    ) -> Call[Job]:
        """Submit a job; returns it queued (`wait_job` or `stream_logs` follow it).

        `idempotency_key`: submitting again with the same key returns the same job (one is made up
        when none is given, so the client's own retries never submit twice).

        A job spec is `spec` (a mapping, e.g. a JSON or YAML file read), overridden by the keywords
        given; None means "not given". The workload: `model` (a catalogue workload or one of your
        uploaded models, by name or id), `task` (train or infer), `batch_size`, `seq_len`,
        `precision` (fp16 or fp32), `steps` or `samples`, `dims` (an uploaded model's dynamic
        dimensions), `optimizer`; or all of it as `workload`. The job: `name`, `ipus` (a power of two
        or "auto"), `machine` (a type, or "any"), `prefer` ("time" or "cost", with machine any),
        `partition` (a reserved one), `session` (an active session of yours), `priority` (-100..100),
        `max_runtime_s`, `preemptible` or `never_preempt`, `checkpoint_every_s`,
        `notify` (e.g. {"on": ["end"]}),
        `depends_on` ({"all": [{"job": ID, "type": "afterok"}]}), `on_unsatisfiable` ("cancel" or
        "hold"), `singleton`. `more`: any other field of the job spec (docs/cli.md)."""
        fields = _drop_none(
            name=name,
            model=model,
            task=task,
            batch_size=batch_size,
            seq_len=seq_len,
            precision=precision,
            steps=steps,
            samples=samples,
            dims=dims,
            optimizer=optimizer,
            workload=workload,
            ipus=ipus,
            machine=machine,
            prefer=prefer,
            partition=partition,
            session=session,
            priority=priority,
            max_runtime_s=max_runtime_s,
            preemptible=preemptible,
            never_preempt=never_preempt,
            checkpoint_every_s=checkpoint_every_s,
            notify=notify,
            depends_on=depends_on,
            on_unsatisfiable=on_unsatisfiable,
            singleton=singleton,
            **more,
        )
        # A generated key makes the client's own retries safe: a replay returns the first job.
        key = idempotency_key or f"sdk-{uuid.uuid4()}"
        body = job_spec(spec, **fields)
        return Call("POST", f"{V1}/jobs", _answer(Job), json=body, headers={"Idempotency-Key": key})

    @operation
    def submit_array(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        array: Mapping[str, Any] | None = None,
        sweep: Mapping[str, Any] | None = None,
        name: str | None = None,
        model: str | None = None,
        task: str | None = None,
        batch_size: int | None = None,
        seq_len: int | None = None,
        precision: str | None = None,
        steps: int | None = None,
        samples: int | None = None,
        dims: Mapping[str, int] | None = None,
        optimizer: str | None = None,
        workload: Mapping[str, Any] | None = None,
        ipus: int | str | None = None,
        machine: str | None = None,
        prefer: str | None = None,
        partition: str | None = None,
        session: str | None = None,
        priority: int | None = None,
        max_runtime_s: int | None = None,
        preemptible: bool | None = None,
        never_preempt: bool | None = None,
        checkpoint_every_s: int | None = None,
        notify: Mapping[str, Any] | None = None,
        depends_on: Mapping[str, Any] | None = None,
        on_unsatisfiable: str | None = None,
        singleton: bool | None = None,
        idempotency_key: str | None = None,
        **more: Any,
    ) -> Call[Array]:
        """Submit a job array (`array={"indices": "0-99", "max_running": 10}`) or a parameter sweep
        (`sweep={"method": "grid", "parameters": {...}}`): one handle for its elements, each an
        ordinary job of the spec the other arguments give.

        A job spec is `spec` (a mapping, e.g. a JSON or YAML file read), overridden by the keywords
        given; None means "not given". The workload: `model` (a catalogue workload or one of your
        uploaded models, by name or id), `task` (train or infer), `batch_size`, `seq_len`,
        `precision` (fp16 or fp32), `steps` or `samples`, `dims` (an uploaded model's dynamic
        dimensions), `optimizer`; or all of it as `workload`. The job: `name`, `ipus` (a power of two
        or "auto"), `machine` (a type, or "any"), `prefer` ("time" or "cost", with machine any),
        `partition` (a reserved one), `session` (an active session of yours), `priority` (-100..100),
        `max_runtime_s`, `preemptible` or `never_preempt`, `checkpoint_every_s`,
        `notify` (e.g. {"on": ["end"]}),
        `depends_on` ({"all": [{"job": ID, "type": "afterok"}]}), `on_unsatisfiable` ("cancel" or
        "hold"), `singleton`. `more`: any other field of the job spec (docs/cli.md)."""
        fields = _drop_none(
            name=name,
            model=model,
            task=task,
            batch_size=batch_size,
            seq_len=seq_len,
            precision=precision,
            steps=steps,
            samples=samples,
            dims=dims,
            optimizer=optimizer,
            workload=workload,
            ipus=ipus,
            machine=machine,
            prefer=prefer,
            partition=partition,
            session=session,
            priority=priority,
            max_runtime_s=max_runtime_s,
            preemptible=preemptible,
            never_preempt=never_preempt,
            checkpoint_every_s=checkpoint_every_s,
            notify=notify,
            depends_on=depends_on,
            on_unsatisfiable=on_unsatisfiable,
            singleton=singleton,
            array=array,
            sweep=sweep,
            **more,
        )
        key = idempotency_key or f"sdk-{uuid.uuid4()}"
        body = job_spec(spec, **fields)
        if "array" not in body and "sweep" not in body:
            raise ValueError("give `array` or `sweep`")
        return Call("POST", f"{V1}/jobs", _answer(Array), json=body, headers={"Idempotency-Key": key})

    @operation
    def get_array(self, array_id: str) -> Call[Array]:
        """A job array or sweep of yours by id: its elements by state."""
        return Call("GET", f"{V1}/arrays/{seg(array_id)}", model(Array))

    @operation
    def list_arrays(self, *, limit: int = 50, cursor: str | None = None) -> Call[Page[Array]]:
        """One page of the caller's arrays and sweeps, newest first."""
        return Call("GET", f"{V1}/arrays", _page(Array), params={"limit": limit, "cursor": cursor})

    @operation
    def array_jobs(
        self, array_id: str, *, state: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Call[Page[Job]]:
        """One page of an array's elements, by index."""
        params = {"state": state, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/arrays/{seg(array_id)}/jobs", _page(Job), params=params)

    @paginated
    def iter_array_jobs(self, array_id: str, *, state: str | None = None, page_size: int = 500) -> Pager[Job]:
        """Every element of an array, by index, page by page."""
        return lambda cursor: Operations.array_jobs.build(
            self, array_id, state=state, limit=page_size, cursor=cursor
        )

    @operation
    def cancel_array(self, array_id: str, indices: str | None = None) -> Call[ArrayAction]:
        """Cancel an array's queued and running elements: all of them, or those of `indices` (`1,5-9`)."""
        return Call(
            "POST",
            f"{V1}/arrays/{seg(array_id)}/cancel",
            model(ArrayAction),
            json=_drop_none(indices=indices),
        )

    @operation
    def retry_array(self, array_id: str, indices: str = "failed") -> Call[ArrayAction]:
        """Queue an array's failed or cancelled elements again (`failed`: all of them)."""
        return Call(
            "POST", f"{V1}/arrays/{seg(array_id)}/retry", model(ArrayAction), json={"indices": indices}
        )

    @operation
    def update_array(self, array_id: str, *, max_running: int | None) -> Call[Array]:
        """Change how many of its elements run at once (None lifts the limit)."""
        return Call("PATCH", f"{V1}/arrays/{seg(array_id)}", model(Array), json={"max_running": max_running})

    @operation
    def get_job(self, job_id: str) -> Call[Job]:
        """A job of yours by id: state, progress, wait reason, prediction and usage."""
        return Call("GET", f"{V1}/jobs/{seg(job_id)}", model(Job))

    @operation
    def list_jobs(
        self, *, state: str | None = None, limit: int = 50, cursor: str | None = None, expand: bool = False
    ) -> Call[Page[Job]]:
        """One page of the caller's jobs, newest first; an array's queued elements are one row
        (`folded`) unless `expand`."""
        params = {"state": state, "limit": limit, "cursor": cursor, "expand": expand or None}
        return Call("GET", f"{V1}/jobs", _page(Job), params=params)

    @paginated
    def iter_jobs(self, *, state: str | None = None, page_size: int = 100) -> Pager[Job]:
        """Every job of the caller's tenant, newest first, fetched page by page."""
        return lambda cursor: Operations.list_jobs.build(self, state=state, limit=page_size, cursor=cursor)

    @operation
    def cancel_job(self, job_id: str) -> Call[Job]:
        """Cancel a job of yours: a queued one ends at once, a running one is stopped and billed up to now."""
        return Call("POST", f"{V1}/jobs/{seg(job_id)}/cancel", model(Job))

    @operation
    def resume_job(self, job_id: str) -> Call[Job]:
        """Queue a job its time limit stopped again, from its last checkpoint (within the retention)."""
        return Call("POST", f"{V1}/jobs/{seg(job_id)}/resume", model(Job))

    @operation
    def job_logs(self, job_id: str, *, cursor: str | None = None, limit: int = 500) -> Call[Logs]:
        """One page of a job's log (state changes and the run's lines), oldest first."""
        params = {"cursor": cursor, "limit": limit}
        return Call("GET", f"{V1}/jobs/{seg(job_id)}/logs", model(Logs), params=params)

    @paginated
    def iter_logs(self, job_id: str, *, page_size: int = 500) -> Pager[LogEntry]:
        """Every event and log line written so far, oldest first."""
        return lambda cursor: Operations.job_logs.build(self, job_id, cursor=cursor, limit=page_size)

    # Usage, trials, keys -----------------------------------------------------------------------------

    @operation
    def usage(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[Usage]:
        """The tenant's metered IPU-hours, remaining grant and breakdowns."""
        params = {"since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/usage", model(Usage), params=params)

    @operation
    def usage_csv(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[str]:
        """Your usage as CSV text, one row per job: machine type, rate, raw and charged IPU-hours."""
        params = {"format": "csv", "since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/usage", text, params=params)

    @operation
    def apply_for_trial(
        self, *, name: str, email: str, organisation: str, category: str, intended_use: str
    ) -> Call[TrialApplication]:
        """Apply for a free trial (no key needed); an admin approves it."""
        body = {
            "name": name,
            "email": email,
            "organisation": organisation,
            "category": category,
            "intended_use": intended_use,
        }
        return Call("POST", f"{V1}/trials", model(TrialApplication), json=body, authenticated=False)

    @operation
    def list_keys(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[ApiKey]]:
        """The keys this key may see: an owner's tenant's, a member's own, or the admin keys."""
        return Call("GET", f"{V1}/keys", _page(ApiKey), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_keys(self, *, page_size: int = 100) -> Pager[ApiKey]:
        """Every API key of your tenant (never their secrets), fetched page by page."""
        return lambda cursor: Operations.list_keys.build(self, limit=page_size, cursor=cursor)

    @operation
    def create_key(
        self, *, name: str, scopes: list[str] | None = None, expires_at: datetime | None = None
    ) -> Call[ApiKeyCreated]:
        """A new key for the caller's tenant; `api_key` is the key, shown only now."""
        body: dict[str, Any] = {"name": name}
        if scopes:
            body["scopes"] = scopes
        if expires_at:
            body["expires_at"] = expires_at.isoformat()
        return Call("POST", f"{V1}/keys", model(ApiKeyCreated), json=body)

    @operation
    def revoke_key(self, key_id: str) -> Call[ApiKey]:
        """Revoke one of your tenant's API keys: it is refused from now on."""
        return Call("DELETE", f"{V1}/keys/{seg(key_id)}", model(ApiKey))

    # Admin: tenants, plans, trials -------------------------------------------------------------------

    @operation
    def create_tenant(
        self,
        *,
        name: str,
        plan: str = "trial",
        quota_ipu_hours: float | None = None,
        expires_at: datetime | None = None,
        fairshare_weight: float | None = None,
        owner_email: str | None = None,
    ) -> Call[TenantCreated]:
        """Create a tenant; the result's `api_key` is its first key, shown only now."""
        body = _drop_none(
            name=name,
            plan=plan,
            quota_ipu_hours=quota_ipu_hours,
            expires_at=expires_at.isoformat() if expires_at else None,
            fairshare_weight=fairshare_weight,
            owner_email=owner_email,
        )
        return Call("POST", f"{V1}/admin/tenants", model(TenantCreated), json=body)

    @operation
    def list_tenants(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[Tenant]]:
        """Admin: one page of tenants with their plans, grants and usage."""
        params = {"limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/admin/tenants", _page(Tenant), params=params)

    @paginated
    def iter_tenants(self, *, page_size: int = 100) -> Pager[Tenant]:
        """Admin: every tenant, fetched page by page."""
        return lambda cursor: Operations.list_tenants.build(self, limit=page_size, cursor=cursor)

    @operation
    def get_tenant(self, tenant_id: str) -> Call[Tenant]:
        """Admin: a tenant by id."""
        return Call("GET", f"{V1}/admin/tenants/{seg(tenant_id)}", model(Tenant))

    @operation
    def update_tenant(self, tenant_id: str, **changes: Any) -> Call[Tenant]:
        """Change `plan`, `quota_ipu_hours`, `expires_at`, `fairshare_weight` or `status`."""
        path = f"{V1}/admin/tenants/{seg(tenant_id)}"
        return Call("PATCH", path, model(Tenant), json=_jsonable(changes))

    @operation
    def list_plans(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[Plan]]:
        """Admin: one page of plans."""
        return Call("GET", f"{V1}/admin/plans", _page(Plan), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_plans(self, *, page_size: int = 100) -> Pager[Plan]:
        """Admin: every plan, fetched page by page."""
        return lambda cursor: Operations.list_plans.build(self, limit=page_size, cursor=cursor)

    @operation
    def get_plan(self, name: str) -> Call[Plan]:
        """Admin: a plan by name: its limits, rates and machine types."""
        return Call("GET", f"{V1}/admin/plans/{seg(name)}", model(Plan))

    @operation
    def update_plan(self, name: str, **changes: Any) -> Call[Plan]:
        """Admin: change a plan's fields (`changes`, as the plan's JSON); returns the plan as it now is."""
        return Call("PATCH", f"{V1}/admin/plans/{seg(name)}", model(Plan), json=_jsonable(changes))

    @operation
    def list_tenant_keys(
        self, tenant_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> Call[Page[ApiKey]]:
        """Admin: one page of a tenant's API keys."""
        path = f"{V1}/admin/tenants/{seg(tenant_id)}/keys"
        return Call("GET", path, _page(ApiKey), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_tenant_keys(self, tenant_id: str, *, page_size: int = 100) -> Pager[ApiKey]:
        """Admin: every API key of a tenant, fetched page by page."""
        return lambda cursor: Operations.list_tenant_keys.build(
            self, tenant_id, limit=page_size, cursor=cursor
        )

    @operation
    def create_tenant_key(
        self,
        tenant_id: str,
        *,
        name: str,
        scopes: list[str] | None = None,
        expires_at: datetime | None = None,
        member_id: str | None = None,
    ) -> Call[ApiKeyCreated]:
        """Admin: make an API key for a tenant; the answer holds its secret, shown this once."""
        body = _drop_none(
            name=name,
            scopes=scopes or None,
            expires_at=expires_at.isoformat() if expires_at else None,
            member_id=member_id,
        )
        path = f"{V1}/admin/tenants/{seg(tenant_id)}/keys"
        return Call("POST", path, model(ApiKeyCreated), json=body)

    @operation
    def revoke_tenant_key(self, tenant_id: str, key_id: str) -> Call[ApiKey]:
        """Admin: revoke one of a tenant's API keys."""
        path = f"{V1}/admin/tenants/{seg(tenant_id)}/keys/{seg(key_id)}"
        return Call("DELETE", path, model(ApiKey))

    @operation
    def list_trials(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Call[Page[TrialApplication]]:
        """Admin: one page of trial applications (optionally of one `status`)."""
        params = {"status": status, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/admin/trials", _page(TrialApplication), params=params)

    @paginated
    def iter_trials(self, *, status: str | None = None, page_size: int = 100) -> Pager[TrialApplication]:
        """Admin: every trial application, fetched page by page."""
        return lambda cursor: Operations.list_trials.build(
            self, status=status, limit=page_size, cursor=cursor
        )

    @operation
    def get_trial(self, application_id: str) -> Call[TrialApplication]:
        """Admin: a trial application by id."""
        return Call("GET", f"{V1}/admin/trials/{seg(application_id)}", model(TrialApplication))

    @operation
    def approve_trial(
        self, application_id: str, *, plan: str | None = None, hand_over_key: bool = False
    ) -> Call[TrialDecision]:
        """Approve: creates the tenant. The applicant's mailed claim link mints its first key and the
        result's `api_key` is None; with `hand_over_key` it is the first key, shown only now, and no
        claim link is mailed."""
        body: dict[str, object] = {"plan": plan} if plan else {}
        if hand_over_key:
            body["hand_over_key"] = True
        path = f"{V1}/admin/trials/{seg(application_id)}/approve"
        return Call("POST", path, model(TrialDecision), json=body)

    @operation
    def reject_trial(self, application_id: str, *, reason: str) -> Call[TrialApplication]:
        """Admin: reject a trial application, with the `reason` its applicant is told."""
        path = f"{V1}/admin/trials/{seg(application_id)}/reject"
        return Call("POST", path, model(TrialApplication), json={"reason": reason})

    # Admin: fleet, machines, partitions, usage -------------------------------------------------------

    @operation
    def fleet(self, *, pod_from: int = 0, pods: int = 64) -> Call[Fleet]:
        """Pods, machines and IPUs with the partition and tenant holding each, and a summary."""
        params = {"pod_from": pod_from, "pods": pods}
        return Call("GET", f"{V1}/admin/fleet", model(Fleet), params=params)

    @operation
    def racks(self) -> Call[Racks]:
        """The racks, their PODs and IPU servers, and their machines' health."""
        return Call("GET", f"{V1}/admin/fleet/racks", model(Racks))

    @operation
    def add_rack(self, machine_type: str, *, layout: str = "pod64", pods: int = 1) -> Call[Rack]:
        """Add a rack of `pods` PODs (two POD64s at most, or one POD16) to the running fleet."""
        body = {"machine_type": machine_type, "layout": layout, "pods": pods}
        return Call("POST", f"{V1}/admin/fleet/racks", model(Rack), json=body)

    @operation
    def add_servers(self, model: str, *, count: int = 1) -> Call[ServersAdded]:
        """Add IPU servers (`dss8440`, `nf5568m5`) to the running fleet."""
        body = {"model": model, "count": count}
        return Call("POST", f"{V1}/admin/fleet/servers", _model(ServersAdded), json=body)

    @operation
    def drain_rack(self, rack_id: str, *, reason: str | None = None) -> Call[RackHealth]:
        """Admin: drain a rack: nothing new is placed there; what runs there finishes."""
        return _rack_health(rack_id, "drain", reason)

    @operation
    def restore_rack(self, rack_id: str, *, reason: str | None = None) -> Call[RackHealth]:
        """Admin: put a drained or failed rack back in service."""
        return _rack_health(rack_id, "restore", reason)

    @operation
    def retire_rack(self, rack_id: str) -> Call[Retired]:
        """Retire a drained rack; refused (409) while it is not drained or holds live partitions."""
        return Call("DELETE", f"{V1}/admin/fleet/racks/{seg(rack_id)}", model(Retired))

    @operation
    def retire_unit(self, unit_id: str) -> Call[Retired]:
        """Retire a drained POD (`pod0003`) or server (`srv0004`); refused (409) as `retire_rack`."""
        return Call("DELETE", f"{V1}/admin/fleet/units/{seg(unit_id)}", model(Retired))

    @operation
    def drain_machine(self, machine_id: str, *, reason: str | None = None) -> Call[Machine]:
        """Admin: drain a machine: nothing new is placed there; what runs there finishes."""
        return _machine_health(machine_id, "drain", reason)

    @operation
    def fail_machine(self, machine_id: str, *, reason: str | None = None) -> Call[Machine]:
        """Admin: mark a machine failed: its attempts end (billed up to their checkpoints) and queue again."""
        return _machine_health(machine_id, "fail", reason)

    @operation
    def restore_machine(self, machine_id: str, *, reason: str | None = None) -> Call[Machine]:
        """Admin: put a drained or failed machine back in service."""
        return _machine_health(machine_id, "restore", reason)

    @operation
    def create_partition(
        self,
        name: str,
        *,
        size: int,
        machine_type: str | None = None,
        tenant: str | None = None,
        gcds: int = 1,
        reconfigurable: bool = False,
    ) -> Call[Partition]:
        """Admin: reserve a partition of `size` IPUs for a tenant (its jobs then run in it by name)."""
        body = _drop_none(
            id=name,
            size=size,
            machine_type=machine_type,
            tenant=tenant,
            gcds=gcds,
            reconfigurable=reconfigurable,
        )
        return Call("POST", f"{V1}/admin/partitions", model(Partition), json=body)

    @operation
    def list_partitions(
        self, *, tenant: str | None = None, limit: int = 200, cursor: str | None = None
    ) -> Call[Page[Partition]]:
        """Admin: one page of live partitions (optionally of one tenant)."""
        params = {"tenant": tenant, "limit": limit, "cursor": cursor}
        return Call("GET", f"{V1}/admin/partitions", _page(Partition), params=params)

    @paginated
    def iter_partitions(self, *, tenant: str | None = None, page_size: int = 200) -> Pager[Partition]:
        """Admin: every live partition, fetched page by page."""
        return lambda cursor: Operations.list_partitions.build(
            self, tenant=tenant, limit=page_size, cursor=cursor
        )

    @operation
    def get_partition(self, name: str) -> Call[Partition]:
        """Admin: a partition by name: its IPUs, tenant and what runs in it."""
        return Call("GET", f"{V1}/admin/partitions/{seg(name)}", model(Partition))

    @operation
    def remove_partition(self, name: str) -> Call[Partition]:
        """Admin: release a reserved partition."""
        return Call("DELETE", f"{V1}/admin/partitions/{seg(name)}", model(Partition))

    @operation
    def reset_partition(self, name: str, gcds: int | None = None) -> Call[PartitionReset]:
        """Reset a partition's IPUs; with `gcds`, split a reconfigurable one anew into that many graph
        compile domains."""
        body = {"gcds": gcds} if gcds is not None else None
        path = f"{V1}/admin/partitions/{seg(name)}/reset"
        return Call("POST", path, model(PartitionReset), json=body)

    @operation
    def admin_usage(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[AdminUsage]:
        """Admin: usage across every tenant (JSON), between `since` and `until`."""
        params = {"since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/admin/usage", model(AdminUsage), params=params)

    @operation
    def admin_usage_csv(
        self, *, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> Call[str]:
        """Admin: usage across every tenant as CSV text, one row per job."""
        params = {"format": "csv", "since": _iso(since), "until": _iso(until)}
        return Call("GET", f"{V1}/admin/usage", text, params=params)


# `add_servers` has a parameter named `model`, which hides the parser of that name in its body.
_model = model


def _rack_health(rack_id: str, action: str, reason: str | None) -> Call[RackHealth]:
    body = {"reason": reason} if reason else None
    return Call("POST", f"{V1}/admin/fleet/racks/{seg(rack_id)}/{action}", model(RackHealth), json=body)


def _machine_health(machine_id: str, action: str, reason: str | None) -> Call[Machine]:
    body = {"reason": reason} if reason else None
    return Call("POST", f"{V1}/admin/machines/{seg(machine_id)}/{action}", model(Machine), json=body)
