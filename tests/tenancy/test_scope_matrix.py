"""The scope matrix: every API route and every dashboard action, as every kind of caller.

Callers: a tenant's `read`-only key, its `submit`-only key, a member's key, an owner's key, an admin
key, the owner key of a suspended tenant, and a revoked key. Each API route's answer is checked
against what its scope and the caller's role allow, and each dashboard action must answer as its
API twin does (a dashboard that ignored scopes let a read-only key submit and cancel jobs). A
refused call changes nothing. While the matrix runs, no database or Redis call may be made on the
event loop (one slow query there stalls every request of the process).

The routes are read from the app (the API's OpenAPI spec, the dashboard's routers), so a route added
later fails here until it is given a case below.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from api.dashboard import (
    admin_pages,
    endpoint_pages,
    mail_pages,
    model_pages,
    routes,
    session_pages,
    sessions,
    tenant_pages,
    webhook_pages,
)
from scheduler.db import Database
from scheduler.endpointspec import EndpointSpec
from scheduler.jobspec import JobSpec, SessionSpec
from scheduler.models import (
    ApiKey,
    Endpoint,
    IpuSession,
    Job,
    JobArray,
    Machine,
    Member,
    OwnModel,
    Partition,
    TrialApplication,
    Webhook,
)
from scheduler.services import endpoints as endpoint_service
from scheduler.services import own_models
from scheduler.services import sessions as session_service
from scheduler.services.batch import arrays as array_service
from scheduler.services.batch import jobs
from scheduler.services.capacity import fleet, partitions
from scheduler.services.tenancy import claims, keys, mail, tenants, trials
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.support import agentkit, onnx_files, webhooks
from tests.support.services import Seeded, reload_settings
from vipu.topology import rack_id

MODEL = onnx_files.mlp(hidden=32, layers=2, features=16)
# `invoke`: a key with only that scope, which calls the tenant's inference endpoints and nothing else.
ROLES = ("read", "submit", "invoke", "member", "owner", "admin", "suspended", "revoked")
OK, FORBIDDEN, SIGNED_OUT, NOT_FOUND = "ok", "forbidden", "signed out", "not found"
JOB = {"name": "m", "workload": {"model": "resnet50", "batch_size": 64, "steps": 20}, "ipus": 4}
R50_FORM = {"model": "resnet50", "task": "train", "batch_size": "64", "steps": "20", "ipus": "4"}
FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')


# What each kind of route allows -------------------------------------------------------------------------

CLASSES: dict[str, dict[str, str]] = {
    "public": dict.fromkeys(ROLES, OK),
    "read": {
        "read": OK,
        "submit": FORBIDDEN,
        "invoke": FORBIDDEN,
        "member": OK,
        "owner": OK,
        "admin": OK,
        "suspended": FORBIDDEN,
        "revoked": SIGNED_OUT,
    },
    "submit": {
        "read": FORBIDDEN,
        "submit": OK,
        "invoke": FORBIDDEN,
        "member": OK,
        "owner": OK,
        "admin": OK,
        "suspended": FORBIDDEN,
        "revoked": SIGNED_OUT,
    },
    "admin": {**dict.fromkeys(ROLES, FORBIDDEN), "admin": OK, "revoked": SIGNED_OUT},
    # The v2 inference routes (api/inference.py): every key with `invoke` (new keys have it by default; a
    # key made with `submit` alone has not).
    "invoke": {
        "read": FORBIDDEN,
        "submit": FORBIDDEN,
        "invoke": OK,
        "member": OK,
        "owner": OK,
        "admin": OK,
        "suspended": FORBIDDEN,
        "revoked": SIGNED_OUT,
    },
}


# The world ---------------------------------------------------------------------------------------------


@dataclass
class World:
    db: Any
    admin_key: str
    tenant: str = ""
    owner_member: str = ""
    other_member: str = ""
    suspended_tenant: str = ""
    job: str = ""
    session: str = ""
    endpoint: str = ""
    ended_job_id: str = ""
    partition: str = "matrix-kept"
    application: str = ""
    model: str = ""
    model_file: Path = Path()
    webhook: str = ""
    delivery: int = 0
    keys: dict[str, str] = field(default_factory=dict)
    n: Iterator[int] = field(default_factory=itertools.count)

    @property
    def secret(self) -> bytes:
        return get_settings().secret()

    def unique(self, prefix: str) -> str:
        return f"{prefix}{next(self.n)}"

    def new_job(self) -> str:
        with self.db.write() as s:
            return jobs.submit_job(session=s, tenant_id=self.tenant, spec=JobSpec.model_validate(JOB)).job.id

    def new_array(self, *, cancelled: bool = False) -> str:
        with self.db.write() as s:
            spec = JobSpec.model_validate({**JOB, "array": {"indices": "0-1"}})
            array_id = array_service.submit_array(session=s, tenant_id=self.tenant, spec=spec).array.id
            if cancelled:
                array_service.cancel_elements(
                    session=s, array_id=array_id, scope=OneTenant(self.tenant), indices=None
                )
            return array_id

    def new_endpoint(self) -> str:
        with self.db.write() as s:
            spec = EndpointSpec.model_validate(
                {"name": self.unique("ep"), "model": "resnet50", "replicas": {"min": 0, "max": 1}}
            )
            return endpoint_service.create_endpoint(session=s, tenant_id=self.tenant, spec=spec).id

    def new_session(self, **fields: Any) -> str:
        with self.db.write() as s:
            spec = SessionSpec.model_validate({"ipus": 1, **fields})
            return session_service.start_session(session=s, tenant_id=self.tenant, spec=spec).id

    def timed_out_job(self) -> str:
        """A job its time limit stopped at a checkpoint: what `POST /jobs/{id}/resume` takes."""
        job_id = self.new_job()
        agentkit.stop_at_time_limit(self.db, job_id)
        return job_id

    def ended_job(self) -> str:
        job_id = self.new_job()
        with self.db.write() as s:
            jobs.request_cancel(session=s, job_id=job_id, scope=OneTenant(self.tenant))
        return job_id

    def new_key(self) -> str:
        with self.db.write() as s:
            row, _ = keys.create_key(
                session=s, secret=self.secret, tenant_id=self.tenant, name="k", member_id=self.owner_member
            )
            return row.id

    def new_member(self) -> str:
        with self.db.write() as s:
            return tenants.add_member(
                session=s, tenant_id=self.tenant, email=f"{self.unique('m')}@x.org", name="M", role="member"
            ).id

    def new_application(self) -> str:
        with self.db.write() as s:
            return trials.submit_application(
                session=s,
                name="Ada",
                email=f"{self.unique('ada')}@example.org",
                organisation="Engines",
                category="individual",
                intended_use="Training BERT on IPUs",
            ).id

    def new_partition(self) -> str:
        name = self.unique("mp")
        with self.db.write() as s:
            partitions.create_partition(session=s, name=name, size=1, machine_type=None, tenant_id=None)
        return name

    def new_model(self) -> str:
        with self.db.write() as s:
            analysed = own_models.analyse(
                data=self.model_file, dims={}, elementwise=(), max_graph_bytes=10**8
            )
            return own_models.create_model(
                session=s, tenant_id=self.tenant, name=self.unique("model"), analysed=analysed
            ).id

    def new_rack(self, *, drained: bool) -> str:
        with self.db.write() as s:
            index = fleet.add_rack(session=s, machine_type="m2000", layout="pod16", units=1)
            if drained:
                fleet.drain_rack(session=s, rack=index, health="draining", reason=None)
        return rack_id(index)

    def new_server(self) -> str:
        with self.db.write() as s:
            (index,) = fleet.add_servers(session=s, model="dss8440", count=1)
            for machine in s.query(Machine).filter(Machine.pod == index):
                fleet.set_machine_health(session=s, machine=machine.id, health="draining", reason=None)
        return fleet.unit_name(index, "server")

    def live_units(self) -> int:
        with self.db.read() as s:
            return sum(len(r["units"]) for r in fleet.racks(session=s))

    def model_count(self) -> int:
        with self.db.read() as s:
            return len(own_models.list_models(session=s, tenant_id=self.tenant, after=None, limit=1000))

    def set_suspended(self, suspended: bool) -> None:
        with self.db.write() as s:
            tenants.update_tenant(
                session=s,
                tenant_id=self.suspended_tenant,
                changes={"status": "suspended" if suspended else "active"},
            )


def build_world(db: Any, seeded: Seeded, model_file: Path) -> World:
    w = World(db=db, admin_key=seeded.admin_key)
    secret = w.secret
    with db.write() as s:
        alpha = tenants.create_tenant(session=s, secret=secret, name="alpha", plan="standard")
        w.tenant, w.owner_member = alpha.tenant.id, str(alpha.key.member_id)
        w.keys["owner"] = alpha.api_key
        member = tenants.add_member(
            session=s, tenant_id=w.tenant, email="mia@x.org", name="Mia", role="member"
        )
        w.other_member = member.id
        _, w.keys["member"] = keys.create_key(
            session=s, secret=secret, tenant_id=w.tenant, name="m", member_id=member.id
        )
        for scope in ("read", "submit", "invoke"):
            _, w.keys[scope] = keys.create_key(
                session=s,
                secret=secret,
                tenant_id=w.tenant,
                name=scope,
                scopes=[scope],
                member_id=w.owner_member,
            )
        _, w.keys["revoked"] = keys.create_key(
            session=s, secret=secret, tenant_id=w.tenant, name="old", member_id=w.owner_member
        )
        sigma = tenants.create_tenant(session=s, secret=secret, name="sigma", plan="standard")
        w.suspended_tenant = sigma.tenant.id
        w.keys["suspended"] = sigma.api_key
        partitions.create_partition(session=s, name=w.partition, size=1, machine_type=None, tenant_id=None)
    w.keys["admin"] = seeded.admin_key
    w.job = w.new_job()
    w.session = w.new_session()
    w.endpoint = w.new_endpoint()
    w.ended_job_id = w.ended_job()
    w.application = w.new_application()
    w.model_file = model_file
    w.model = w.new_model()
    w.webhook, w.delivery = webhooks.make_webhook(w.db, w.tenant)
    return w


def revoke(w: World) -> None:
    with w.db.write() as s:
        row = s.query(ApiKey).filter(ApiKey.name == "old", ApiKey.tenant_id == w.tenant).one()
        keys.revoke_key(session=s, key_id=row.id, tenant_id=w.tenant)


# Answers -----------------------------------------------------------------------------------------------


def api_outcome(r: Any) -> str:
    if r.status_code < 300:
        return OK
    return {401: SIGNED_OUT, 403: FORBIDDEN, 404: NOT_FOUND}.get(r.status_code, f"HTTP {r.status_code}")


def dash_outcome(r: Any) -> str:
    if r.status_code == 303:
        return SIGNED_OUT if r.headers["location"].startswith("/login") else OK
    return api_outcome(r)


# API cases: (the kind of route, how to call it) ---------------------------------------------------------

Unchanged = Callable[[], bool] | None


@dataclass
class Call:
    url: str
    json: Any = None
    unchanged: Unchanged = None  # after a refusal: the target is as it was
    files: dict[str, Any] | None = None  # a multipart upload instead of JSON


def _job_untouched(w: World, job_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            job = s.get(Job, job_id)
            return job.state == "queued" and not job.cancel_requested

    return check


def _key_live(w: World, key_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(ApiKey, key_id).revoked_at is None

    return check


def _partition_live(w: World, name: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return (
                s.query(Partition).filter(Partition.name == name, Partition.released_at.is_(None)).count()
                == 1
            )

    return check


def _pending(w: World, app_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(TrialApplication, app_id).status == "pending"

    return check


def _machine_up(w: World) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(Machine, "pod0001-m15").health == "up"

    return check


def _member_there(w: World, member_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(Member, member_id) is not None

    return check


def _still_stopped(w: World, job_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(Job, job_id).state == "failed"

    return check


def _resume(w: World) -> Call:
    job_id = w.timed_out_job()
    return Call(f"/api/v1/jobs/{job_id}/resume", unchanged=_still_stopped(w, job_id))


def _dash_resume(w: World, csrf: str) -> Form:
    job_id = w.timed_out_job()
    return Form("POST", f"/jobs/{job_id}/resume", {"csrf": csrf}, unchanged=_still_stopped(w, job_id))


def _array_states(w: World, array_id: str, states: set[str], max_running: int | None) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            got = {j.state for j in s.query(Job).filter(Job.array_id == array_id)}
            return got == states and s.get(JobArray, array_id).max_running == max_running

    return check


def _cancel_array(w: World) -> Call:
    array_id = w.new_array()
    return Call(
        f"/api/v1/arrays/{array_id}/cancel", {}, unchanged=_array_states(w, array_id, {"queued"}, None)
    )


def _retry_array(w: World) -> Call:
    array_id = w.new_array(cancelled=True)
    return Call(
        f"/api/v1/arrays/{array_id}/retry",
        {"indices": "failed"},
        unchanged=_array_states(w, array_id, {"cancelled"}, None),
    )


def _patch_array(w: World) -> Call:
    array_id = w.new_array()
    return Call(
        f"/api/v1/arrays/{array_id}",
        {"max_running": 1},
        unchanged=_array_states(w, array_id, {"queued"}, None),
    )


def _cancel(w: World) -> Call:
    job_id = w.new_job()
    return Call(f"/api/v1/jobs/{job_id}/cancel", unchanged=_job_untouched(w, job_id))


def _session_live(w: World, session_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(IpuSession, session_id).state != "ended"

    return check


def _session_length(w: World, session_id: str, max_duration_s: int) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(IpuSession, session_id).max_duration_s == max_duration_s

    return check


def _extend_session(w: World) -> Call:
    session_id = w.new_session(max_duration_s=600)
    return Call(
        f"/api/v1/sessions/{session_id}",
        {"max_duration_s": 1200},
        unchanged=_session_length(w, session_id, 600),
    )


def _dash_extend_session(w: World, csrf: str) -> Form:
    session_id = w.new_session(max_duration_s=600)
    return Form(
        "POST",
        f"/sessions/{session_id}/extend",
        {"csrf": csrf, "add_s": "600"},
        unchanged=_session_length(w, session_id, 600),
    )


def _end_session(w: World) -> Call:
    session_id = w.new_session()
    return Call(f"/api/v1/sessions/{session_id}", unchanged=_session_live(w, session_id))


def _endpoint_live(w: World, endpoint_id: str, max_queue: int = 256) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            row = s.get(Endpoint, endpoint_id)
            return row.state != "stopped" and row.max_queue == max_queue

    return check


def _v2(w: World, path: str, body: Any = None) -> Call:
    """A v2 route of the world's endpoint (`{model}` is its name); it has no replica."""
    with w.db.read() as s:
        name = s.get(Endpoint, w.endpoint).name
    return Call(f"/api/v1/endpoints/{w.endpoint}/v2{path.format(model=name)}", body)


