"""Hostile input, everywhere: every form field, query parameter, path segment, header and JSON field
the API and the dashboard read gets values no field accepts, and each answer must be a 4xx saying
why (a problem on the API, an error page or the form again on the dashboard), never a 500, and
must change nothing.

The values (Hypothesis draws them): Unicode digits that `str.isdigit` takes and `int` refuses
(`²`, `①`, `١٢`), blanks that are not spaces (no-break, ideographic), control, bidirectional and
line-separator characters, huge and very negative numbers, out-of-range and malformed dates, and
strings longer than any field allows. The API's fields are read from its OpenAPI spec, so a new
route or field is attacked without touching this file (a new operation needs a baseline below).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, select

from api.dashboard import routes, sessions
from scheduler.db import _BEGIN_OPTION
from scheduler.endpointspec import EndpointSpec
from scheduler.jobspec import JobSpec, SessionSpec
from scheduler.models import Base
from scheduler.services import endpoints as endpoint_service
from scheduler.services import own_models
from scheduler.services import sessions as session_service
from scheduler.services.batch import arrays, jobs
from scheduler.services.capacity import partitions
from scheduler.services.tenancy import keys, tenants, trials
from scheduler.services.tenancy.scope import OneTenant
from scheduler.settings import get_settings
from tests.support import onnx_files, webhooks
from tests.support.services import Seeded, reload_settings

pytestmark = [pytest.mark.slow]

MODEL_FILE = ("m.onnx", onnx_files.mlp(hidden=32, layers=2, features=16), "application/octet-stream")

# Hostile values ---------------------------------------------------------------------------------------

HIDDEN = ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\u061c", "\u200b", "\u200e", "\u2028", "\u2029",
          "\u202a", "\u202e", "\u2066", "\u2069", "\ufeff"]  # fmt: skip
BLANKS = [" ", "\xa0", "\u1680", "\u2007", "\u202f", "\u3000"]
# Nothing visible at all (issue 32 item 2): fillers, a lone combining mark, selectors, tag characters.
INVISIBLE = ["\u3164", "\u2800", "\u034f", "\ufe0f", "\u0301", "\U000e0041\U000e0042", "\uffa0\u115f"]
UNICODE_DIGITS = ["²", "①", "⁴", "١٢", "１２", "߂", "৩", "𝟗", "٣٠٠"]
BAD_DATES = [
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-05:00",
    "1969-12-31T23:59:59Z",
    "3000-01-01T00:00:00Z",
    "２０２６-01-01T00:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-02-30T00:00:00Z",
    "99999-01-01T00:00:00Z",
]


def _with_hidden() -> st.SearchStrategy[str]:
    base = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12)
    return st.tuples(base, st.sampled_from(HIDDEN), st.integers(0, 12)).map(
        lambda t: t[0][: t[2]] + t[1] + t[0][t[2] :]
    )


TEXT = st.one_of(
    _with_hidden(),
    st.lists(st.sampled_from(BLANKS), min_size=1, max_size=4).map("".join).filter(lambda v: v.strip(" ")),
    st.sampled_from(INVISIBLE),
    st.integers(6_000, 20_000).map(lambda n: "a" * n),
)
NUMBER_TEXT = st.one_of(
    TEXT,
    st.sampled_from(UNICODE_DIGITS),
    st.integers(10**19, 10**40).map(str),
    st.integers(-(10**40), -(10**12)).map(str),
    st.sampled_from(["nan", "inf", "1e400", "0x10", "1,5", "1.5.0", "--1"]),
)
WHOLE_TEXT = st.one_of(NUMBER_TEXT, st.sampled_from(["1.5", "0.25"]))
DATE_TEXT = st.one_of(TEXT, st.sampled_from(BAD_DATES))
JSON_NUMBER = st.one_of(
    st.integers(10**19, 10**40),
    st.integers(-(10**40), -(10**12)),
    st.booleans(),
    st.sampled_from([1e300, -1e300]),
    NUMBER_TEXT,
)


def strategy(kind: str, json: bool) -> st.SearchStrategy[Any]:
    if kind in ("int", "float"):
        if json:
            return JSON_NUMBER if kind == "float" else st.one_of(JSON_NUMBER, st.just(1.5))
        return WHOLE_TEXT if kind == "int" else NUMBER_TEXT
    if kind == "date":
        return st.one_of(DATE_TEXT, JSON_NUMBER) if json else DATE_TEXT
    if kind == "list":
        return st.lists(TEXT, min_size=1, max_size=2)
    return st.one_of(TEXT, st.integers(10**19, 10**40)) if json else TEXT


# Where values go ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    face: str  # api | dashboard
    who: str  # owner | admin | anonymous
    method: str
    path: str
    where: str  # path | query | header | body | workload | form | cookie
    name: str
    kind: str  # text | int | float | date | list | token

    def __str__(self) -> str:
        return f"{self.face} {self.method} {self.path} {self.where} {self.name!r}"


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    return _resolve(spec, options[0]) if len(options) == 1 and "properties" not in schema else schema


def _kind(spec: dict[str, Any], schema: dict[str, Any]) -> str:
    schema = _resolve(spec, schema)
    types = {s.get("type") for s in schema.get("anyOf", [schema])}
    if "enum" in schema or "const" in schema or "boolean" in types:
        return "token"
    if "integer" in types:
        return "int"
    if "number" in types:
        return "float"
    if "array" in types:
        return "list"
    if schema.get("format") == "date-time" or str(schema.get("pattern", "")).startswith("^(19"):
        return "date"
    return "text"


def api_fields(spec: dict[str, Any]) -> list[Field]:
    out = []
    for path, item in spec["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, op in item.items():
            who = (
                "admin" if path.startswith("/api/v1/admin/") else "anonymous" if "trials" in path else "owner"
            )
            for p in op.get("parameters", []):
                kind = "token" if p["in"] == "path" else _kind(spec, p["schema"])
                out.append(Field("api", who, method.upper(), path, p["in"], p["name"], kind))
            content = op.get("requestBody", {}).get("content", {})
            upload = content.get("multipart/form-data", {}).get("schema")
            for name, prop in (upload or {}).get("properties", {}).items():
                if name != "file":  # the file itself: tests/tenancy/test_models.py and its kin
                    out.append(Field("api", who, method.upper(), path, "multipart", name, _kind(spec, prop)))
            body = content.get("application/json", {}).get("schema")
            if body is None:
                continue
            for name, prop in _resolve(spec, body).get("properties", {}).items():
                if name == "workload":
                    for wname, wprop in _resolve(spec, prop)["properties"].items():
                        out.append(
                            Field("api", who, method.upper(), path, "workload", wname, _kind(spec, wprop))
                        )
                else:
                    out.append(Field("api", who, method.upper(), path, "body", name, _kind(spec, prop)))
    # Authorization, read by every route that needs a key (one reader for all of them).
    for method, path in (("GET", "/api/v1/jobs"), ("POST", "/api/v1/jobs"), ("GET", "/api/v1/admin/fleet")):
        who = "admin" if "admin" in path else "owner"
        out.append(Field("api", who, method, path, "header", "Authorization", "text"))
    return out


JOB_FORM = {
    "model": "resnet50",
    "task": "train",
    "batch_size": "64",
    "steps": "20",
    "ipus": "4",
    "precision": "fp16",
}
JOB_FORM_FIELDS = {
    "name": "text",
    "model": "text",
    "task": "token",
    "batch_size": "int",
    "seq_len": "int",
    "precision": "token",
    "steps": "int",
    "samples": "int",
    "ipus": "int",
    "machine": "token",
    "max_runtime_s": "int",
    "idempotency": "token",
    "action": "token",
    "csrf": "token",
}


def dashboard_fields() -> list[Field]:
    def many(who: str, method: str, path: str, where: str, kinds: dict[str, str]) -> list[Field]:
        return [Field("dashboard", who, method, path, where, name, kind) for name, kind in kinds.items()]

    owner, admin = "owner", "admin"
    out = [
        *many(owner, "POST", "/jobs/new", "form", JOB_FORM_FIELDS),
        *many(
            owner,
            "POST",
            "/jobs/estimate",
            "form",
            {k: v for k, v in JOB_FORM_FIELDS.items() if k not in ("csrf", "idempotency", "action")},
        ),
        Field("dashboard", owner, "POST", "/jobs/estimate", "header", "X-CSRF-Token", "token"),
        *many(owner, "GET", "/jobs", "query", {"state": "token", "after": "token"}),
        *many(owner, "GET", "/arrays/{array_id}", "query", {"sort": "token", "order": "token", "x": "token"}),
        Field("dashboard", owner, "GET", "/arrays/{array_id}", "path", "array_id", "token"),
        Field("dashboard", owner, "POST", "/arrays/{array_id}/retry", "form", "csrf", "token"),
        Field("dashboard", owner, "GET", "/jobs/{job_id}", "path", "job_id", "token"),
        Field("dashboard", owner, "GET", "/jobs/{job_id}/events", "query", "after", "int"),
        Field("dashboard", owner, "GET", "/jobs/{job_id}/events", "header", "Last-Event-ID", "int"),
        Field("dashboard", owner, "POST", "/jobs/{job_id}/cancel", "path", "job_id", "token"),
        Field("dashboard", owner, "POST", "/jobs/{job_id}/cancel", "form", "csrf", "token"),
        Field("dashboard", owner, "POST", "/logout", "form", "csrf", "token"),
        Field("dashboard", "anonymous", "GET", "/jobs", "cookie", sessions.COOKIE, "token"),
        *many("anonymous", "POST", "/login", "form", {"api_key": "text", "form_token": "token"}),
        *many(
            "anonymous",
            "POST",
            "/trial",
            "form",
            {
                "name": "text",
                "email": "text",
                "organisation": "text",
                "category": "token",
                "intended_use": "text",
                "form_token": "token",
            },
        ),
        *many(admin, "GET", "/admin/fleet", "query", {"machine": "token", "pod_from": "int"}),
        Field("dashboard", admin, "GET", "/admin/trials", "query", "status", "token"),
        Field("dashboard", admin, "GET", "/admin/tenants/{tenant_id}", "path", "tenant_id", "token"),
        *many(
            admin,
            "POST",
            "/admin/machines/{machine_id}/{action}",
            "path",
            {"machine_id": "token", "action": "token"},
        ),
        *many(
            admin,
            "POST",
            "/admin/machines/{machine_id}/{action}",
            "form",
            {"reason": "text", "csrf": "token"},
        ),
        *many(
            admin,
            "POST",
            "/admin/partitions",
            "form",
            {"id": "text", "size": "int", "machine_type": "token", "tenant": "token", "gcds": "int"},
        ),
        *many(
            admin, "POST", "/admin/partitions/{name}/{action}", "path", {"name": "token", "action": "token"}
        ),
        *many(
            admin,
            "POST",
            "/admin/tenants",
            "form",
            {"name": "text", "plan": "token", "quota_ipu_hours": "float", "owner_email": "text"},
        ),
        *many(
            admin,
            "POST",
            "/admin/tenants/{tenant_id}",
            "form",
            {"plan": "token", "quota_ipu_hours": "float", "status": "token", "expires_at": "date"},
        ),
        Field("dashboard", admin, "POST", "/admin/tenants/{tenant_id}/keys", "form", "name", "text"),
        Field(
            "dashboard",
            admin,
            "POST",
            "/admin/tenants/{tenant_id}/keys/{key_id}/revoke",
            "path",
            "key_id",
            "token",
        ),
        *many(
            admin,
            "POST",
            "/admin/plans/{name}",
            "form",
            {
                "quota_ipu_hours": "float",
                "trial_days": "int",
                "max_partition_size": "int",
                "max_concurrent_jobs": "int",
                "max_queued_jobs": "int",
            },
        ),
        Field("dashboard", admin, "POST", "/admin/plans/{name}", "path", "name", "token"),
        Field("dashboard", admin, "POST", "/admin/trials/{application_id}/approve", "form", "plan", "token"),
        Field("dashboard", admin, "POST", "/admin/trials/{application_id}/reject", "form", "reason", "text"),
        *many(
            owner,
            "POST",
            "/models/upload",
            "form",
            {"name": "text", "dims": "text", "elementwise": "text", "csrf": "token"},
        ),
        Field("dashboard", owner, "GET", "/models/{model}", "path", "model", "token"),
        *many(
            admin,
            "POST",
            "/admin/fleet/racks",
            "form",
            {"machine_type": "token", "layout": "token", "pods": "int"},
        ),
        *many(admin, "POST", "/admin/fleet/servers", "form", {"model": "token", "count": "int"}),
        *many(
            admin,
            "POST",
            "/admin/fleet/racks/{rack_id}/{action}",
            "path",
            {"rack_id": "token", "action": "token"},
        ),
        Field("dashboard", admin, "POST", "/admin/fleet/units/{unit_id}/retire", "path", "unit_id", "token"),
        Field("dashboard", owner, "POST", "/models/{model}/delete", "path", "model", "token"),
        Field("dashboard", owner, "POST", "/models/{model}/delete", "form", "csrf", "token"),
        *many(
            owner, "POST", "/settings/notifications", "form", {"budget_thresholds": "text", "csrf": "token"}
        ),
        Field("dashboard", "anonymous", "GET", "/claim/{token}", "path", "token", "token"),
        Field("dashboard", "anonymous", "POST", "/claim/{token}", "path", "token", "token"),
        Field("dashboard", "anonymous", "GET", "/unsubscribe/{token}", "path", "token", "token"),
        Field("dashboard", "anonymous", "POST", "/unsubscribe/{token}", "path", "token", "token"),
        Field("dashboard", admin, "GET", "/admin/mail/{name}", "path", "name", "token"),
        # The webhook pages (api/dashboard/webhook_pages.py) validate with the API's own bodies.
        *many(owner, "POST", "/webhooks", "form", {"url": "text", "description": "text", "csrf": "token"}),
        Field("dashboard", owner, "GET", "/webhooks/{webhook_id}", "path", "webhook_id", "token"),
        *many(owner, "GET", "/webhooks/{webhook_id}", "query", {"status": "token", "before": "int"}),
        *many(owner, "POST", "/webhooks/{webhook_id}", "form", {"url": "text", "description": "text"}),
        Field("dashboard", owner, "POST", "/webhooks/{webhook_id}/disable", "path", "webhook_id", "token"),
        Field("dashboard", owner, "POST", "/webhooks/{webhook_id}/rotate-secret", "form", "overlap_s", "int"),
        Field("dashboard", owner, "POST", "/webhooks/{webhook_id}/test", "form", "csrf", "token"),
        Field(
            "dashboard",
            owner,
            "POST",
            "/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver",
            "path",
            "delivery_id",
            "int",
        ),
    ]
    return out


# The world and the baselines each hostile value is put into ----------------------------------------


@dataclass
class World:
    app: Any
    owner_key: str
    admin_key: str
    paths: dict[str, str]
    browsers: dict[str, TestClient]


TRIAL = {
    "name": "Ada",
    "email": "hostile@example.org",
    "organisation": "Engines",
    "category": "individual",
    "intended_use": "Training BERT on IPUs",
}
JOB = {"name": "h", "workload": {"model": "resnet50", "batch_size": 64, "steps": 20}, "ipus": 4}

# A valid body per operation: each hostile value replaces one of its fields.
API_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/api/v1/jobs"): JOB,
    ("POST", "/api/v1/sessions"): {"ipus": 1},
    ("PATCH", "/api/v1/arrays/{array_id}"): {"max_running": 2},
    ("POST", "/api/v1/arrays/{array_id}/cancel"): {"indices": "3"},
    ("POST", "/api/v1/arrays/{array_id}/retry"): {"indices": "failed"},
    ("PATCH", "/api/v1/sessions/{session_id}"): {"idle_timeout_s": 600},
    ("POST", "/api/v1/endpoints"): {
        "name": "h",
        "model": "resnet50",
        "replicas": {"min": 0, "max": 1},
        "batching": {"max_batch_size": 4, "max_wait_ms": 1},
    },
    ("PATCH", "/api/v1/endpoints/{endpoint_id}"): {"max_queue": 10, "replicas": {"min": 0, "max": 1}},
    ("POST", "/api/v1/estimates"): {"workload": JOB["workload"], "ipus": 4},
    ("POST", "/api/v1/keys"): {"name": "k"},
    # A public address given as such: accepted without a DNS look-up; nothing is sent to it here.
    ("POST", "/api/v1/webhooks"): {"url": "https://93.184.215.14/"},
    ("PATCH", "/api/v1/webhooks/{webhook_id}"): {"description": "d"},
    ("POST", "/api/v1/webhooks/{webhook_id}/rotate-secret"): {"overlap_s": 60},
    ("PUT", "/api/v1/notification-settings"): {"budget_thresholds": [50], "session_mail": True},
    ("POST", "/api/v1/trials"): TRIAL,
    ("POST", "/api/v1/admin/machines/{machine_id}/drain"): {"reason": "fan"},
    ("POST", "/api/v1/admin/machines/{machine_id}/fail"): {"reason": "fan"},
    ("POST", "/api/v1/admin/machines/{machine_id}/restore"): {"reason": "fan"},
    ("POST", "/api/v1/admin/partitions"): {"id": "hp", "size": 1},
    ("POST", "/api/v1/admin/fleet/racks"): {"machine_type": "m2000", "layout": "pod16", "pods": 1},
    ("POST", "/api/v1/admin/fleet/servers"): {"model": "dss8440", "count": 1},
    ("POST", "/api/v1/admin/fleet/racks/{rack_id}/drain"): {"reason": "moving"},
    ("POST", "/api/v1/admin/fleet/racks/{rack_id}/restore"): {"reason": "moved"},
    ("POST", "/api/v1/admin/partitions/{partition_id}/reset"): {"gcds": 1},
    ("POST", "/api/v1/admin/tenants"): {"name": "hostile"},
    ("PATCH", "/api/v1/admin/tenants/{tenant_id}"): {"fairshare_weight": 2.0},
    ("POST", "/api/v1/admin/tenants/{tenant_id}/members"): {"email": "h@x.org", "name": "H"},
    ("PATCH", "/api/v1/admin/tenants/{tenant_id}/members/{member_id}"): {"name": "H"},
    ("POST", "/api/v1/admin/tenants/{tenant_id}/keys"): {"name": "k"},
    ("PATCH", "/api/v1/admin/plans/{name}"): {"description": "d"},
    ("POST", "/api/v1/admin/trials/{application_id}/approve"): {"plan": "trial"},
    ("POST", "/api/v1/admin/trials/{application_id}/reject"): {"reason": "no"},
}
DASHBOARD_FORMS: dict[tuple[str, str], dict[str, str]] = {
    ("POST", "/jobs/new"): {**JOB_FORM, "action": "submit", "idempotency": "abc"},
    ("POST", "/jobs/estimate"): JOB_FORM,
    ("POST", "/login"): {"api_key": "", "next": "/"},
    ("POST", "/trial"): TRIAL,
    ("POST", "/admin/partitions"): {"id": "hp", "size": "1", "gcds": "1"},
    ("POST", "/admin/fleet/racks"): {"machine_type": "m2000", "layout": "pod16", "pods": "1"},
    ("POST", "/admin/fleet/servers"): {"model": "dss8440", "count": "1"},
    ("POST", "/admin/tenants"): {"name": "hostile", "plan": "trial"},
    ("POST", "/admin/trials/{application_id}/reject"): {"reason": "no"},
    ("POST", "/sessions/{session_id}/extend"): {"add_s": "60"},
    ("POST", "/webhooks"): {"url": "https://93.184.215.14/", "event:job.failed": "on"},
    ("POST", "/webhooks/{webhook_id}"): {"url": "https://93.184.215.14/", "description": "d"},
    ("POST", "/webhooks/{webhook_id}/rotate-secret"): {"overlap_s": "60"},
}


def build_world(app: Any, db: Any, seeded: Seeded) -> World:
    secret = get_settings().secret()
    with db.write() as s:
        alpha = tenants.create_tenant(session=s, secret=secret, name="alpha", plan="standard")
        tid = alpha.tenant.id
        member = tenants.add_member(session=s, tenant_id=tid, email="mia@x.org", name="Mia", role="member")
        key_row, _ = keys.create_key(session=s, secret=secret, tenant_id=tid, name="m", member_id=member.id)
        partitions.create_partition(session=s, name="kept", size=1, machine_type=None, tenant_id=None)
        application = trials.submit_application(
            session=s,
            name="Bo",
            email="bo@example.org",
            organisation="B",
            category="individual",
            intended_use="Training BERT on IPUs",
        )
        job = jobs.submit_job(session=s, tenant_id=tid, spec=JobSpec.model_validate(JOB)).job
        ended = jobs.submit_job(session=s, tenant_id=tid, spec=JobSpec.model_validate(JOB)).job
        jobs.request_cancel(session=s, job_id=ended.id, scope=OneTenant(tid))
        array = arrays.submit_array(
            session=s, tenant_id=tid, spec=JobSpec.model_validate({**JOB, "array": {"indices": "0-3"}})
        ).array
        analysed = own_models.analyse(data=MODEL_FILE[1], dims={}, elementwise=(), max_graph_bytes=10**8)
        model = own_models.create_model(session=s, tenant_id=tid, name="kept-model", analysed=analysed)
        held = session_service.start_session(
            session=s, tenant_id=tid, spec=SessionSpec.model_validate({"ipus": 1})
        )
        served = endpoint_service.create_endpoint(
            session=s,
            tenant_id=tid,
            spec=EndpointSpec.model_validate(
                {"name": "kept-ep", "model": "resnet50", "replicas": {"min": 0, "max": 1}}
            ),
        )
    webhook_id, delivery_id = webhooks.make_webhook(db, tid)
    paths = {
        "array_id": array.id,
        "webhook_id": webhook_id,
        "delivery_id": str(delivery_id),
        "endpoint_id": served.id,
        "endpoint_name": served.name,
        "version": "1",
        "session_id": held.id,
        "job_id": job.id,
        "ended_job_id": ended.id,
        "key_id": key_row.id,
        "tenant_id": tid,
        "member_id": member.id,
        "name": "standard",
        "application_id": application.id,
        "partition_id": "kept",
        "machine_id": "pod0001-m15",
        "action": "drain",
        "model": model.id,
        "rack_id": "rack0000",
        "unit_id": "pod0000",
    }
    world = World(app, alpha.api_key, seeded.admin_key, paths, {})
    for who, key in (("owner", alpha.api_key), ("admin", seeded.admin_key)):
        browser = TestClient(app, raise_server_exceptions=False)
        page = browser.get("/login")
        token = re.search(r'name="form_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        signed = browser.post("/login", data={"api_key": key, "form_token": token}, follow_redirects=False)
        assert signed.status_code == 303, signed.text
        world.browsers[who] = browser
    return world


def fill(path: str, values: dict[str, str], field: Field, hostile: Any) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if field.where == "path" and name == field.name:
            return quote(str(hostile), safe="")
        if name == "partition_id" and field.method == "DELETE":
            return values["partition_id"]
        if name == "name" and path.startswith("/admin/partitions"):
            return values["partition_id"]
        if name == "action" and path.startswith("/admin/partitions"):
            return "reset"
        if name == "job_id" and path.endswith("/events"):
            return values["ended_job_id"]
        if name == "model" and "/v2/" in path:  # a v2 route's model is the endpoint's name
            return values["endpoint_name"]
        return values[name]

    return re.sub(r"\{(\w+)\}", one, path)


def send(w: World, field: Field, hostile: Any) -> Any:
    url = fill(field.path, w.paths, field, hostile)
    headers: dict[str, Any] = {}
    params: dict[str, Any] = {}
    if field.face == "api":
        client = TestClient(w.app, raise_server_exceptions=False)
        key = {"owner": w.owner_key, "admin": w.admin_key}.get(field.who)
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        body = copy.deepcopy(API_BODIES.get((field.method, field.path)))
        if field.where == "body":
            body = {**(body or {}), field.name: hostile}
        elif field.where == "workload":
            body = {**(body or {}), "workload": {**body["workload"], field.name: hostile}}  # type: ignore[index]
        elif field.where == "query":
            params[field.name] = hostile
        elif field.where == "header":
            headers[field.name] = str(hostile).encode()
        elif field.where == "multipart":
            form = {"name": "hostile-model", field.name: str(hostile)}
            return client.request(field.method, url, headers=headers, data=form, files={"file": MODEL_FILE})
        content = None if body is None else json.dumps(body).encode()  # numbers past 64 bits too
        if content is not None:
            headers["Content-Type"] = "application/json"
        return client.request(field.method, url, params=params, headers=headers, content=content)

    client = w.browsers.get(field.who) or TestClient(w.app, raise_server_exceptions=False)
    form: dict[str, Any] | None = None
    if field.method == "POST":
        form = dict(DASHBOARD_FORMS.get((field.method, field.path), {}))
        if field.who == "anonymous":
            page = client.get("/login")
            form["form_token"] = re.search(r'name="form_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        else:
            record = sessions.read(client.app.state.runtime.redis, client.cookies.get(sessions.COOKIE) or "")
            assert record is not None, "the test's session ended"
            form["csrf"] = record.csrf
            headers["X-CSRF-Token"] = record.csrf
    files = None
    if field.where == "form":
        form = {**(form or {}), field.name: str(hostile)}
        if field.path == "/models/upload":
            files = {"file": MODEL_FILE}
            form.setdefault("name", "hostile-model")
    elif field.where == "query":
        params[field.name] = str(hostile)
    elif field.where == "header":
        headers[field.name] = str(hostile).encode()
    elif field.where == "cookie":
        headers["Cookie"] = f"{field.name}={quote(str(hostile), safe='')}"
    return client.request(
        field.method, url, params=params, headers=headers, data=form, files=files, follow_redirects=False
    )


def refused(field: Field, r: Any) -> str | None:
    """None if `r` is a 4xx that says why; else what is wrong with it."""
    if field.where == "cookie" and r.status_code == 303 and r.headers["location"].startswith("/login"):
        return None  # a session cookie that is not one: signed out, as with no cookie at all
    if not 400 <= r.status_code < 500:
        return f"HTTP {r.status_code}"
    kind = r.headers.get("content-type", "")
    if field.face == "api":
        if not kind.startswith("application/problem+json"):
            return f"HTTP {r.status_code} without a problem body ({kind})"
        body = r.json()
        if body.get("status") != r.status_code or not body.get("detail"):
            return f"not a problem: {body}"
    elif kind.startswith("application/problem+json"):
        return None  # no dashboard route has that path (a `/` in a segment): the site-wide 404
    elif not kind.startswith("text/html") or not r.text.strip():
        return f"HTTP {r.status_code} without a page saying why ({kind})"  # the estimate panel is a fragment
    return None


VOLATILE = {("api_keys", "last_used_at")}


@functools.cache
def _table_queries(dialect: Any) -> list[tuple[str, str]]:
    """Each table's query, as the database's own SQL: compiled once, since the sweep reads every
    table after every field (some 1,300 times), and building the statements was most of its CPU."""
    queries = []
    for table in Base.metadata.sorted_tables:
        cols = [c for c in table.columns if (table.name, c.name) not in VOLATILE]
        query = select(*cols).order_by(*table.primary_key.columns)
        queries.append((table.name, str(query.compile(dialect=dialect))))
    return queries


def fingerprint(conn: Connection) -> dict[str, str]:
    """A digest of every table (its rows as the driver returns them), less what reading changes (a
    key's last use, to the minute): one read transaction, begun afresh so it sees every commit."""
    out = {}
    with conn.begin():
        # The driver's own cursor: SQLAlchemy's result wrapping was a fifth of the sweep's fingerprinting.
        cursor = conn.connection.cursor()
        try:
            for name, sql in _table_queries(conn.dialect):
                cursor.execute(sql)
                rows = cursor.fetchall()
                out[name] = hashlib.sha256(repr([tuple(r) for r in rows]).encode()).hexdigest()
        finally:
            cursor.close()
    return out


@pytest.fixture
def reader(db: Any) -> Iterator[Connection]:
    """One connection for the test's fingerprints. The SQLite engine pools none (NullPool), so each
    fingerprint would otherwise connect and set its pragmas anew, some 1,300 times a sweep. Its
    transactions begin DEFERRED, as `db.read()`'s do, so a fingerprint takes no write lock."""
    with db.engine.connect() as conn:
        yield conn.execution_options(**({_BEGIN_OPTION: "DEFERRED"} if db.sqlite else {}))


@pytest.fixture
def hostile_app(env: dict[str, str], db: Any, runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    # Every refusal must be the field's, not a per-address limit's.
    monkeypatch.setenv("IPUCLOUD_TRIAL_RATE_LIMIT", "100000/minute")
    monkeypatch.setattr(routes, "LOGIN_RATE", "100000/minute")
    reload_settings(runtime)
    from api.app import create_app

    return create_app(runtime=runtime)


FIELDS: list[Field] = []


@pytest.fixture
def world(hostile_app: Any, db: Any, seeded: Seeded) -> World:
    FIELDS[:] = api_fields(hostile_app.openapi()) + dashboard_fields()
    missing = {
        (f.method, f.path)
        for f in FIELDS
        if f.face == "api" and f.where in ("body", "workload") and (f.method, f.path) not in API_BODIES
    }
    assert not missing, f"give these operations a valid body in API_BODIES: {sorted(missing)}"
    return build_world(hostile_app, db, seeded)


def test_the_attack_surface_is_all_there(world: World) -> None:
    """Every field the issue names is among those attacked (a spec change that hid them fails here)."""
    names = {(f.face, f.where, f.name) for f in FIELDS}
    for wanted in [
        ("api", "header", "Last-Event-ID"),
        ("api", "header", "Idempotency-Key"),
        ("api", "workload", "steps"),
        ("api", "body", "expires_at"),
        ("api", "query", "since"),
        ("api", "body", "intended_use"),
        ("dashboard", "form", "steps"),
        ("dashboard", "form", "expires_at"),
        ("dashboard", "header", "Last-Event-ID"),
        ("dashboard", "form", "max_partition_size"),
    ]:
        assert wanted in names, wanted
    assert len(FIELDS) > 150


# Each example attacks every field once, and a failure names its field and value: shrinking would
# replay hundreds of requests per step for nothing, so it is left out.
@settings(
    max_examples=8,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_hostile_values_get_a_4xx_and_change_nothing(
    world: World, reader: Connection, data: st.DataObject
) -> None:
    before = fingerprint(reader)
    for field in FIELDS:
        in_json = field.face == "api" and field.where in ("body", "workload")
        hostile = data.draw(strategy(field.kind, in_json), label=str(field))
        r = send(world, field, hostile)
        problem = refused(field, r)
        assert problem is None, f"{field} = {hostile!r:.80}: {problem}: {r.text[:300]}"
        after = fingerprint(reader)
        changed = sorted(t for t in after if after[t] != before[t])
        assert not changed, f"{field} = {hostile!r:.80} was refused ({r.status_code}) but changed {changed}"


def test_a_nul_in_any_field_is_a_4xx_and_changes_nothing(world: World, reader: Connection) -> None:
    """Every field once with a NUL inside: PostgreSQL refuses NUL in any text it is given, so a field
    with no stricter rule of its own would reach it and fail there (a 500) unless the edge refuses it."""
    before = fingerprint(reader)
    for field in FIELDS:
        r = send(world, field, "a\x00b")
        problem = refused(field, r)
        assert problem is None, f"{field} = 'a\\x00b': {problem}: {r.text[:300]}"
    assert fingerprint(reader) == before
