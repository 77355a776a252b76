"""Issue 32 item 3: model uploads built to break the server get a 4xx that says why, and store nothing.

Found by attack: 3,000 nested subgraphs were a RecursionError (500) in the stripper's walk; an
initializer of dims [2**62, 2**62] was stored and counted and then the answer failed (a 500 saying
nothing changed); negative dimensions were accepted, after which every estimate or job naming the
model was a 500; a `dims` field nested 1,000 deep was a 500; and a file that is not ONNX at all was
refused in terms of protobuf wire types."""

from __future__ import annotations

from typing import Any

import pytest

from tests.models.test_models_api import listed, push
from tests.support import onnx_files
from tests.tenancy.conftest import assert_problem, make_tenant


@pytest.fixture
def alpha(db: Any, seeded: Any) -> Any:
    return make_tenant(db, "alpha")


HOSTILE = [
    ("nested-subgraphs", lambda: onnx_files.nested_subgraphs(3000), "corrupt"),
    ("nested-sequence-types", lambda: onnx_files.nested_sequence_types(3000), "corrupt"),
    ("huge-initializer", lambda: onnx_files.external_initializer(2**62, 2**62), None),
    ("negative-initializer", lambda: onnx_files.external_initializer(-3, 4), None),
    ("negative-input", onnx_files.negative_input, None),
]


@pytest.mark.parametrize(("case", "make", "reason"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_graph_is_a_422_and_stores_nothing(
    client: Any,
    alpha: Any,
    case: str,
    make: Any,
    reason: str | None,
) -> None:
    r = push(client, alpha.owner_key, make(), f"{case}.onnx")
    body = assert_problem(r, 422, "invalid-model")
    if reason is not None:
        assert body["reason"] == reason, body
    assert listed(client, alpha.owner_key) == []
    # The tenant's quota of models is untouched: a good model still goes in.
    assert push(client, alpha.owner_key, onnx_files.mlp(), "ok.onnx").status_code == 201


@pytest.mark.parametrize(
    "data",
    [b"hello, this is not onnx at all\n" * 10, b"\x89PNG\r\n\x1a\n" + bytes(100), b"PK\x03\x04" + bytes(64)],
    ids=["text", "png", "zip"],
)
def test_a_file_that_is_not_onnx_says_so(client: Any, alpha: Any, data: bytes) -> None:
    body = assert_problem(push(client, alpha.owner_key, data, "x.onnx"), 422, "invalid-model")
    assert "not an ONNX model" in body["detail"] and "wire type" not in body["detail"], body
    assert body["reason"] == "not-onnx", body


@pytest.mark.parametrize(
    "dims", ["[" * 1000 + "]" * 1000, '{"a":' * 1000 + "1" + "}" * 1000, '{"s": ' + "9" * 5000 + "}"]
)
def test_a_deeply_nested_dims_field_is_refused(client: Any, alpha: Any, dims: str) -> None:
    body = assert_problem(
        push(client, alpha.owner_key, onnx_files.sequence_model(), "s.onnx", dims=dims), 422
    )
    assert "dims" in body["detail"], body
    assert listed(client, alpha.owner_key) == []
