"""Parity: the project's ONNX renderings of catalogue models (onnx.helper, no weights), uploaded as a user
would, plan within 10% of the catalogue's throughput and memory per IPU at several partition sizes.

The full grid and its figures are in ``benchmarks/onnx_parity.py`` and docs/emulator.md; this test runs
the same code on every rendered model and task it covers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import onnx_parity


@pytest.fixture(scope="module")
def rows() -> list[onnx_parity.Row]:
    return onnx_parity.parity_rows()


def test_every_rendered_workload_is_covered_at_several_sizes(rows: list[onnx_parity.Row]) -> None:
    from vipu.emulator.onnxgraph.renderings import RENDERED

    covered = {r.model for r in rows}
    assert covered == set(RENDERED)
    assert {r.task for r in rows} == {"train", "infer"}
    assert all(len({r.ipus for r in rows if r.model == m}) >= 2 for m in covered)


def test_throughput_and_memory_are_within_ten_percent_of_the_catalogue(rows: list[onnx_parity.Row]) -> None:
    bad = [
        (r.model, r.task, r.seq_len, r.ipus, f"{r.throughput_error:+.1%}", f"{r.memory_error:+.1%}")
        for r in rows
        if abs(r.throughput_error) > onnx_parity.TOLERANCE or abs(r.memory_error) > onnx_parity.TOLERANCE
    ]
    assert not bad, bad


def test_primitive_layernorm_and_gelu_plan_like_fused_ones() -> None:
    for _label, _ipus, fused, primitive in onnx_parity.fused_rows():
        assert primitive.throughput == pytest.approx(fused.throughput, rel=0.01)
        assert primitive.memory_per_ipu_bytes == pytest.approx(fused.memory_per_ipu_bytes, rel=0.01)
