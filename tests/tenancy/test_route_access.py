"""Every route of the API, as nobody, as a bad/revoked/expired key, as the wrong tenant and as admin.

The routes are read from the app's OpenAPI spec, so a route added later is covered without touching this
file; a new path parameter needs a sample value in `samples()` (the test says so).
"""

from __future__ import annotations

import re
from typing import Any

from api.app import create_app
from scheduler.endpointspec import EndpointSpec
from scheduler.jobspec import JobSpec, SessionSpec
from scheduler.models import ApiKey, Job
from scheduler.services import endpoints, own_models, sessions
from scheduler.services.batch import arrays
from scheduler.services.tenancy import keys, trials
from scheduler.settings import Settings
from tests.support import onnx_files, webhooks
from tests.tenancy.conftest import World, assert_problem, auth

PUBLIC = {("POST", "/api/v1/trials")}

# From the app's OpenAPI spec: what clients are told exists is what must be guarded.
ROUTES = sorted(
    (method.upper(), path)
    for path, item in create_app(Settings()).openapi()["paths"].items()
    if path.startswith("/api/")
    for method in item
)


def samples(world: World, db: Any) -> dict[str, str]:
    """A value for every path parameter: tenant A's objects where the route is a tenant's."""
    with db.write() as s:
        application = trials.submit_application(
            session=s,
            name="Ada",
            email="ada@example.org",
            organisation="Analytical Engines",
            category="business",
            intended_use="Training BERT on IPUs",
        )
        analysed = own_models.analyse(data=onnx_files.mlp(), dims={}, elementwise=(), max_graph_bytes=2**20)
        model = own_models.create_model(session=s, tenant_id=world.a.id, name="mlp", analysed=analysed)
        held = sessions.start_session(
            session=s, tenant_id=world.a.id, spec=SessionSpec.model_validate({"ipus": 1})
        )
        served = endpoints.create_endpoint(
            session=s,
            tenant_id=world.a.id,
            spec=EndpointSpec.model_validate(
                {"name": "served", "model": "resnet50", "replicas": {"min": 0, "max": 1}}
            ),
        )
    webhook_id, delivery_id = webhooks.make_webhook(db, world.a.id)
    with db.write() as s:
        array = arrays.submit_array(
            session=s,
            tenant_id=world.a.id,
            spec=JobSpec.model_validate(
                {
                    "name": "sampled",
                    "workload": {"model": "resnet50", "steps": 10},
                    "ipus": 1,
                    "array": {"indices": "0-1"},
                }
            ),
        ).array
    return {
        "array_id": array.id,
        "endpoint_id": served.id,
        "endpoint_name": served.name,
        "version": "1",
        "session_id": held.id,
        "job_id": world.a.job_id,
        "key_id": world.a.member_key_id,
        "tenant_id": world.a.id,
        "member_id": world.a.member_id,
        "name": "trial",
        "application_id": application.id,
        "partition_id": "no-such-partition",
        "machine_id": "pod0000-m00",
        # Racks and units the world's fleet does not have: the admin's calls must not retire it.
        "rack_id": "rack0099",
        "unit_id": "srv0099",
        "model": model.id,
        "webhook_id": webhook_id,
        "delivery_id": str(delivery_id),
    }


def fill(path: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "model" and "/v2/" in path:  # a v2 route's model is the endpoint's name
            name = "endpoint_name"
        assert name in values, f"add a sample value for path parameter {{{name}}} to samples() in {__file__}"
        return values[name]

    return re.sub(r"\{(\w+)\}", one, path)


def call(client: Any, method: str, url: str, key: str | None) -> Any:
    headers = auth(key) if key else {}
    body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    return client.request(method, url, headers=headers, **body)


def a_objects_unchanged(db: Any, world: World) -> None:
    with db.read() as s:
        job = s.get(Job, world.a.job_id)
        assert job.state == "queued" and not job.cancel_requested
        assert s.get(ApiKey, world.a.member_key_id).revoked_at is None


def test_routes_are_found() -> None:
    assert len(ROUTES) >= 30
    assert ("GET", "/api/v1/admin/trials") in ROUTES and ("DELETE", "/api/v1/keys/{key_id}") in ROUTES


def test_every_route_guards_its_data(client: Any, world: World, db: Any, subtests: Any) -> None:
    """One world for all routes (a subtest each): first every refusal, then the calls that succeed.

    Refusals change nothing, so they share the world; the successful calls (which cancel, revoke,
    remove) come after all of them, the tenant's before the admin's.
    """
    values = samples(world, db)
    unknown, _ = keys.generate_key()
    typo = world.a.owner_key[:-1] + ("A" if world.a.owner_key[-1] != "A" else "B")
    bad_keys = (None, "not-a-key", unknown, typo, world.revoked_key, world.expired_key)

    for method, path in ROUTES:
        url = fill(path, values)
        with subtests.test(msg="refusals", route=f"{method} {path}"):
            if (method, path) in PUBLIC:
                assert call(client, method, url, None).status_code != 401
                continue
            # Nobody, and every kind of bad key: 401 with a problem body and a Bearer challenge.
            for key in bad_keys:
                r = call(client, method, url, key)
                assert_problem(r, 401, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")
            if path.startswith("/api/v1/admin/"):
                for key in (world.a.owner_key, world.a.member_key, world.b.owner_key):
                    assert_problem(call(client, method, url, key), 403, "forbidden")
            elif "{" in path:
                # Another tenant's object does not exist for this key.
                assert_problem(call(client, method, url, world.b.owner_key), 404, "not-found")
            a_objects_unchanged(db, world)

    # Removals last, so a route that reads the same object still finds it.
    for method, path in sorted(ROUTES, key=lambda r: (r[1].startswith("/api/v1/admin/"), r[0] == "DELETE")):
        if (method, path) in PUBLIC:
            continue
        url = fill(path, values)
        with subtests.test(msg="allowed", route=f"{method} {path}"):
            if path.startswith("/api/v1/admin/"):
                # The admin passes every guard (a sample object it removed earlier may be gone).
                assert call(client, method, url, world.admin_key).status_code not in (401, 403)
            else:
                r = call(client, method, url, world.a.owner_key)
                assert r.status_code not in (401, 403, 404), r.text
