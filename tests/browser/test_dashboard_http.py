"""The dashboard over HTTP, without a browser (fast): sessions, CSRF, isolation, no-JS flows, headers.

The browser tests next to this file drive the same pages through Chromium; these check what a
browser would not show: cookie attributes, what is stored in Redis, refusals of forged requests.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy import update as sql_update

from scheduler.models import ApiKey, TrialApplication
from scheduler.services.capacity import fleet as fleet_service
from scheduler.services.tenancy import keys as key_service
from scheduler.services.tenancy import tenants as tenant_service
from scheduler.settings import get_settings
from tests.support.services import Seeded

FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
R50 = {
    "model": "resnet50",
    "task": "train",
    "batch_size": "64",
    "steps": "200",
    "ipus": "4",
    "precision": "fp16",
}


def make_tenant(db: Any, name: str, plan: str = "trial", quota: float | None = None) -> tuple[str, str]:
    with db.write() as s:
        created = tenant_service.create_tenant(
            session=s, secret=get_settings().secret(), name=name, plan=plan, quota_ipu_hours=quota
        )
        return created.tenant.id, created.api_key


def sign_in(client: TestClient, key: str, next_path: str = "/") -> Any:
    page = client.get("/login")
    token = FORM_TOKEN.search(page.text)
    assert token, page.text
    return client.post(
        "/login",
        data={"api_key": key, "form_token": token.group(1), "next": next_path},
        follow_redirects=False,
    )


def csrf_of(client: TestClient, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


def test_sign_in_keeps_the_key_server_side_and_sign_out_ends_the_session(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    _, key = make_tenant(db, "acme")
    r = sign_in(client, key)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("ipucloud_session=")
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    assert key not in cookie

    home = client.get("/")
    assert home.status_code == 200 and "acme" in home.text and "IPU-hours left" in home.text
    assert key not in home.text, "the key never reaches the page (so never reaches JavaScript)"
    assert home.headers["cache-control"] == "no-store"

    from scheduler import runtime

    stored = [
        runtime.current().redis.get(k) for k in runtime.current().redis.scan_iter("ipucloud:dash:session:*")
    ]
    assert len(stored) == 1 and key.encode() not in stored[0], "Redis never holds the key"

    token = client.cookies.get("ipucloud_session")
    client.post("/logout", data={"csrf": csrf_of(client, "/")}, follow_redirects=False)
    assert list(runtime.current().redis.scan_iter("ipucloud:dash:session:*")) == []
    client.cookies.set("ipucloud_session", token or "")
    again = client.get("/jobs", follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"] == "/login?next=/jobs"


def redis_dump() -> bytes:
    """Everything Redis holds, as one blob: what a stolen dump or a replica would give away."""
    from scheduler import runtime

    r = runtime.current().redis
    out = []
    for name in r.scan_iter("*"):
        kind = r.type(name)
        if kind == b"string":
            out.append(r.get(name) or b"")
        elif kind == b"list":
            out.extend(r.lrange(name, 0, -1))
        elif kind == b"hash":
            out.extend(k + b"=" + v for k, v in r.hgetall(name).items())
        elif kind in (b"set", b"zset"):
            out.extend(r.smembers(name) if kind == b"set" else r.zrange(name, 0, -1))
        out.append(name)
    return b"\n".join(out)


def test_a_live_sessions_record_holds_the_keys_id_never_the_key(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    tenant_id, key = make_tenant(db, "acme")
    assert sign_in(client, key).status_code == 303
    assert client.get("/jobs").status_code == 200
    dump = redis_dump()
    secret_part = key[len("ipuc_") + 12 : -6]  # the 43 characters of secret
    assert key.encode() not in dump and secret_part.encode() not in dump, "no key, nor its secret"
    with db.read() as s:
        (row,) = key_service.list_keys(session=s, tenant_id=tenant_id)
    from scheduler import runtime

    (name,) = list(runtime.current().redis.scan_iter("ipucloud:dash:session:*"))
    record = json.loads(runtime.current().redis.get(name))
    assert record["key_id"] == row.id and record["tenant_id"] == tenant_id
    assert set(record) == {"v", "key_id", "tenant_id", "member_id", "csrf", "created"}, record
    token = client.cookies.get("ipucloud_session") or ""
    assert token and token.encode() not in dump, "Redis knows the session by the token's hash only"


def _ends_within(client: TestClient, seconds: float, status: int) -> float:
    start = time.monotonic()
    while True:
        r = client.get("/jobs", follow_redirects=False)
        if r.status_code == status:
            return time.monotonic() - start
        assert r.status_code == 200, r.text
        assert time.monotonic() - start < seconds, f"the session still works {seconds} s later"
        time.sleep(0.05)


# serial: a session must end within half a second of the key cache lapsing.
@pytest.mark.serial
def test_revocation_suspension_and_sign_out_end_a_session_within_the_cache_window(
    app: Any, seeded: Seeded, db: Any
) -> None:
    """Revoked and suspended as another API process would do it: in the database, with this
    process's key cache untold, so the session ends when the cached standing lapses (2 s)."""
    from scheduler.models import ApiKey, Tenant, utcnow

    window = key_service.key_cache.ttl + 0.5
    revoked_tenant, revoked_key = make_tenant(db, "revoked")
    suspended_tenant, suspended_key = make_tenant(db, "suspended")
    _, leaving_key = make_tenant(db, "leaving")
    browsers = {}
    for name, key in (("revoked", revoked_key), ("suspended", suspended_key), ("leaving", leaving_key)):
        browsers[name] = TestClient(app, raise_server_exceptions=False)
        assert sign_in(browsers[name], key).status_code == 303
        assert browsers[name].get("/jobs").status_code == 200

    with db.write() as s:
        s.execute(sql_update(ApiKey).where(ApiKey.tenant_id == revoked_tenant).values(revoked_at=utcnow()))
    took = _ends_within(browsers["revoked"], window, 303)
    assert browsers["revoked"].get("/jobs", follow_redirects=False).headers["location"] == "/login?next=/jobs"

    with db.write() as s:
        s.execute(sql_update(Tenant).where(Tenant.id == suspended_tenant).values(status="suspended"))
    took = max(took, _ends_within(browsers["suspended"], window, 403))
    again = browsers["suspended"].get("/jobs", follow_redirects=False)
    assert again.status_code == 303, "a suspended tenant's session is over, not only refused"

    leaving = browsers["leaving"]
    token = csrf_of(leaving, "/")
    start = time.monotonic()
    assert leaving.post("/logout", data={"csrf": token}, follow_redirects=False).status_code == 303
    assert leaving.get("/jobs", follow_redirects=False).status_code == 303
    assert time.monotonic() - start < 1.0 and took <= window


