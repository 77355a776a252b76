"""Every API operation as a `Call`: the one place that knows routes, bodies and response types."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from ipucloud.sdk._core import Call, model, text
from ipucloud.sdk.models import (
    AdminUsage,
    ApiKey,
    ApiKeyCreated,
    Catalogue,
    Estimate,
    Fleet,
    Job,
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
    "checkpoint_every_s",
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


# Catalogue and estimates -------------------------------------------------------------------------------


def workloads() -> Call[Catalogue]:
    return Call("GET", f"{V1}/workloads", model(Catalogue))


def estimate(spec: dict[str, Any]) -> Call[Estimate]:
    body = {"workload": spec["workload"], "ipus": spec.get("ipus", "auto")}
    if spec.get("machine"):
        body["machine"] = spec["machine"]
    return Call("POST", f"{V1}/estimates", model(Estimate), json=body)


# Own models --------------------------------------------------------------------------------------------


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


def list_models(limit: int, cursor: str | None) -> Call[Page[OnnxModel]]:
    return Call("GET", f"{V1}/models", _page(OnnxModel), params={"limit": limit, "cursor": cursor})


def get_model(ref: str) -> Call[OnnxModel]:
    return Call("GET", f"{V1}/models/{seg(ref)}", model(OnnxModel))


def delete_model(ref: str) -> Call[OnnxModel]:
    return Call("DELETE", f"{V1}/models/{seg(ref)}", model(OnnxModel))


# Sessions ----------------------------------------------------------------------------------------------


def start_session(body: dict[str, Any]) -> Call[Session]:
    return Call(
        "POST", f"{V1}/sessions", model(Session), json={k: v for k, v in body.items() if v is not None}
    )


def list_sessions(state: str | None, limit: int, cursor: str | None) -> Call[Page[Session]]:
    return Call(
        "GET", f"{V1}/sessions", _page(Session), params={"state": state, "limit": limit, "cursor": cursor}
    )


def get_session(session_id: str) -> Call[Session]:
    return Call("GET", f"{V1}/sessions/{seg(session_id)}", model(Session))


def end_session(session_id: str) -> Call[Session]:
    return Call("DELETE", f"{V1}/sessions/{seg(session_id)}", model(Session))


# Jobs --------------------------------------------------------------------------------------------------


def submit_job(spec: dict[str, Any], idempotency_key: str | None) -> Call[Job]:
    # A generated key makes the client's own retries safe: a replay returns the first job.
    key = idempotency_key or f"sdk-{uuid.uuid4()}"
    return Call("POST", f"{V1}/jobs", model(Job), json=spec, headers={"Idempotency-Key": key})


def get_job(job_id: str) -> Call[Job]:
    return Call("GET", f"{V1}/jobs/{seg(job_id)}", model(Job))


def list_jobs(state: str | None, limit: int, cursor: str | None) -> Call[Page[Job]]:
    return Call("GET", f"{V1}/jobs", _page(Job), params={"state": state, "limit": limit, "cursor": cursor})


def cancel_job(job_id: str) -> Call[Job]:
    return Call("POST", f"{V1}/jobs/{seg(job_id)}/cancel", model(Job))


def resume_job(job_id: str) -> Call[Job]:
    return Call("POST", f"{V1}/jobs/{seg(job_id)}/resume", model(Job))


def job_logs(job_id: str, cursor: str | None, limit: int) -> Call[Logs]:
    return Call(
        "GET", f"{V1}/jobs/{seg(job_id)}/logs", model(Logs), params={"cursor": cursor, "limit": limit}
    )


def logs_stream_path(job_id: str) -> str:
    return f"{V1}/jobs/{seg(job_id)}/logs"


# Usage -------------------------------------------------------------------------------------------------


def usage(since: datetime | str | None, until: datetime | str | None) -> Call[Usage]:
    return Call("GET", f"{V1}/usage", model(Usage), params={"since": _iso(since), "until": _iso(until)})


def usage_csv(since: datetime | str | None, until: datetime | str | None) -> Call[str]:
    return Call(
        "GET", f"{V1}/usage", text, params={"format": "csv", "since": _iso(since), "until": _iso(until)}
    )


# Trials and keys ---------------------------------------------------------------------------------------


def apply_for_trial(body: dict[str, Any]) -> Call[TrialApplication]:
    return Call("POST", f"{V1}/trials", model(TrialApplication), json=body, authenticated=False)


def list_keys(limit: int, cursor: str | None) -> Call[Page[ApiKey]]:
    return Call("GET", f"{V1}/keys", _page(ApiKey), params={"limit": limit, "cursor": cursor})


def create_key(body: dict[str, Any]) -> Call[ApiKeyCreated]:
    return Call("POST", f"{V1}/keys", model(ApiKeyCreated), json=body)


def revoke_key(key_id: str) -> Call[ApiKey]:
    return Call("DELETE", f"{V1}/keys/{seg(key_id)}", model(ApiKey))


def list_tenant_keys(tenant_id: str, limit: int, cursor: str | None) -> Call[Page[ApiKey]]:
    return Call(
        "GET",
        f"{V1}/admin/tenants/{seg(tenant_id)}/keys",
        _page(ApiKey),
        params={"limit": limit, "cursor": cursor},
    )


def create_tenant_key(tenant_id: str, body: dict[str, Any]) -> Call[ApiKeyCreated]:
    return Call("POST", f"{V1}/admin/tenants/{seg(tenant_id)}/keys", model(ApiKeyCreated), json=body)


def revoke_tenant_key(tenant_id: str, key_id: str) -> Call[ApiKey]:
    return Call("DELETE", f"{V1}/admin/tenants/{seg(tenant_id)}/keys/{seg(key_id)}", model(ApiKey))


# Admin: tenants, plans, trials -------------------------------------------------------------------------


def create_tenant(body: dict[str, Any]) -> Call[TenantCreated]:
    return Call("POST", f"{V1}/admin/tenants", model(TenantCreated), json=body)


def list_tenants(limit: int, cursor: str | None) -> Call[Page[Tenant]]:
    return Call("GET", f"{V1}/admin/tenants", _page(Tenant), params={"limit": limit, "cursor": cursor})


def get_tenant(tenant_id: str) -> Call[Tenant]:
    return Call("GET", f"{V1}/admin/tenants/{seg(tenant_id)}", model(Tenant))


def update_tenant(tenant_id: str, changes: dict[str, Any]) -> Call[Tenant]:
    return Call("PATCH", f"{V1}/admin/tenants/{seg(tenant_id)}", model(Tenant), json=changes)


def list_plans(limit: int, cursor: str | None) -> Call[Page[Plan]]:
    return Call("GET", f"{V1}/admin/plans", _page(Plan), params={"limit": limit, "cursor": cursor})


def update_plan(name: str, changes: dict[str, Any]) -> Call[Plan]:
    return Call("PATCH", f"{V1}/admin/plans/{seg(name)}", model(Plan), json=changes)


def list_trials(status: str | None, limit: int, cursor: str | None) -> Call[Page[TrialApplication]]:
    return Call(
        "GET",
        f"{V1}/admin/trials",
        _page(TrialApplication),
        params={"status": status, "limit": limit, "cursor": cursor},
    )


def get_trial(application_id: str) -> Call[TrialApplication]:
    return Call("GET", f"{V1}/admin/trials/{seg(application_id)}", model(TrialApplication))


def approve_trial(application_id: str, plan: str | None) -> Call[TrialDecision]:
    body = {"plan": plan} if plan else {}
    return Call("POST", f"{V1}/admin/trials/{seg(application_id)}/approve", model(TrialDecision), json=body)


def reject_trial(application_id: str, reason: str) -> Call[TrialApplication]:
    return Call(
        "POST",
        f"{V1}/admin/trials/{seg(application_id)}/reject",
        model(TrialApplication),
        json={"reason": reason},
    )


# Admin: fleet, machines, partitions, usage -------------------------------------------------------------


def fleet(pod_from: int, pods: int) -> Call[Fleet]:
    return Call("GET", f"{V1}/admin/fleet", model(Fleet), params={"pod_from": pod_from, "pods": pods})


def racks() -> Call[Racks]:
    return Call("GET", f"{V1}/admin/fleet/racks", model(Racks))


def add_rack(machine_type: str, layout: str, pods: int) -> Call[Rack]:
    body = {"machine_type": machine_type, "layout": layout, "pods": pods}
    return Call("POST", f"{V1}/admin/fleet/racks", model(Rack), json=body)


def add_servers(server_model: str, count: int) -> Call[ServersAdded]:
    body = {"model": server_model, "count": count}
    return Call("POST", f"{V1}/admin/fleet/servers", model(ServersAdded), json=body)


def rack_health(rack_id: str, action: str, reason: str | None) -> Call[RackHealth]:
    body = {"reason": reason} if reason else None
    return Call("POST", f"{V1}/admin/fleet/racks/{seg(rack_id)}/{action}", model(RackHealth), json=body)


def retire_rack(rack_id: str) -> Call[Retired]:
    return Call("DELETE", f"{V1}/admin/fleet/racks/{seg(rack_id)}", model(Retired))


def retire_unit(unit_id: str) -> Call[Retired]:
    return Call("DELETE", f"{V1}/admin/fleet/units/{seg(unit_id)}", model(Retired))


def machine_health(machine_id: str, action: str, reason: str | None) -> Call[Machine]:
    body = {"reason": reason} if reason else None
    return Call("POST", f"{V1}/admin/machines/{seg(machine_id)}/{action}", model(Machine), json=body)


def create_partition(body: dict[str, Any]) -> Call[Partition]:
    return Call("POST", f"{V1}/admin/partitions", model(Partition), json=body)


def list_partitions(tenant: str | None, limit: int, cursor: str | None) -> Call[Page[Partition]]:
    return Call(
        "GET",
        f"{V1}/admin/partitions",
        _page(Partition),
        params={"tenant": tenant, "limit": limit, "cursor": cursor},
    )


def get_partition(name: str) -> Call[Partition]:
    return Call("GET", f"{V1}/admin/partitions/{seg(name)}", model(Partition))


def remove_partition(name: str) -> Call[Partition]:
    return Call("DELETE", f"{V1}/admin/partitions/{seg(name)}", model(Partition))


def reset_partition(name: str, gcds: int | None = None) -> Call[PartitionReset]:
    body = {"gcds": gcds} if gcds is not None else None
    return Call("POST", f"{V1}/admin/partitions/{seg(name)}/reset", model(PartitionReset), json=body)


def admin_usage(since: datetime | str | None, until: datetime | str | None) -> Call[AdminUsage]:
    return Call(
        "GET", f"{V1}/admin/usage", model(AdminUsage), params={"since": _iso(since), "until": _iso(until)}
    )


def admin_usage_csv(since: datetime | str | None, until: datetime | str | None) -> Call[str]:
    return Call(
        "GET",
        f"{V1}/admin/usage",
        text,
        params={"format": "csv", "since": _iso(since), "until": _iso(until)},
    )
