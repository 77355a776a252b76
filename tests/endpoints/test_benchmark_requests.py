"""benchmarks/endpoints.py sends requests the endpoint accepts: the JSON and binary bodies it builds for
every model it loads parse against that model's signature with the rows it means, so its figures are
answers, not 400s. Its plan arithmetic (the batch that carries a load) is checked too; the benchmark
itself runs in minutes and is not part of the suite."""

from __future__ import annotations

import json

import pytest

from api.inference import parse_request
from benchmarks import endpoints as bench


@pytest.mark.parametrize(
    "model", [bench.OVERHEAD_MODEL, *bench.CURVE_MODELS.values()], ids=lambda m: str(m["model"])
)
def test_the_bodies_it_sends_parse_against_the_models_signature(model: dict[str, object]) -> None:
    plan = bench.plan_of(model, bench.CURVE_MAX_BATCH)
    body = json.dumps(bench.v2_body(plan, rows=2)).encode()
    assert parse_request(body, None, plan.signature, max_rows=8).rows == 2
    raw, headers = bench.v2_binary(plan, rows=3)
    parsed = parse_request(raw, headers["Inference-Header-Content-Length"], plan.signature, max_rows=8)
    assert parsed.rows == 3
    # The binary body carries exactly the signature's bytes after its JSON header.
    header = int(headers["Inference-Header-Content-Length"])
    assert len(raw) - header == 3 * plan.signature.input_bytes_per_row


def test_the_carrying_batch_is_the_smallest_whose_throughput_holds_the_load() -> None:
    plan = bench.plan_of(bench.CURVE_MODELS["BERT-Base seq 128"], bench.CURVE_MAX_BATCH)
    assert bench.carrying_batch(plan, 1.0) == 1
    for b in range(2, bench.CURVE_MAX_BATCH + 1):
        rate = (plan.throughput(b - 1) + plan.throughput(b)) / 2
        assert bench.carrying_batch(plan, rate) == b
    assert bench.carrying_batch(plan, plan.throughput(bench.CURVE_MAX_BATCH) * 2) == bench.CURVE_MAX_BATCH


def test_server_timing_sums_the_chips_parts() -> None:
    header = "queue;dur=1.5, batch;dur=0.25, host;dur=0.5, ipu;dur=2, total;dur=99"
    assert bench._server_timing(header) == pytest.approx(4.25)
    assert bench._server_timing(None) is None