def test_a_session_made_before_sessions_stopped_holding_keys_is_signed_out(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    from api.dashboard import sessions
    from scheduler import runtime

    tenant_id, _ = make_tenant(db, "acme")
    with db.read() as s:
        (row,) = key_service.list_keys(session=s, tenant_id=tenant_id)
    token = "old-session-token-" + "x" * 30
    old = {"sealed": "00" * 40, "key_id": row.id, "csrf": "c" * 40, "created": time.time()}
    runtime.current().redis.set(sessions._redis_key(token), json.dumps(old), ex=60)
    client.cookies.set(sessions.COOKIE, token)
    r = client.get("/jobs", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/jobs"
    assert runtime.current().redis.get(sessions._redis_key(token)) is None, "and its record is gone"


def test_a_wrong_key_is_refused_and_next_never_leaves_the_site(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    bad = sign_in(client, "ipuc_" + "A" * 61)
    assert bad.status_code == 401 and "checksum does not match" in bad.text and 'role="alert"' in bad.text
    assert "ipucloud_session" not in bad.headers.get("set-cookie", "")
    _, key = make_tenant(db, "acme")
    for evil in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        client.cookies.clear()
        r = sign_in(client, key, next_path=evil)
        assert r.status_code == 303 and r.headers["location"] == "/"
    client.cookies.clear()
    assert sign_in(client, key, next_path="/jobs?state=running").headers["location"] == "/jobs?state=running"


def test_forged_forms_are_refused(client: TestClient, seeded: Seeded, db: Any) -> None:
    _, key = make_tenant(db, "acme")
    # Sign-in needs the double-submit token of a form this site showed.
    r = client.post("/login", data={"api_key": key, "form_token": "x" * 40}, follow_redirects=False)
    assert r.status_code == 403
    assert sign_in(client, key).status_code == 303
    token = csrf_of(client, "/jobs/new")
    assert client.post("/jobs/new", data={**R50, "action": "submit"}).status_code == 403
    assert client.post("/jobs/new", data={**R50, "action": "submit", "csrf": "forged"}).status_code == 403
    cross = client.post(
        "/jobs/new",
        data={**R50, "action": "submit", "csrf": token},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status_code == 403 and "another site" in cross.text
    assert "No jobs yet" in client.get("/jobs").text, "nothing was submitted"


def test_revoking_the_key_ends_its_dashboard_session(client: TestClient, seeded: Seeded, db: Any) -> None:
    tenant_id, key = make_tenant(db, "acme")
    assert sign_in(client, key).status_code == 303
    assert client.get("/", follow_redirects=False).status_code == 200
    with db.write() as s:
        (row,) = key_service.list_keys(session=s, tenant_id=tenant_id)
        key_service.revoke_key(session=s, key_id=row.id, tenant_id=tenant_id)
    r = client.get("/jobs", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")


def test_preview_and_submit_without_javascript_then_cancel(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    _, key = make_tenant(db, "acme")
    sign_in(client, key)
    form = client.get("/jobs/new").text
    token = CSRF.search(form).group(1)  # type: ignore[union-attr]
    idem = re.search(r'name="idempotency" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]

    preview = client.post("/jobs/new", data={**R50, "action": "preview", "csrf": token, "idempotency": idem})
    assert preview.status_code == 200
    assert "Fits</strong> on 4 IPUs" in preview.text and "IPU-hours" in preview.text
    assert "starts at once" in preview.text
    assert 'value="64"' in preview.text, "the form keeps what was typed"

    wrong = client.post("/jobs/new", data={**R50, "batch_size": "lots", "action": "preview", "csrf": token})
    assert (
        wrong.status_code == 422
        and "Enter a whole number." in wrong.text
        and 'aria-invalid="true"' in wrong.text
    )
    too_big = client.post("/jobs/new", data={**R50, "ipus": "3", "action": "preview", "csrf": token})
    assert too_big.status_code == 422 and "power of two" in too_big.text

    fragment = client.post("/jobs/estimate", data=R50, headers={"X-CSRF-Token": token})
    assert fragment.status_code == 200 and "Fits" in fragment.text and "<html" not in fragment.text
    assert client.post("/jobs/estimate", data=R50).status_code == 403

    data = {**R50, "name": "nojs", "action": "submit", "csrf": token, "idempotency": idem}
    first = client.post("/jobs/new", data=data, follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"].startswith("/jobs/job_")
    again = client.post("/jobs/new", data=data, follow_redirects=False)
    assert again.headers["location"] == first.headers["location"], "a resent form is the same job"

    page = client.get(first.headers["location"])
    assert page.status_code == 200 and "nojs" in page.text and "Job nojs submitted." in page.text
    assert "queued" in page.text and "Why it waits" in page.text
    job_id = first.headers["location"].rsplit("/", 1)[-1]
    cancelled = client.post(f"/jobs/{job_id}/cancel", data={"csrf": token})
    assert cancelled.status_code == 200 and "Job cancelled." in cancelled.text
    assert 'class="state state-cancelled" id="job-state"' in cancelled.text

    # The form's opt-out of preemption: the job keeps it, and its page says so.
    assert 'name="never_preempt"' in form
    kept = client.post(
        "/jobs/new",
        data={**R50, "name": "kept", "never_preempt": "on", "action": "submit", "csrf": token},
        follow_redirects=False,
    )
    assert kept.status_code == 303, kept.text
    assert "never (opted out)" in client.get(kept.headers["location"]).text
    both = {**R50, "never_preempt": "on", "preemptible": "on", "action": "preview", "csrf": token}
    assert client.post("/jobs/new", data=both).status_code == 422


def test_the_job_pages_stream_carries_the_jobs_facts_and_the_apis_does_not(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    _, key = make_tenant(db, "facts")
    sign_in(client, key)
    token = csrf_of(client, "/jobs/new")
    made = client.post(
        "/jobs/new", data={**R50, "name": "f", "action": "submit", "csrf": token}, follow_redirects=False
    )
    job_id = made.headers["location"].rsplit("/", 1)[-1]
    client.post(f"/jobs/{job_id}/cancel", data={"csrf": token})

    # An ended job's stream sends what is there and ends, so it can be read whole.
    page_stream = client.get(f"/jobs/{job_id}/events").text
    facts = re.search(r"event: job\ndata: (.*)\n", page_stream)
    assert facts, page_stream
    assert json.loads(facts.group(1)) == {
        "partition": None,
        "machine": None,
        "attempts": 0,
        "used_ipu_hours": 0.0,
    }
    assert page_stream.index("event: job") < page_stream.index("event: end")
    api_stream = client.get(
        f"/api/v1/jobs/{job_id}/logs",
        headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"},
    ).text
    assert "event: end" in api_stream and "event: job" not in api_stream


def test_quota_refusal_is_shown_on_the_form(client: TestClient, seeded: Seeded, db: Any) -> None:
    _, key = make_tenant(db, "poor", quota=0.0001)
    sign_in(client, key)
    token = csrf_of(client, "/jobs/new")
    r = client.post("/jobs/new", data={**R50, "steps": "100000", "action": "submit", "csrf": token})
    assert r.status_code == 403 and "IPU-hours" in r.text and 'role="alert"' in r.text


def test_tenants_see_only_their_own_jobs(client: TestClient, seeded: Seeded, db: Any) -> None:
    _, key_a = make_tenant(db, "alpha")
    _, key_b = make_tenant(db, "beta")
    sign_in(client, key_a)
    token = csrf_of(client, "/jobs/new")
    r = client.post(
        "/jobs/new",
        data={**R50, "name": "secret-a", "action": "submit", "csrf": token},
        follow_redirects=False,
    )
    job_path = r.headers["location"]
    client.post("/logout", data={"csrf": token})

    sign_in(client, key_b)
    assert "secret-a" not in client.get("/jobs").text
    assert "secret-a" not in client.get("/").text
    other = client.get(job_path)
    assert other.status_code == 404 and "secret-a" not in other.text
    assert client.get(job_path + "/events").status_code == 404
    token_b = csrf_of(client, "/")
    assert client.post(job_path + "/cancel", data={"csrf": token_b}).status_code == 404
    assert client.get("/admin/fleet").status_code == 403
    assert "alpha" not in client.get("/usage.csv").text


def test_every_page_has_a_strict_csp_and_no_inline_script_or_style(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    _, key = make_tenant(db, "acme")
    pages = ["/", "/login", "/trial"]
    for path in pages:
        check_page(client.get(path))
    sign_in(client, key)
    for path in ["/", "/jobs", "/jobs/new"]:
        check_page(client.get(path))
    client.post("/logout", data={"csrf": csrf_of(client, "/")})
    sign_in(client, seeded.admin_key)
    for path in [
        "/admin/fleet",
        "/admin/partitions",
        "/admin/tenants",
        "/admin/trials",
        "/admin/usage",
        "/jobs",
    ]:
        check_page(client.get(path))
    css = client.get("/static/app.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


def check_page(r: Any) -> None:
    assert r.status_code == 200, r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-frame-options"] == "DENY"
    html = r.text
    assert html.lstrip().startswith("<!doctype html>") and '<html lang="en">' in html
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html) is None, "no inline script"
    assert re.search(r"\son[a-z]+=", html) is None, "no inline event handlers"
    assert re.search(r"\sstyle=", html) is None and "<style" not in html, "no inline style"
    assert 'class="skip" href="#main"' in html and 'id="main"' in html
    assert 'name="viewport"' in html
    for input_id in re.findall(r'<(?:input|select|textarea)[^>]*\bid="([^"]+)"', html):
        assert f'for="{input_id}"' in html, f"#{input_id} has a label"


def test_trial_application_approval_shows_the_key_once(client: TestClient, seeded: Seeded, db: Any) -> None:
    page = client.get("/trial")
    token = FORM_TOKEN.search(page.text).group(1)  # type: ignore[union-attr]
    form = {
        "name": "Ada Lovelace",
        "email": "ada@example.org",
        "organisation": "Analytical Engines",
        "category": "individual",
        "intended_use": "Fine-tune BERT on my own notes.",
        "form_token": token,
    }
    bad = client.post("/trial", data={**form, "email": "not-an-address"})
    assert bad.status_code == 422 and 'id="email-error"' in bad.text and "Ada Lovelace" in bad.text
    ok = client.post("/trial", data=form)
    assert ok.status_code == 200 and "application app_" in ok.text
    twice = client.post("/trial", data=form)
    assert twice.status_code == 409 and "already waiting" in twice.text

    sign_in(client, seeded.admin_key)
    trials = client.get("/admin/trials")
    assert "Ada Lovelace" in trials.text and "Fine-tune BERT" in trials.text
    app_id = re.search(r'action="/admin/trials/(app_[^/]+)/approve"', trials.text).group(1)  # type: ignore[union-attr]
    approved = client.post(
        f"/admin/trials/{app_id}/approve",
        data={"csrf": CSRF.search(trials.text).group(1), "plan": "trial", "hand_over_key": "1"},  # type: ignore[union-attr]
    )
    assert approved.status_code == 200 and approved.headers["cache-control"] == "no-store"
    new_key = re.search(r'id="new-key" class="mono key" readonly value="(ipuc_[^"]+)"', approved.text).group(
        1
    )  # type: ignore[union-attr]
    assert "approved" in client.get("/admin/trials?status=approved").text
    assert new_key not in client.get("/admin/tenants").text, "shown once, never again"

    client.post("/logout", data={"csrf": csrf_of(client, "/admin/fleet")})
    assert sign_in(client, new_key).status_code == 303
    home = client.get("/")
    assert "Ada Lovelace" in home.text and "100.000" in home.text and "days" in home.text


def test_trial_approval_by_default_shows_no_key(client: TestClient, seeded: Seeded, db: Any) -> None:
    """The applicant's mailed claim link mints the first key; the admin's page never shows one."""
    applied = client.post(
        "/api/v1/trials",
        json={
            "name": "Grace Hopper",
            "email": "grace@example.org",
            "organisation": "Harvard",
            "category": "university",
            "intended_use": "Compiling COBOL to IPU graphs.",
        },
    )
    assert applied.status_code == 201, applied.text
    app_id = applied.json()["id"]
    sign_in(client, seeded.admin_key)
    trials = client.get("/admin/trials")
    assert f'id="{app_id}-handover"' in trials.text and f'for="{app_id}-handover"' in trials.text
    csrf = CSRF.search(trials.text).group(1)  # type: ignore[union-attr]
    approved = client.post(
        f"/admin/trials/{app_id}/approve", data={"csrf": csrf, "plan": ""}, follow_redirects=False
    )
    assert approved.status_code == 303 and approved.headers["location"] == "/admin/trials?status=approved"
    page = client.get(approved.headers["location"])
    assert "claim link is mailed" in page.text and "ipuc_" not in page.text
    with db.read() as s:
        tenant_id = s.get(TrialApplication, app_id).tenant_id
        assert tenant_id and s.execute(select(ApiKey).where(ApiKey.tenant_id == tenant_id)).first() is None


def test_admin_pages_change_the_fleet_and_export_usage(client: TestClient, seeded: Seeded, db: Any) -> None:
    tenant_id, _ = make_tenant(db, "acme", plan="standard")
    sign_in(client, seeded.admin_key)
    fleet = client.get("/admin/fleet")
    assert fleet.text.count('class="machine machine-up"') == 32, "2 POD64s of 16 machines"
    token = CSRF.search(client.get("/admin/fleet?machine=pod0000-m03").text).group(1)  # type: ignore[union-attr]
    drained = client.post("/admin/machines/pod0000-m03/drain", data={"csrf": token, "reason": "fan noise"})
    assert drained.status_code == 200 and "pod0000-m03 is now draining." in drained.text
    assert 'class="machine machine-draining"' in drained.text and "fan noise" in drained.text
    assert client.post("/admin/machines/pod9999-m00/fail", data={"csrf": token}).status_code == 404

    made = client.post(
        "/admin/partitions",
        data={
            "csrf": token,
            "id": "res1",
            "size": "16",
            "machine_type": "",
            "tenant": tenant_id,
            "gcds": "1",
        },
    )
    assert made.status_code == 200 and "create partition (res1): success." in made.text
    fleet = client.get("/admin/fleet").text
    fleet_map = fleet.split('class="fleet-map"')[1].split("</svg>")[0]
    assert fleet_map.count(">A</text>") == 16, "the partition's letter on each of its 16 IPUs"
    assert "partition res1, tenant acme" in fleet_map and ">res1<" in fleet
    dup = client.post("/admin/partitions", data={"csrf": token, "id": "res1", "size": "16", "gcds": "1"})
    assert dup.status_code == 422 and "already exists" in dup.text
    gone = client.post("/admin/partitions/res1/remove", data={"csrf": token})
    assert "remove partition (res1): success." in gone.text

    created = client.post(
        "/admin/tenants", data={"csrf": token, "name": "beta", "plan": "standard", "quota_ipu_hours": "7"}
    )
    assert created.status_code == 200 and re.search(r'value="ipuc_[A-Za-z0-9]+"', created.text)
    assert (
        client.post("/admin/tenants", data={"csrf": token, "name": "beta", "plan": "standard"}).status_code
        == 422
    )

    csv = client.get("/admin/usage.csv")
    assert csv.headers["content-type"].startswith("text/csv")
    header, *rows = csv.text.splitlines()
    assert header.startswith("tenant_id,name,plan") and {r.split(",")[1] for r in rows} == {"acme", "beta"}


def test_a_fleet_larger_than_the_map_is_shown_page_by_page(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    with db.write() as s:
        fleet_service.seed_fleet(session=s, pods=130)
    sign_in(client, seeded.admin_key)
    first = client.get("/admin/fleet")
    assert "8,320 IPUs in 130 PODs and servers" in first.text, "the whole fleet is counted, not the page"
    assert "The map shows <strong>pod0000 to pod0007</strong>" in first.text
    assert first.text.count('class="machine machine-up"') == 8 * 16
    assert '<option value="128">pod0128 to pod0129</option>' in first.text
    assert 'href="/admin/fleet?pod_from=8" rel="next"' in first.text and 'rel="prev"' not in first.text

    last = client.get("/admin/fleet?pod_from=128").text
    assert "The map shows <strong>pod0128 to pod0129</strong>" in last
    assert last.count('class="machine machine-up"') == 2 * 16 and 'rel="next"' not in last
    past_the_end = client.get("/admin/fleet?pod_from=1000").text
    assert "The map shows <strong>pod0128 to pod0129</strong>" in past_the_end
    assert client.get("/admin/fleet?pod_from=-1").status_code == 422

    # A machine on another page: failing it lands on its page, and every page lists it as down.
    token = csrf_of(client, "/admin/fleet")
    failed = client.post("/admin/machines/pod0129-m03/fail", data={"csrf": token, "reason": "PSU"})
    assert failed.status_code == 200 and "pod0129-m03 is now failed." in failed.text
    assert "The map shows <strong>pod0128 to pod0129</strong>" in failed.text
    assert "Machine pod0129-m03" in failed.text and 'class="machine machine-failed"' in failed.text
    first = client.get("/admin/fleet").text
    assert "1 machine not up" in first and 'href="/admin/fleet?machine=pod0129-m03#machine"' in first


@pytest.mark.parametrize("path", ["/admin/fleet", "/jobs", "/jobs/new", "/"])
def test_pages_need_a_session(client: TestClient, seeded: Seeded, path: str) -> None:
    r = client.get(path, follow_redirects=False)
    if path == "/":
        assert r.status_code == 200 and "Apply for a free trial" in r.text
    else:
        assert r.status_code == 303 and r.headers["location"] == f"/login?next={path}"


def test_the_fleet_page_draws_servers_beside_pods_and_changes_the_fleet(
    client: TestClient, db: Any, env: Any
) -> None:
    from tests.support.services import seed

    admin_key = seed(db, fleet_description="1xm2000,1xbow/pod16,1xdss8440").admin_key
    sign_in(client, admin_key)
    page = client.get("/admin/fleet").text
    fleet_map = page.split('class="fleet-map"')[1].split("</svg>")[0]
    # 16 POD64 machines, 4 POD16 machines and the server, which is one machine of 8 cards x 2 IPUs.
    assert fleet_map.count('class="machine machine-up"') == 16 + 4 + 1
    assert "srv0002" in fleet_map and "c2 dss8440" in fleet_map and ">c7</text>" in fleet_map
    assert "all 16 IPUs free" in fleet_map and "Fleet map: 2 PODs and 1 server," in fleet_map
    assert "<td>c2</td><td>16</td><td>16</td><td>16</td>" in page  # by type: IPUs, free, largest
    token = csrf_of(client, "/admin/fleet")
    added = client.post("/admin/fleet/servers", data={"csrf": token, "model": "nf5568m5", "count": "2"})
    assert added.status_code == 200 and "added srv0003, srv0004." in added.text
    bad = client.post("/admin/fleet/servers", data={"csrf": token, "model": "dgx", "count": "1"})
    assert bad.status_code == 422
    refused = client.post("/admin/fleet/units/srv0003/retire", data={"csrf": token})
    assert refused.status_code == 409 and "Drain" in refused.text
    client.post("/admin/machines/srv0003/drain", data={"csrf": token})
    retired = client.post("/admin/fleet/units/srv0003/retire", data={"csrf": token})
    assert retired.status_code == 200 and "retired srv0003." in retired.text
    rack = client.post("/admin/fleet/racks", data={"csrf": token, "machine_type": "bow", "layout": "pod64"})
    assert rack.status_code == 200 and "added: the scheduler places on it" in rack.text
    assert client.post("/admin/fleet/racks/rack0002/drain", data={"csrf": token}).status_code == 200
    gone = client.post("/admin/fleet/racks/rack0002/retire", data={"csrf": token})
    assert gone.status_code == 200 and "rack0002 retired" in gone.text


def test_an_inference_estimate_draws_latency_against_throughput(
    client: TestClient, seeded: Seeded, db: Any
) -> None:
    _, key = make_tenant(db, "serving")
    sign_in(client, key)
    token = csrf_of(client, "/jobs/new")
    infer = {**R50, "task": "infer", "ipus": "1", "batch_size": "1024"}
    fragment = client.post("/jobs/estimate", data=infer, headers={"X-CSRF-Token": token})
    assert fragment.status_code == 200, fragment.text
    html = fragment.text
    assert "Serving: latency against throughput on a replica of 1 IPU" in html
    chart = html[html.index('<svg class="chart"') : html.index("</svg>")]
    # One point per batch size 1 to 64, each with its figures in a tooltip, drawn without script.
    tips = re.findall(r"<circle [^>]*><title>batch (\d+): ([\d.]+) ms, ([\d,]+) samples/s</title>", chart)
    assert [int(b) for b, _, _ in tips] == [1, 2, 4, 8, 16, 32, 64]
    latencies = [float(ms) for _, ms, _ in tips]
    assert latencies == sorted(latencies) and latencies[0] < latencies[-1]
    assert "<script" not in chart and "style=" not in chart
    assert "host call 90 µs" in html
    # Training has no serving plot.
    trained = client.post("/jobs/estimate", data=R50, headers={"X-CSRF-Token": token})
    assert trained.status_code == 200 and "Fits" in trained.text and "Serving" not in trained.text