# A request whose tensors are wrong: an allowed caller gets the protocol's 400 (it needs no replica).
BAD_INFER = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1], "data": [0]}]}
V2 = "/api/v1/endpoints/{endpoint_id}/v2"


def _change_endpoint(w: World) -> Call:
    endpoint_id = w.new_endpoint()
    return Call(
        f"/api/v1/endpoints/{endpoint_id}", {"max_queue": 7}, unchanged=_endpoint_live(w, endpoint_id)
    )


def _delete_endpoint(w: World) -> Call:
    endpoint_id = w.new_endpoint()
    return Call(f"/api/v1/endpoints/{endpoint_id}", unchanged=_endpoint_live(w, endpoint_id))


def _delete_key(w: World) -> Call:
    key_id = w.new_key()
    return Call(f"/api/v1/keys/{key_id}", unchanged=_key_live(w, key_id))


def _delete_tenant_key(w: World) -> Call:
    key_id = w.new_key()
    return Call(f"/api/v1/admin/tenants/{w.tenant}/keys/{key_id}", unchanged=_key_live(w, key_id))


def _partition(w: World, suffix: str) -> Call:
    name = w.new_partition()
    return Call(f"/api/v1/admin/partitions/{name}{suffix}", unchanged=_partition_live(w, name))


def _decide(w: World, verb: str, body: Any) -> Call:
    app_id = w.new_application()
    return Call(f"/api/v1/admin/trials/{app_id}/{verb}", body, unchanged=_pending(w, app_id))


