"""The submit fast path (api/fast_submit.py): what it answers, it answers as the route would; what it is
not sure of reaches the route with its body intact, counted once by the rate limit."""

from __future__ import annotations

from typing import Any

import pytest

from tests.scheduler.test_group_commit import BAD, JOB, tenant
from tests.support.services import Seeded


class HandedOn:
    """Counts the requests the fast path hands to the rest of the app."""

    def __init__(self, app: Any) -> None:
        self.fast = app.fast_submit
        self.inner = self.fast.app
        self.count = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.count += 1
        await self.inner(scope, receive, send)

    def __enter__(self) -> HandedOn:
        self.fast.app = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.fast.app = self.inner


def _same(fast: Any, slow: Any, *, ignore: tuple[str, ...] = ()) -> None:
    assert fast.status_code == slow.status_code, (fast.text, slow.text)
    drop = {"date", "content-length", "location", *ignore}
    assert {k: v for k, v in fast.headers.items() if k not in drop} == {
        k: v for k, v in slow.headers.items() if k not in drop
    }


def test_a_cached_key_is_answered_in_front_and_as_the_route_answers(
    app: Any, client: Any, seeded: Seeded
) -> None:
    _, headers = tenant(client, seeded, "fast")
    with HandedOn(app) as handed:
        slow = client.post("/api/v1/jobs", json={**JOB, "name": "one"}, headers=headers)
        assert handed.count == 1  # the key was not in the cache yet: the route verified it
        fast = client.post("/api/v1/jobs", json={**JOB, "name": "two"}, headers=headers)
        assert handed.count == 1
    assert slow.status_code == fast.status_code == 202
    _same(fast, slow)
    assert fast.headers["x-content-type-options"] == "nosniff"
    assert fast.headers["location"] == f"/api/v1/jobs/{fast.json()['id']}"
    a, b = slow.json(), fast.json()
    assert set(a) == set(b) and b["name"] == "two" and b["state"] == "queued"
    got = client.get(fast.headers["location"], headers=headers)
    assert got.status_code == 200 and got.json()["id"] == b["id"]


def test_replays_and_refusals_from_the_fast_path_are_the_routes(
    app: Any, client: Any, seeded: Seeded
) -> None:
    _, headers = tenant(client, seeded, "refusals")
    keyed = {**headers, "Idempotency-Key": "once"}
    with HandedOn(app) as handed:
        client.post("/api/v1/jobs", json=JOB, headers=headers)  # fills the key cache
        handed.count = 0
        first = client.post("/api/v1/jobs", json=JOB, headers=keyed)
        again = client.post("/api/v1/jobs", json=JOB, headers=keyed)
        conflict = client.post("/api/v1/jobs", json={**JOB, "name": "other"}, headers=keyed)
        refused = client.post("/api/v1/jobs", json=BAD, headers=headers)
        assert handed.count == 0
    assert first.status_code == again.status_code == 202
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert again.json() == first.json()
    assert conflict.status_code == 409 and conflict.json()["type"] == "/problems/idempotency-key-reused"
    assert conflict.json()["instance"] == "/api/v1/jobs"
    assert refused.status_code == 422 and refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "case",
    ["invalid spec", "not json", "array", "query", "no content type", "bad key header", "two key headers"],
)
def test_what_the_fast_path_is_not_sure_of_reaches_the_route_whole(
    app: Any, client: Any, seeded: Seeded, case: str
) -> None:
    _, headers = tenant(client, seeded, "handed-" + case.replace(" ", "-"))
    client.post("/api/v1/jobs", json=JOB, headers=headers)  # the key is in the cache from here on
    content = None
    body: Any = JOB
    url = "/api/v1/jobs"
    h = dict(headers)
    if case == "invalid spec":
        body = {**JOB, "ipus": "many"}
    elif case == "not json":
        body, content = None, b'{"name": '
        h["content-type"] = "application/json"
    elif case == "array":
        body = {**JOB, "array": {"indices": "0-2"}}
    elif case == "query":
        url = "/api/v1/jobs?x=1"
    elif case == "no content type":
        body, content = None, b'{"name": "plain", "workload": {"model": "mcmc", "task": "infer", "steps": 1}}'
        h["content-type"] = "text/plain"
    elif case == "bad key header":
        h["Idempotency-Key"] = "has space"
    with HandedOn(app) as handed:
        if case == "two key headers":
            r = client.post(
                url, json=body, headers=[*h.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
            )
        elif content is not None:
            r = client.post(url, content=content, headers=h)
        else:
            r = client.post(url, json=body, headers=h)
        assert handed.count == 1
    # The route's own answers, from the body the fast path had already read.
    expected = {
        "invalid spec": 422,
        "not json": 400,
        "array": 202,
        "query": 202,
        "no content type": 422,
        "bad key header": 422,
        "two key headers": 202,
    }[case]
    assert r.status_code == expected, r.text
    if case == "array":
        assert r.headers["location"].startswith("/api/v1/arrays/")


def test_a_spent_rate_is_refused_in_front_and_a_handed_on_request_is_counted_once(
    app: Any, client: Any, seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, headers = tenant(client, seeded, "rated")
    client.post("/api/v1/jobs", json=JOB, headers=headers)
    runtime = app.state.runtime
    monkeypatch.setattr(runtime.settings, "rate_limit", "3/minute")
    # One request handed on (invalid) and two answered in front spend the three; the fourth is refused.
    assert client.post("/api/v1/jobs", json={**JOB, "ipus": "many"}, headers=headers).status_code == 422
    assert client.post("/api/v1/jobs", json=JOB, headers=headers).status_code == 202
    assert client.post("/api/v1/jobs", json=JOB, headers=headers).status_code == 202
    with HandedOn(app) as handed:
        r = client.post("/api/v1/jobs", json=JOB, headers=headers)
        assert handed.count == 0
    assert r.status_code == 429 and r.json()["type"] == "/problems/rate-limited"
    assert int(r.headers["retry-after"]) >= 1
