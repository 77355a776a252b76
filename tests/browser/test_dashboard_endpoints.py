"""The dashboard's endpoint pages over HTTP: the list, and an endpoint's page with its replicas, its serve
plan's latency-throughput chart and its latency and replicas-over-time charts drawn from endpoint_stats;
another tenant's endpoint is not found."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from scheduler.endpointspec import EndpointSpec
from scheduler.models import EndpointStat, utcnow
from scheduler.services import endpoints
from tests.browser.test_dashboard_http import make_tenant, sign_in
from tests.support.services import Seeded


def test_the_list_and_an_endpoints_page_with_its_charts(client: TestClient, seeded: Seeded, db: Any) -> None:
    tenant, key = make_tenant(db, "acme", plan="standard")
    _, other_key = make_tenant(db, "rival", plan="standard")
    with db.write() as s:
        spec = EndpointSpec.model_validate(
            {
                "name": "bert",
                "model": "bert-base",
                "seq_len": 128,
                "machine": "m2000",
                "replicas": {"min": 1, "max": 3},
            }
        )
        ep = endpoints.create_endpoint(session=s, tenant_id=tenant, spec=spec)
        ep_id = ep.id
        start = utcnow().replace(second=0, microsecond=0) - timedelta(minutes=5)
        for i, (p50, p99, serving, wanted) in enumerate(
            [(3.0, 5.0, 1, 1), (4.0, 9.5, 1, 2), (3.5, 6.0, 2, 2)]
        ):
            s.add(
                EndpointStat(
                    endpoint_id=ep_id,
                    minute=start + timedelta(minutes=i),
                    tenant_id=tenant,
                    requests=600,
                    errors=0,
                    rejected=0,
                    cold_starts=0,
                    p50_ms=p50,
                    p90_ms=(p50 + p99) / 2,
                    p99_ms=p99,
                    mean_batch=4.0,
                    queue_delay_ms=1.0,
                    replicas=serving,
                    desired=wanted,
                )
            )
    assert sign_in(client, key).status_code == 303
    assert 'href="/endpoints"' in client.get("/").text  # in the tenant's nav
    listed = client.get("/endpoints")
    assert (
        listed.status_code == 200
        and f'href="/endpoints/{ep_id}"' in listed.text
        and "provisioning" in listed.text
    )
    page = client.get(f"/endpoints/{ep_id}")
    assert page.status_code == 200, page.text
    text = page.text
    assert f"/api/v1/endpoints/{ep_id}" in text and "queued" in text
    # Three charts drawn on the server: the plan's latency-throughput, latency and replicas over time.
    assert text.count("<svg") == 3
    assert 'id="latency-chart-t"' in text and 'id="replicas-chart-t"' in text and 'id="plan-m2000-t"' in text
    latency = text[text.index('id="latency-chart-t"') : text.index('id="replicas-chart-t"')]
    assert "p99: last 6" in latency and len(re.findall("<polyline", latency)) == 3
    replicas = text[text.index('id="replicas-chart-t"') :]
    assert "serving: last 2" in replicas and "wanted: last 2" in replicas
    assert "<script" not in latency  # plain markup: no script in a chart
    # Another tenant does not see it.
    rival = TestClient(client.app, raise_server_exceptions=False)
    assert sign_in(rival, other_key).status_code == 303
    assert rival.get(f"/endpoints/{ep_id}").status_code == 404
    assert ep_id not in rival.get("/endpoints").text
