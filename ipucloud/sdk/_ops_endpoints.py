"""Inference endpoints: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ipucloud.sdk import inference
from ipucloud.sdk._core import Call, Pager, model, operation, paginated
from ipucloud.sdk._ops_common import V1, _answer, _drop_none, _page, seg
from ipucloud.sdk.inference import Inference
from ipucloud.sdk.models import Endpoint, EndpointMetrics, Page


class EndpointOps:
    """Inference endpoints and the requests sent to them (`infer`)."""

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
        return lambda cursor: EndpointOps.list_endpoints.build(
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