def _member(w: World, body: Any = None) -> Call:
    member_id = w.new_member()
    return Call(f"/api/v1/admin/tenants/{w.tenant}/members/{member_id}", body, _member_there(w, member_id))


def _machine(w: World, verb: str) -> Call:
    # Each admin call is undone by the next case's setup (restore), so the fleet stays whole.
    with w.db.write() as s:
        from scheduler.services.capacity import fleet

        fleet.set_machine_health(session=s, machine="pod0001-m15", health="up", reason=None)
    return Call(
        f"/api/v1/admin/machines/pod0001-m15/{verb}", {}, _machine_up(w) if verb != "restore" else None
    )


def _unit_count_is(w: World, count: int) -> Callable[[], bool]:
    return lambda: w.live_units() == count


def _rack_up(w: World, rack: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return all(
                m.health == "up" for m in s.query(Machine).filter(Machine.rack == fleet.parse_rack(rack))
            )

    return check


def _add(w: World, path: str, body: dict[str, Any]) -> Call:
    return Call(path, body, unchanged=_unit_count_is(w, w.live_units()))


def _retire(w: World, path: str) -> Call:
    return Call(path, unchanged=_unit_count_is(w, w.live_units()))


def _model_there(w: World, model_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(OwnModel, model_id) is not None

    return check


def _upload(w: World) -> Call:
    before = w.model_count()
    return Call(
        "/api/v1/models",
        files={"file": ("m.onnx", MODEL, "application/octet-stream"), "name": (None, w.unique("up"))},
        unchanged=lambda: w.model_count() == before,
    )


def _delete_model(w: World) -> Call:
    model_id = w.new_model()
    return Call(f"/api/v1/models/{model_id}", unchanged=_model_there(w, model_id))


def _drain_rack(w: World) -> Call:
    rack = w.new_rack(drained=False)
    return Call(f"/api/v1/admin/fleet/racks/{rack}/drain", {}, unchanged=_rack_up(w, rack))


API: dict[tuple[str, str], tuple[str, Callable[[World], Call]]] = {
    ("POST", "/api/v1/jobs"): ("submit", lambda w: Call("/api/v1/jobs", JOB)),
    ("GET", "/api/v1/jobs"): ("read", lambda w: Call("/api/v1/jobs")),
    ("GET", "/api/v1/jobs/{job_id}"): ("read", lambda w: Call(f"/api/v1/jobs/{w.job}")),
    ("POST", "/api/v1/jobs/{job_id}/cancel"): ("submit", _cancel),
    ("GET", "/api/v1/arrays"): ("read", lambda w: Call("/api/v1/arrays")),
    ("GET", "/api/v1/arrays/{array_id}"): ("read", lambda w: Call(f"/api/v1/arrays/{w.new_array()}")),
    ("GET", "/api/v1/arrays/{array_id}/jobs"): (
        "read",
        lambda w: Call(f"/api/v1/arrays/{w.new_array()}/jobs"),
    ),
    ("PATCH", "/api/v1/arrays/{array_id}"): ("submit", _patch_array),
    ("POST", "/api/v1/arrays/{array_id}/cancel"): ("submit", _cancel_array),
    ("POST", "/api/v1/arrays/{array_id}/retry"): ("submit", _retry_array),
    ("POST", "/api/v1/jobs/{job_id}/resume"): ("submit", _resume),
    ("GET", "/api/v1/jobs/{job_id}/logs"): ("read", lambda w: Call(f"/api/v1/jobs/{w.job}/logs")),
    ("POST", "/api/v1/sessions"): ("submit", lambda w: Call("/api/v1/sessions", {"ipus": 1})),
    ("POST", "/api/v1/endpoints"): (
        "submit",
        lambda w: Call(
            "/api/v1/endpoints",
            {"name": w.unique("ep"), "model": "resnet50", "replicas": {"min": 0, "max": 1}},
        ),
    ),
    ("GET", "/api/v1/endpoints"): ("read", lambda w: Call("/api/v1/endpoints")),
    ("GET", "/api/v1/endpoints/{endpoint_id}"): ("read", lambda w: Call(f"/api/v1/endpoints/{w.endpoint}")),
    ("GET", "/api/v1/endpoints/{endpoint_id}/metrics"): (
        "read",
        lambda w: Call(f"/api/v1/endpoints/{w.endpoint}/metrics"),
    ),
    ("PATCH", "/api/v1/endpoints/{endpoint_id}"): ("submit", _change_endpoint),
    ("GET", V2): ("invoke", lambda w: _v2(w, "")),
    ("GET", V2 + "/health/live"): ("invoke", lambda w: _v2(w, "/health/live")),
    ("GET", V2 + "/health/ready"): ("invoke", lambda w: _v2(w, "/health/ready")),
    ("GET", V2 + "/models/{model}"): ("invoke", lambda w: _v2(w, "/models/{model}")),
    ("GET", V2 + "/models/{model}/ready"): ("invoke", lambda w: _v2(w, "/models/{model}/ready")),
    ("GET", V2 + "/models/{model}/versions/{version}"): (
        "invoke",
        lambda w: _v2(w, "/models/{model}/versions/1"),
    ),
    ("GET", V2 + "/models/{model}/versions/{version}/ready"): (
        "invoke",
        lambda w: _v2(w, "/models/{model}/versions/1/ready"),
    ),
    ("POST", V2 + "/models/{model}/infer"): ("invoke", lambda w: _v2(w, "/models/{model}/infer", BAD_INFER)),
    ("POST", V2 + "/models/{model}/versions/{version}/infer"): (
        "invoke",
        lambda w: _v2(w, "/models/{model}/versions/1/infer", BAD_INFER),
    ),
    ("DELETE", "/api/v1/endpoints/{endpoint_id}"): ("submit", _delete_endpoint),
    ("GET", "/api/v1/sessions"): ("read", lambda w: Call("/api/v1/sessions")),
    ("GET", "/api/v1/sessions/{session_id}"): ("read", lambda w: Call(f"/api/v1/sessions/{w.session}")),
    ("PATCH", "/api/v1/sessions/{session_id}"): ("submit", _extend_session),
    ("DELETE", "/api/v1/sessions/{session_id}"): ("submit", _end_session),
    ("GET", "/api/v1/workloads"): ("read", lambda w: Call("/api/v1/workloads")),
    ("POST", "/api/v1/estimates"): (
        "read",
        lambda w: Call("/api/v1/estimates", {"workload": JOB["workload"], "ipus": 4}),
    ),
    ("GET", "/api/v1/usage"): ("read", lambda w: Call("/api/v1/usage")),
    ("GET", "/api/v1/keys"): ("read", lambda w: Call("/api/v1/keys")),
    ("POST", "/api/v1/keys"): ("submit", lambda w: Call("/api/v1/keys", {"name": "new"})),
    ("DELETE", "/api/v1/keys/{key_id}"): ("submit", _delete_key),
    ("POST", "/api/v1/trials"): (
        "public",
        lambda w: Call(
            "/api/v1/trials",
            {
                "name": "Ada",
                "email": f"{w.unique('t')}@example.org",
                "organisation": "Engines",
                "category": "individual",
                "intended_use": "Training BERT on IPUs",
            },
        ),
    ),
    ("GET", "/api/v1/admin/usage"): ("admin", lambda w: Call("/api/v1/admin/usage")),
    ("GET", "/api/v1/admin/fleet"): ("admin", lambda w: Call("/api/v1/admin/fleet")),
    ("POST", "/api/v1/admin/machines/{machine_id}/drain"): ("admin", lambda w: _machine(w, "drain")),
    ("POST", "/api/v1/admin/machines/{machine_id}/fail"): ("admin", lambda w: _machine(w, "fail")),
    ("POST", "/api/v1/admin/machines/{machine_id}/restore"): ("admin", lambda w: _machine(w, "restore")),
    ("POST", "/api/v1/admin/partitions"): (
        "admin",
        lambda w: Call("/api/v1/admin/partitions", {"id": w.unique("np"), "size": 1}),
    ),
    ("GET", "/api/v1/admin/partitions"): ("admin", lambda w: Call("/api/v1/admin/partitions")),
    ("GET", "/api/v1/admin/partitions/{partition_id}"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/partitions/{w.partition}"),
    ),
    ("DELETE", "/api/v1/admin/partitions/{partition_id}"): ("admin", lambda w: _partition(w, "")),
    ("POST", "/api/v1/admin/partitions/{partition_id}/reset"): ("admin", lambda w: _partition(w, "/reset")),
    ("POST", "/api/v1/admin/tenants"): (
        "admin",
        lambda w: Call("/api/v1/admin/tenants", {"name": w.unique("tenant")}),
    ),
    ("GET", "/api/v1/admin/tenants"): ("admin", lambda w: Call("/api/v1/admin/tenants")),
    ("GET", "/api/v1/admin/tenants/{tenant_id}"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/tenants/{w.tenant}"),
    ),
    ("PATCH", "/api/v1/admin/tenants/{tenant_id}"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/tenants/{w.tenant}", {"fairshare_weight": 1.0}),
    ),
    ("GET", "/api/v1/admin/tenants/{tenant_id}/members"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/tenants/{w.tenant}/members"),
    ),
    ("POST", "/api/v1/admin/tenants/{tenant_id}/members"): (
        "admin",
        lambda w: Call(
            f"/api/v1/admin/tenants/{w.tenant}/members", {"email": f"{w.unique('p')}@x.org", "name": "P"}
        ),
    ),
    ("PATCH", "/api/v1/admin/tenants/{tenant_id}/members/{member_id}"): (
        "admin",
        lambda w: _member(w, {"name": "Renamed"}),
    ),
    ("DELETE", "/api/v1/admin/tenants/{tenant_id}/members/{member_id}"): ("admin", _member),
    ("GET", "/api/v1/admin/tenants/{tenant_id}/keys"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/tenants/{w.tenant}/keys"),
    ),
    ("POST", "/api/v1/admin/tenants/{tenant_id}/keys"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/tenants/{w.tenant}/keys", {"name": "by-admin"}),
    ),
    ("DELETE", "/api/v1/admin/tenants/{tenant_id}/keys/{key_id}"): ("admin", _delete_tenant_key),
    ("GET", "/api/v1/admin/plans"): ("admin", lambda w: Call("/api/v1/admin/plans")),
    ("GET", "/api/v1/admin/plans/{name}"): ("admin", lambda w: Call("/api/v1/admin/plans/trial")),
    ("PATCH", "/api/v1/admin/plans/{name}"): (
        "admin",
        lambda w: Call("/api/v1/admin/plans/standard", {"description": "Standard"}),
    ),
    ("GET", "/api/v1/admin/trials"): ("admin", lambda w: Call("/api/v1/admin/trials")),
    ("GET", "/api/v1/admin/trials/{application_id}"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/trials/{w.application}"),
    ),
    ("POST", "/api/v1/admin/trials/{application_id}/approve"): ("admin", lambda w: _decide(w, "approve", {})),
    ("POST", "/api/v1/admin/trials/{application_id}/reject"): (
        "admin",
        lambda w: _decide(w, "reject", {"reason": "no"}),
    ),
    ("POST", "/api/v1/models"): ("submit", _upload),
    ("GET", "/api/v1/models"): ("read", lambda w: Call("/api/v1/models")),
    ("GET", "/api/v1/models/{model}"): ("read", lambda w: Call(f"/api/v1/models/{w.model}")),
    ("DELETE", "/api/v1/models/{model}"): ("submit", _delete_model),
    ("GET", "/api/v1/admin/fleet/racks"): ("admin", lambda w: Call("/api/v1/admin/fleet/racks")),
    ("POST", "/api/v1/admin/fleet/racks"): (
        "admin",
        lambda w: _add(w, "/api/v1/admin/fleet/racks", {"machine_type": "m2000", "layout": "pod16"}),
    ),
    ("POST", "/api/v1/admin/fleet/servers"): (
        "admin",
        lambda w: _add(w, "/api/v1/admin/fleet/servers", {"model": "dss8440", "count": 1}),
    ),
    ("POST", "/api/v1/admin/fleet/racks/{rack_id}/drain"): ("admin", _drain_rack),
    ("POST", "/api/v1/admin/fleet/racks/{rack_id}/restore"): (
        "admin",
        lambda w: Call(f"/api/v1/admin/fleet/racks/{w.new_rack(drained=True)}/restore", {}),
    ),
    ("DELETE", "/api/v1/admin/fleet/racks/{rack_id}"): (
        "admin",
        lambda w: _retire(w, f"/api/v1/admin/fleet/racks/{w.new_rack(drained=True)}"),
    ),
    ("DELETE", "/api/v1/admin/fleet/units/{unit_id}"): (
        "admin",
        lambda w: _retire(w, f"/api/v1/admin/fleet/units/{w.new_server()}"),
    ),
    ("GET", "/healthz"): ("public", lambda w: Call("/healthz")),
    ("GET", "/readyz"): ("public", lambda w: Call("/readyz")),
    ("GET", "/metrics"): ("public", lambda w: Call("/metrics")),
}

_INVOKERS = ("invoke", "member", "owner", "admin")


# Where a route answers otherwise than its kind says, and why.
def _webhook_there(w: World, webhook_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            return s.get(Webhook, webhook_id) is not None

    return check


def _delete_webhook(w: World) -> Call:
    webhook_id, _ = webhooks.make_webhook(w.db, w.tenant)
    return Call(f"/api/v1/webhooks/{webhook_id}", unchanged=_webhook_there(w, webhook_id))


WEBHOOK_CASES: dict[tuple[str, str], tuple[str, Callable[[World], Call]]] = {
    # A public address given as such: created without a DNS look-up, and nothing is sent to it here.
    ("POST", "/api/v1/webhooks"): (
        "submit",
        lambda w: Call("/api/v1/webhooks", {"url": "https://93.184.215.14/"}),
    ),
    ("GET", "/api/v1/webhooks"): ("read", lambda w: Call("/api/v1/webhooks")),
    ("GET", "/api/v1/webhooks/{webhook_id}"): ("read", lambda w: Call(f"/api/v1/webhooks/{w.webhook}")),
    ("PATCH", "/api/v1/webhooks/{webhook_id}"): (
        "submit",
        lambda w: Call(f"/api/v1/webhooks/{w.webhook}", {"description": "changed"}),
    ),
    ("DELETE", "/api/v1/webhooks/{webhook_id}"): ("submit", _delete_webhook),
    ("POST", "/api/v1/webhooks/{webhook_id}/rotate-secret"): (
        "submit",
        lambda w: Call(f"/api/v1/webhooks/{w.webhook}/rotate-secret", {"overlap_s": 0}),
    ),
    ("POST", "/api/v1/webhooks/{webhook_id}/test"): (
        "submit",
        lambda w: Call(f"/api/v1/webhooks/{w.webhook}/test", {}),
    ),
    ("GET", "/api/v1/webhooks/{webhook_id}/deliveries"): (
        "read",
        lambda w: Call(f"/api/v1/webhooks/{w.webhook}/deliveries"),
    ),
    ("POST", "/api/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"): (
        "submit",
        lambda w: Call(f"/api/v1/webhooks/{w.webhook}/deliveries/{w.delivery}/redeliver", {}),
    ),
    ("GET", "/api/v1/events"): ("read", lambda w: Call("/api/v1/events")),
}
API.update(WEBHOOK_CASES)
# A member's own e-mail choices: each key reads and changes its member's; an admin key has none.
API.update(
    {
        ("GET", "/api/v1/notification-settings"): ("read", lambda w: Call("/api/v1/notification-settings")),
        ("PUT", "/api/v1/notification-settings"): (
            "submit",
            lambda w: Call("/api/v1/notification-settings", {"session_mail": False}),
        ),
    }
)

API_EXCEPTIONS: dict[tuple[str, str], dict[str, str]] = {
    # The world's endpoint has no replica: not ready (503), and a wrong tensor is a 400 before any wait.
    **{
        ("GET", V2 + path): dict.fromkeys(_INVOKERS, "HTTP 503")
        for path in ("/health/ready", "/models/{model}/ready", "/models/{model}/versions/{version}/ready")
    },
    **{
        ("POST", V2 + path): dict.fromkeys(_INVOKERS, "HTTP 400")
        for path in ("/models/{model}/infer", "/models/{model}/versions/{version}/infer")
    },
    # Owners manage a tenant's webhooks, members read them; an admin key has no tenant to own one.
    **{route: {"member": FORBIDDEN} for route, (kind, _) in WEBHOOK_CASES.items() if kind == "submit"},
    ("POST", "/api/v1/webhooks"): {"member": FORBIDDEN, "admin": FORBIDDEN},
    ("GET", "/api/v1/notification-settings"): {"admin": FORBIDDEN},
    ("PUT", "/api/v1/notification-settings"): {"admin": FORBIDDEN},
    # Admin keys belong to no tenant: no grant to bill, no tenant usage to show.
    ("POST", "/api/v1/jobs"): {"admin": FORBIDDEN},
    ("POST", "/api/v1/sessions"): {"admin": FORBIDDEN},
    ("POST", "/api/v1/endpoints"): {"admin": FORBIDDEN},
    ("GET", "/api/v1/usage"): {"admin": FORBIDDEN},
    # Models belong to a tenant.
    ("POST", "/api/v1/models"): {"admin": FORBIDDEN},
    ("GET", "/api/v1/models"): {"admin": FORBIDDEN},
    ("GET", "/api/v1/models/{model}"): {"admin": FORBIDDEN},
    ("DELETE", "/api/v1/models/{model}"): {"admin": FORBIDDEN},
    # Only owners create keys; a member revokes only its own, and an admin here manages global keys.
    ("POST", "/api/v1/keys"): {"member": FORBIDDEN},
    ("DELETE", "/api/v1/keys/{key_id}"): {"member": NOT_FOUND, "admin": NOT_FOUND},
}


def expected_api(route: tuple[str, str], role: str) -> str:
    kind, _ = API[route]
    return API_EXCEPTIONS.get(route, {}).get(role, CLASSES[kind][role])


# Dashboard cases: (its API twin, or what it answers; how to call it) ---------------------------------


@dataclass
class Form:
    method: str
    url: str
    data: dict[str, str] | None = None
    headers: dict[str, str] | None = None
    unchanged: Unchanged = None
    files: dict[str, Any] | None = None


def _dash_cancel(w: World, csrf: str) -> Form:
    job_id = w.new_job()
    return Form("POST", f"/jobs/{job_id}/cancel", {"csrf": csrf}, unchanged=_job_untouched(w, job_id))


def _dash_partition(w: World, csrf: str, verb: str) -> Form:
    name = w.new_partition()
    return Form(
        "POST", f"/admin/partitions/{name}/{verb}", {"csrf": csrf}, unchanged=_partition_live(w, name)
    )


def _dash_decide(w: World, csrf: str, verb: str) -> Form:
    app_id = w.new_application()
    data = {"csrf": csrf, "plan": ""} if verb == "approve" else {"csrf": csrf, "reason": "no"}
    return Form("POST", f"/admin/trials/{app_id}/{verb}", data, unchanged=_pending(w, app_id))


def _dash_revoke(w: World, csrf: str) -> Form:
    key_id = w.new_key()
    return Form(
        "POST",
        f"/admin/tenants/{w.tenant}/keys/{key_id}/revoke",
        {"csrf": csrf},
        unchanged=_key_live(w, key_id),
    )


def _dash_machine(w: World, csrf: str) -> Form:
    call = _machine(w, "drain")
    return Form("POST", "/admin/machines/pod0001-m15/drain", {"csrf": csrf}, unchanged=call.unchanged)


def _dash_add(w: World, path: str, data: dict[str, str]) -> Form:
    return Form("POST", path, data, unchanged=_unit_count_is(w, w.live_units()))


def _dash_retire(w: World, path: str, csrf: str) -> Form:
    return Form("POST", path, {"csrf": csrf}, unchanged=_unit_count_is(w, w.live_units()))


def _dash_drain_rack(w: World, csrf: str) -> Form:
    rack = w.new_rack(drained=False)
    return Form("POST", f"/admin/fleet/racks/{rack}/drain", {"csrf": csrf}, unchanged=_rack_up(w, rack))


def _dash_upload(w: World, csrf: str) -> Form:
    before = w.model_count()
    return Form(
        "POST",
        "/models/upload",
        {"csrf": csrf, "name": w.unique("dup")},
        files={"file": ("m.onnx", MODEL, "application/octet-stream")},
        unchanged=lambda: w.model_count() == before,
    )


def _dash_delete_model(w: World, csrf: str) -> Form:
    model_id = w.new_model()
    return Form("POST", f"/models/{model_id}/delete", {"csrf": csrf}, unchanged=_model_there(w, model_id))


def _dash_end_session(w: World, csrf: str) -> Form:
    session_id = w.new_session()
    return Form("POST", f"/sessions/{session_id}/end", {"csrf": csrf}, unchanged=_session_live(w, session_id))


def _dash_retry_array(w: World, csrf: str) -> Form:
    array_id = w.new_array(cancelled=True)
    return Form(
        "POST",
        f"/arrays/{array_id}/retry",
        {"csrf": csrf},
        unchanged=_array_states(w, array_id, {"cancelled"}, None),
    )


DashPrep = Callable[[World, str], Form]
# (route path, a name when one route has several actions) -> (API twin or own answers, call)
DASHBOARD: dict[tuple[str, str, str], tuple[tuple[str, str] | dict[str, str], DashPrep]] = {
    # The tenant's home (its usage and jobs); signed out, the public landing page.
    ("GET", "/", ""): ({**CLASSES["read"], "revoked": OK}, lambda w, c: Form("GET", "/")),
    ("GET", "/jobs", ""): (("GET", "/api/v1/jobs"), lambda w, c: Form("GET", "/jobs")),
    ("GET", "/jobs/new", ""): (("GET", "/api/v1/workloads"), lambda w, c: Form("GET", "/jobs/new")),
    ("POST", "/jobs/new", "submit"): (
        ("POST", "/api/v1/jobs"),
        lambda w, c: Form("POST", "/jobs/new", {**R50_FORM, "action": "submit", "csrf": c}),
    ),
    ("POST", "/jobs/new", "preview"): (
        ("POST", "/api/v1/estimates"),
        lambda w, c: Form("POST", "/jobs/new", {**R50_FORM, "action": "preview", "csrf": c}),
    ),
    ("POST", "/jobs/estimate", ""): (
        ("POST", "/api/v1/estimates"),
        lambda w, c: Form("POST", "/jobs/estimate", R50_FORM, {"X-CSRF-Token": c}),
    ),
    ("GET", "/jobs/{job_id}", ""): (
        ("GET", "/api/v1/jobs/{job_id}"),
        lambda w, c: Form("GET", f"/jobs/{w.job}"),
    ),
    ("GET", "/jobs/{job_id}/events", ""): (
        ("GET", "/api/v1/jobs/{job_id}/logs"),
        lambda w, c: Form("GET", f"/jobs/{w.ended_job_id}/events"),
    ),
    ("POST", "/jobs/{job_id}/cancel", ""): (("POST", "/api/v1/jobs/{job_id}/cancel"), _dash_cancel),
    ("POST", "/jobs/{job_id}/resume", ""): (("POST", "/api/v1/jobs/{job_id}/resume"), _dash_resume),
    ("GET", "/usage.csv", ""): (("GET", "/api/v1/usage"), lambda w, c: Form("GET", "/usage.csv")),
    ("GET", "/admin/fleet", ""): (("GET", "/api/v1/admin/fleet"), lambda w, c: Form("GET", "/admin/fleet")),
    ("POST", "/admin/machines/{machine_id}/{action}", ""): (
        ("POST", "/api/v1/admin/machines/{machine_id}/drain"),
        _dash_machine,
    ),
    ("GET", "/admin/partitions", ""): (
        ("GET", "/api/v1/admin/partitions"),
        lambda w, c: Form("GET", "/admin/partitions"),
    ),
    ("POST", "/admin/partitions", ""): (
        ("POST", "/api/v1/admin/partitions"),
        lambda w, c: Form(
            "POST", "/admin/partitions", {"csrf": c, "id": w.unique("dp"), "size": "1", "gcds": "1"}
        ),
    ),
    ("POST", "/admin/partitions/{name}/{action}", "remove"): (
        ("DELETE", "/api/v1/admin/partitions/{partition_id}"),
        lambda w, c: _dash_partition(w, c, "remove"),
    ),
    ("POST", "/admin/partitions/{name}/{action}", "reset"): (
        ("POST", "/api/v1/admin/partitions/{partition_id}/reset"),
        lambda w, c: _dash_partition(w, c, "reset"),
    ),
    ("GET", "/admin/tenants", ""): (
        ("GET", "/api/v1/admin/tenants"),
        lambda w, c: Form("GET", "/admin/tenants"),
    ),
    ("POST", "/admin/tenants", ""): (
        ("POST", "/api/v1/admin/tenants"),
        lambda w, c: Form("POST", "/admin/tenants", {"csrf": c, "name": w.unique("dt"), "plan": "trial"}),
    ),
    ("GET", "/admin/tenants/{tenant_id}", ""): (
        ("GET", "/api/v1/admin/tenants/{tenant_id}"),
        lambda w, c: Form("GET", f"/admin/tenants/{w.tenant}"),
    ),
    ("POST", "/admin/tenants/{tenant_id}", ""): (
        ("PATCH", "/api/v1/admin/tenants/{tenant_id}"),
        lambda w, c: Form("POST", f"/admin/tenants/{w.tenant}", {"csrf": c, "status": "active"}),
    ),
    ("POST", "/admin/tenants/{tenant_id}/keys", ""): (
        ("POST", "/api/v1/admin/tenants/{tenant_id}/keys"),
        lambda w, c: Form("POST", f"/admin/tenants/{w.tenant}/keys", {"csrf": c, "name": "dash"}),
    ),
    ("POST", "/admin/tenants/{tenant_id}/keys/{key_id}/revoke", ""): (
        ("DELETE", "/api/v1/admin/tenants/{tenant_id}/keys/{key_id}"),
        _dash_revoke,
    ),
    ("POST", "/admin/plans/{name}", ""): (
        ("PATCH", "/api/v1/admin/plans/{name}"),
        lambda w, c: Form("POST", "/admin/plans/standard", {"csrf": c}),
    ),
    ("GET", "/admin/trials", ""): (
        ("GET", "/api/v1/admin/trials"),
        lambda w, c: Form("GET", "/admin/trials"),
    ),
    ("POST", "/admin/trials/{application_id}/approve", ""): (
        ("POST", "/api/v1/admin/trials/{application_id}/approve"),
        lambda w, c: _dash_decide(w, c, "approve"),
    ),
    ("POST", "/admin/trials/{application_id}/reject", ""): (
        ("POST", "/api/v1/admin/trials/{application_id}/reject"),
        lambda w, c: _dash_decide(w, c, "reject"),
    ),
    ("GET", "/admin/usage", ""): (("GET", "/api/v1/admin/usage"), lambda w, c: Form("GET", "/admin/usage")),
    ("GET", "/admin/usage.csv", ""): (
        ("GET", "/api/v1/admin/usage"),
        lambda w, c: Form("GET", "/admin/usage.csv"),
    ),
    ("POST", "/admin/fleet/racks", ""): (
        ("POST", "/api/v1/admin/fleet/racks"),
        lambda w, c: _dash_add(
            w, "/admin/fleet/racks", {"csrf": c, "machine_type": "m2000", "layout": "pod16"}
        ),
    ),
    ("POST", "/admin/fleet/servers", ""): (
        ("POST", "/api/v1/admin/fleet/servers"),
        lambda w, c: _dash_add(w, "/admin/fleet/servers", {"csrf": c, "model": "dss8440", "count": "1"}),
    ),
    ("POST", "/admin/fleet/racks/{rack_id}/{action}", "drain"): (
        ("POST", "/api/v1/admin/fleet/racks/{rack_id}/drain"),
        _dash_drain_rack,
    ),
    ("POST", "/admin/fleet/racks/{rack_id}/{action}", "restore"): (
        ("POST", "/api/v1/admin/fleet/racks/{rack_id}/restore"),
        lambda w, c: Form("POST", f"/admin/fleet/racks/{w.new_rack(drained=True)}/restore", {"csrf": c}),
    ),
    ("POST", "/admin/fleet/racks/{rack_id}/{action}", "retire"): (
        ("DELETE", "/api/v1/admin/fleet/racks/{rack_id}"),
        lambda w, c: _dash_retire(w, f"/admin/fleet/racks/{w.new_rack(drained=True)}/retire", c),
    ),
    ("POST", "/admin/fleet/units/{unit_id}/retire", ""): (
        ("DELETE", "/api/v1/admin/fleet/units/{unit_id}"),
        lambda w, c: _dash_retire(w, f"/admin/fleet/units/{w.new_server()}/retire", c),
    ),
    ("GET", "/models", ""): (("GET", "/api/v1/models"), lambda w, c: Form("GET", "/models")),
    ("GET", "/sessions", ""): (("GET", "/api/v1/sessions"), lambda w, c: Form("GET", "/sessions")),
    ("POST", "/sessions", ""): (
        ("POST", "/api/v1/sessions"),
        lambda w, c: Form("POST", "/sessions", {"csrf": c, "ipus": "1"}),
    ),
    ("GET", "/sessions/{session_id}", ""): (
        ("GET", "/api/v1/sessions/{session_id}"),
        lambda w, c: Form("GET", f"/sessions/{w.session}"),
    ),
    ("POST", "/sessions/{session_id}/extend", ""): (
        ("PATCH", "/api/v1/sessions/{session_id}"),
        _dash_extend_session,
    ),
    ("POST", "/sessions/{session_id}/end", ""): (
        ("DELETE", "/api/v1/sessions/{session_id}"),
        _dash_end_session,
    ),
    ("POST", "/models/upload", ""): (("POST", "/api/v1/models"), _dash_upload),
    ("GET", "/arrays", ""): (("GET", "/api/v1/arrays"), lambda w, c: Form("GET", "/arrays")),
    ("GET", "/arrays/{array_id}", ""): (
        ("GET", "/api/v1/arrays/{array_id}"),
        lambda w, c: Form("GET", f"/arrays/{w.new_array()}"),
    ),
    ("GET", "/arrays/{array_id}/results.csv", ""): (
        ("GET", "/api/v1/arrays/{array_id}/jobs"),
        lambda w, c: Form("GET", f"/arrays/{w.new_array()}/results.csv"),
    ),
    ("POST", "/arrays/{array_id}/retry", ""): (
        ("POST", "/api/v1/arrays/{array_id}/retry"),
        _dash_retry_array,
    ),
    ("GET", "/endpoints", ""): (("GET", "/api/v1/endpoints"), lambda w, c: Form("GET", "/endpoints")),
    ("GET", "/endpoints/{endpoint_id}", ""): (
        ("GET", "/api/v1/endpoints/{endpoint_id}"),
        lambda w, c: Form("GET", f"/endpoints/{w.endpoint}"),
    ),
    ("GET", "/models/{model}", ""): (
        ("GET", "/api/v1/models/{model}"),
        lambda w, c: Form("GET", f"/models/{w.model}"),
    ),
    ("POST", "/models/{model}/delete", ""): (("DELETE", "/api/v1/models/{model}"), _dash_delete_model),
    # Dashboard-only: sign-in pages, the trial form, the redirect to the fleet map.
    ("GET", "/login", ""): (
        {**dict.fromkeys(ROLES, OK), "suspended": FORBIDDEN},
        lambda w, c: Form("GET", "/login"),
    ),
    # Signing out sends the browser to the sign-in page: "signed out" is its success.
    ("POST", "/logout", ""): (
        {**dict.fromkeys(ROLES, SIGNED_OUT), "suspended": FORBIDDEN},
        lambda w, c: Form("POST", "/logout", {"csrf": c}),
    ),
    ("GET", "/trial", ""): (dict.fromkeys(ROLES, OK), lambda w, c: Form("GET", "/trial")),
    ("GET", "/admin", ""): (dict.fromkeys(ROLES, OK), lambda w, c: Form("GET", "/admin")),
    # E-mail (api/dashboard/mail_pages.py): a member's settings, the admin's kept messages, and the links
    # mailed to people, which are their own authority whoever follows them.
    ("GET", "/settings/notifications", ""): (
        ("GET", "/api/v1/notification-settings"),
        lambda w, c: Form("GET", "/settings/notifications"),
    ),
    ("POST", "/settings/notifications", ""): (
        ("PUT", "/api/v1/notification-settings"),
        lambda w, c: Form("POST", "/settings/notifications", {"csrf": c, "budget_thresholds": "50"}),
    ),
    ("GET", "/admin/mail", ""): (CLASSES["admin"], lambda w, c: Form("GET", "/admin/mail")),
    ("GET", "/admin/mail/{name}", ""): (
        CLASSES["admin"],
        lambda w, c: Form("GET", f"/admin/mail/{_kept(w)}"),
    ),
    ("GET", "/claim/{token}", ""): (
        dict.fromkeys(ROLES, OK),
        lambda w, c: Form("GET", f"/claim/{_claim_token(w)}"),
    ),
    ("GET", "/unsubscribe/{token}", ""): (
        dict.fromkeys(ROLES, OK),
        lambda w, c: Form("GET", f"/unsubscribe/{_unsubscribe_token(w)}"),
    ),
    ("POST", "/unsubscribe/{token}", ""): (
        dict.fromkeys(ROLES, OK),
        lambda w, c: Form("POST", f"/unsubscribe/{_unsubscribe_token(w)}", {"List-Unsubscribe": "One-Click"}),
    ),
}


def _hook_enabled(w: World, webhook_id: str) -> Callable[[], bool]:
    def check() -> bool:
        with w.db.read() as s:
            row = s.get(Webhook, webhook_id)
            return row is not None and row.enabled

    return check


def _dash_disable_webhook(w: World, csrf: str) -> Form:
    webhook_id, _ = webhooks.make_webhook(w.db, w.tenant)
    return Form(
        "POST", f"/webhooks/{webhook_id}/disable", {"csrf": csrf}, unchanged=_hook_enabled(w, webhook_id)
    )


def _dash_delete_webhook(w: World, csrf: str) -> Form:
    webhook_id, _ = webhooks.make_webhook(w.db, w.tenant)
    return Form(
        "POST", f"/webhooks/{webhook_id}/delete", {"csrf": csrf}, unchanged=_webhook_there(w, webhook_id)
    )


# Webhooks (api/dashboard/webhook_pages.py): each page and form answers as its API twin does.
DASHBOARD.update(
    {
        ("GET", "/webhooks", ""): (("GET", "/api/v1/webhooks"), lambda w, c: Form("GET", "/webhooks")),
        ("POST", "/webhooks", ""): (
            ("POST", "/api/v1/webhooks"),
            lambda w, c: Form("POST", "/webhooks", {"csrf": c, "url": "https://93.184.215.14/"}),
        ),
        ("GET", "/webhooks/{webhook_id}", ""): (
            ("GET", "/api/v1/webhooks/{webhook_id}/deliveries"),
            lambda w, c: Form("GET", f"/webhooks/{w.webhook}"),
        ),
        ("POST", "/webhooks/{webhook_id}", ""): (
            ("PATCH", "/api/v1/webhooks/{webhook_id}"),
            lambda w, c: Form("POST", f"/webhooks/{w.webhook}", {"csrf": c, "description": "changed"}),
        ),
        ("POST", "/webhooks/{webhook_id}/enable", ""): (
            ("PATCH", "/api/v1/webhooks/{webhook_id}"),
            lambda w, c: Form("POST", f"/webhooks/{w.webhook}/enable", {"csrf": c}),
        ),
        ("POST", "/webhooks/{webhook_id}/disable", ""): (
            ("PATCH", "/api/v1/webhooks/{webhook_id}"),
            _dash_disable_webhook,
        ),
        ("POST", "/webhooks/{webhook_id}/rotate-secret", ""): (
            ("POST", "/api/v1/webhooks/{webhook_id}/rotate-secret"),
            lambda w, c: Form("POST", f"/webhooks/{w.webhook}/rotate-secret", {"csrf": c, "overlap_s": "0"}),
        ),
        ("POST", "/webhooks/{webhook_id}/test", ""): (
            ("POST", "/api/v1/webhooks/{webhook_id}/test"),
            lambda w, c: Form("POST", f"/webhooks/{w.webhook}/test", {"csrf": c}),
        ),
        ("POST", "/webhooks/{webhook_id}/delete", ""): (
            ("DELETE", "/api/v1/webhooks/{webhook_id}"),
            _dash_delete_webhook,
        ),
        ("POST", "/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver", ""): (
            ("POST", "/api/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"),
            lambda w, c: Form(
                "POST", f"/webhooks/{w.webhook}/deliveries/{w.delivery}/redeliver", {"csrf": c}
            ),
        ),
    }
)


# Signing in is checked on its own (it needs an anonymous client): what each key gets.
SIGN_IN = {**dict.fromkeys(ROLES, OK), "suspended": FORBIDDEN, "revoked": SIGNED_OUT}
# Using a claim link needs the form token of the page it opens: tests/tenancy/test_mail.py follows one.
ANONYMOUS_FORMS = {("POST", "/login"), ("POST", "/trial"), ("POST", "/claim/{token}")}


def _kept(w: World) -> str:
    """A message kept as an `.eml` file, as the notifier keeps them without an SMTP server."""
    from scheduler import mail as mail_wire

    msg = mail_wire.compose(
        mail_wire.Outgoing("a@example.org", "A", "kept", "text", "<p>html</p>", None, "k"),
        sender="c@example.org",
    )
    name = f"20260101T000000-{next(w.n):010d}"
    mail_wire.write_eml(msg, get_settings().mail_dir, name)
    return name


def _claim_token(w: World) -> str:
    with w.db.write() as s:
        return claims.create(
            session=s, application_id=w.unique("app"), tenant_id=w.tenant, member_id=w.owner_member
        )


def _unsubscribe_token(w: World) -> str:
    return mail.unsubscribe_token(w.secret, w.owner_member, "session")


def dashboard_routes() -> set[tuple[str, str]]:
    found = set()
    for router in (
        routes.router,
        tenant_pages.router,
        admin_pages.router,
        model_pages.router,
        session_pages.router,
        endpoint_pages.router,
        mail_pages.router,
        webhook_pages.router,
    ):
        for route in router.routes:
            if isinstance(route, APIRoute):
                found |= {(m, route.path) for m in route.methods}
    return found


# No blocking call on the event loop -------------------------------------------------------------------


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def loop_guard(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every database transaction and Redis command started on a running event loop."""
    seen: list[str] = []

    def guarded(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if _on_event_loop() and threading.current_thread() is not threading.main_thread():
                seen.append(name)
            return original(*args, **kwargs)

        return call

    monkeypatch.setattr(Database, "read", guarded("database read", Database.read))
    monkeypatch.setattr(Database, "write", guarded("database write", Database.write))
    monkeypatch.setattr(redis.Redis, "execute_command", guarded("redis command", redis.Redis.execute_command))
    monkeypatch.setattr(
        redis.client.Pipeline, "execute", guarded("redis pipeline", redis.client.Pipeline.execute)
    )
    return seen


# The test ---------------------------------------------------------------------------------------------


@pytest.fixture
def matrix_app(env: dict[str, str], db: Any, runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    # Dozens of trial applications and sign-ins from one test client: lift the per-address limits.
    monkeypatch.setenv("IPUCLOUD_TRIAL_RATE_LIMIT", "100000/minute")
    monkeypatch.setattr(routes, "LOGIN_RATE", "100000/minute")
    reload_settings(runtime)
    from api.app import create_app

    return create_app(runtime=runtime)


def sign_in(app: Any, key: str) -> TestClient:
    client = TestClient(app, raise_server_exceptions=False)
    page = client.get("/login")
    token = FORM_TOKEN.search(page.text)
    assert token, page.text
    r = client.post("/login", data={"api_key": key, "form_token": token.group(1)}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return client


def csrf_of(client: TestClient) -> str:
    record = sessions.read(client.app.state.runtime.redis, client.cookies.get(sessions.COOKIE) or "")
    return record.csrf if record is not None else "no-session"


# slow: every route and dashboard action once per role, in process: some 40 s on a loaded worker.
@pytest.mark.slow
def test_every_route_and_action_answers_by_scope_and_role_alike_on_both_faces(
    matrix_app: Any, db: Any, seeded: Seeded, loop_guard: list[str], tmp_path: Path
) -> None:
    app = matrix_app
    spec_routes = {(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item}
    assert spec_routes == set(API), (
        f"routes without a case in API (add them): {sorted(spec_routes - set(API))}; "
        f"cases without a route: {sorted(set(API) - spec_routes)}"
    )
    missing = dashboard_routes() - {(m, p) for m, p, _ in DASHBOARD} - ANONYMOUS_FORMS
    assert not missing, f"dashboard routes without a case in DASHBOARD (add them): {sorted(missing)}"

    model_file = tmp_path / "mlp.onnx"
    model_file.write_bytes(MODEL)
    w = build_world(db, seeded, model_file)
    browsers = {role: sign_in(app, w.keys[role]) for role in ROLES}  # revoked and suspended: before
    revoke(w)
    w.set_suspended(True)
    api = TestClient(app, raise_server_exceptions=False)
    wrong: list[str] = []
    answers: dict[tuple[tuple[str, str], str], str] = {}

    for route in sorted(API):
        method, _ = route
        for role in ROLES:
            call = API[route][1](w)
            body: dict[str, Any] = {"json": call.json} if method in ("POST", "PATCH", "PUT") else {}
            if call.files is not None:
                body = {"files": call.files}
            r = api.request(method, call.url, headers={"Authorization": f"Bearer {w.keys[role]}"}, **body)
            got, want = api_outcome(r), expected_api(route, role)
            answers[(route, role)] = got
            if got != want:
                wrong.append(f"API {method} {call.url} as {role}: {got}, expected {want} ({r.text[:200]})")
            if got != OK and call.unchanged is not None and not call.unchanged():
                wrong.append(f"API {method} {call.url} as {role}: refused ({got}) but changed its target")

    # Signing out last: every other action needs the session.
    order = sorted(DASHBOARD.items(), key=lambda kv: (kv[0][1] == "/logout", kv[0]))
    for (method, _, action), (twin, prep) in order:
        for role in ROLES:
            if role == "suspended":
                # A suspended tenant's session ends on its first request: sign in afresh each time.
                w.set_suspended(False)
                browsers[role] = sign_in(app, w.keys[role])
                w.set_suspended(True)
            browser = browsers[role]
            form = prep(w, csrf_of(browser))
            r = browser.request(
                form.method,
                form.url,
                data=form.data,
                headers=form.headers,
                files=form.files,
                follow_redirects=False,
            )
            got = dash_outcome(r)
            want = twin[role] if isinstance(twin, dict) else answers[(twin, role)]
            name = f"{method} {form.url}" + (f" ({action})" if action else "")
            if got != want:
                face = "" if isinstance(twin, dict) else f" as its API twin {twin[0]} {twin[1]} does"
                wrong.append(f"dashboard {name} as {role}: {got}, expected {want}{face} ({r.text[:200]})")
            if got != OK and form.unchanged is not None and not form.unchanged():
                wrong.append(f"dashboard {name} as {role}: refused ({got}) but changed its target")

    # The forms shown before sign-in: signing in with each key, and the trial application (open to all).
    for role in ROLES:
        anonymous = TestClient(app, raise_server_exceptions=False)
        token = FORM_TOKEN.search(anonymous.get("/login").text).group(1)  # type: ignore[union-attr]
        r = anonymous.post(
            "/login", data={"api_key": w.keys[role], "form_token": token}, follow_redirects=False
        )
        if dash_outcome(r) != SIGN_IN[role]:
            wrong.append(f"dashboard POST /login as {role}: {dash_outcome(r)}, expected {SIGN_IN[role]}")
        token = FORM_TOKEN.search(anonymous.get("/trial").text).group(1)  # type: ignore[union-attr]
        application = {
            "name": "Ada",
            "email": f"{w.unique('dash')}@example.org",
            "organisation": "Engines",
            "category": "individual",
            "intended_use": "Training BERT on IPUs",
            "form_token": token,
        }
        r = anonymous.post("/trial", data=application)
        if r.status_code != 200 or "application app_" not in r.text:
            wrong.append(f"dashboard POST /trial: {r.status_code} {r.text[:200]}")

    assert not wrong, "\n".join(wrong)
    assert not loop_guard, f"blocking calls on the event loop: {sorted(set(loop_guard))}"
