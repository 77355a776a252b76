"""Serving plans (vipu/emulator/serving.py): latency and throughput per batch on one replica, the
per-machine host call, signatures of catalogue models and own graphs, placeholder outputs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from vipu.emulator import (
    CompileError,
    WorkloadError,
    WorkloadSpec,
    catalogue,
    choose_serving_ipus,
    outputs_for,
    plan,
    serve_plan,
    signature_of,
)
from vipu.emulator.onnxgraph import OnnxWorkload, load_graph
from vipu.emulator.serving import V2_BYTES, Signature, TensorSpec
from vipu.machine_types import HOST_RUNTIME_S, HOST_SYNCS_PER_CALL, MACHINES, MachineType

TORCH = Path(__file__).resolve().parent.parent / "fixtures" / "torch"
BATCHES = (1, 2, 4, 8, 16, 32, 64)
TRIO = {
    "resnet50": WorkloadSpec(model="resnet50", task="infer"),
    "bert-base": WorkloadSpec(model="bert-base", task="infer", seq_len=128),
    "lstm": WorkloadSpec(model="lstm", task="infer", seq_len=128),
}


@pytest.mark.parametrize("machine", ["m2000", "bow", "c2"])
@pytest.mark.parametrize("name", list(TRIO))
def test_latency_grows_with_the_batch_and_throughput_saturates(name: str, machine: str) -> None:
    spec = TRIO[name]
    ipus = choose_serving_ipus(spec, machine=machine, max_batch_size=64)
    sp = serve_plan(spec, machine=machine, ipus=ipus, max_batch_size=64)
    assert sp.max_batch_size == 64
    latency = [sp.latency_s(b) for b in BATCHES]
    throughput = [sp.throughput(b) for b in BATCHES]
    # Never shorter for a larger batch; equal only while copies of the pipeline inside the replica
    # each still take one row (a C2 replica of four IPUs holds four copies of ResNet-50).
    assert all(a <= b for a, b in pairwise(latency)), latency
    assert latency[-1] > 1.1 * latency[0]
    assert all(a < b for a, b in pairwise(latency[2:])), latency
    assert all(a <= b * (1 + 1e-9) for a, b in pairwise(throughput)), throughput
    # Saturation: doubling the batch gains less and less ...
    gains = [b / a for a, b in pairwise(throughput)]
    assert all(b <= a * (1 + 1e-9) for a, b in pairwise(gains)), gains
    assert gains[-1] < gains[0], gains
    # ... and far less than double by 64, except for the LSTM: its 128 time steps are supersteps whose
    # cost does not grow with the batch, so it keeps gaining until the batch's GEMMs fill the tiles.
    if name != "lstm":
        assert gains[-1] < 1.6, gains
    for b in BATCHES:
        t = sp.times(b)
        assert t.latency_s == pytest.approx(t.host_call_s + t.host_s + t.device_s)
        assert t.step_s <= t.latency_s and sp.throughput(b) == pytest.approx(b / t.step_s)
        assert sp.step_s(b) == t.step_s and sp.device_s(b) == t.device_s and sp.host_s(b) == t.host_s


def test_the_host_call_is_the_machines_gateway_attached_dearer_than_pcie() -> None:
    m2000, bow, c2 = (MACHINES[MachineType(k)] for k in ("m2000", "bow", "c2"))
    assert m2000.host_attach == bow.host_attach == "gateway" and c2.host_attach == "pcie"
    assert m2000.host_call_s == bow.host_call_s == pytest.approx(HOST_RUNTIME_S + HOST_SYNCS_PER_CALL * 10e-6)
    assert c2.host_call_s == pytest.approx(HOST_RUNTIME_S + HOST_SYNCS_PER_CALL * 1e-6)
    spec = TRIO["resnet50"]
    plans = {k: serve_plan(spec, machine=k, ipus=1, max_batch_size=16) for k in ("m2000", "c2")}
    assert plans["m2000"].host_call_s == m2000.host_call_s != plans["c2"].host_call_s == c2.host_call_s
    t = {k: p.times(1) for k, p in plans.items()}
    assert t["m2000"].host_call_s > t["c2"].host_call_s
    # The image crosses the gateway machine's share of one 100 GbE link (3.125 GB/s per IPU), the
    # C2's own PCIe Gen3 x8 (8 GB/s each way): 224 x 224 x 3 FP16 values each.
    image = 224 * 224 * 3 * 2
    assert plans["m2000"].host_bytes_per_s == pytest.approx(100e9 / 8 / 4)
    assert plans["c2"].host_bytes_per_s == pytest.approx(8e9)
    assert t["m2000"].host_s == pytest.approx((image + 1000 * 2) / 3.125e9)
    assert t["m2000"].host_s > t["c2"].host_s
    # Offline inference keeps amortising its 2 ms host call over device iterations.
    offline = plan(WorkloadSpec(model="resnet50", task="infer", batch_size=1024), 1, "m2000")
    assert offline.timing.host_call_s == pytest.approx(2e-3 / offline.device_iterations)


def test_every_catalogue_model_has_a_bound_serving_signature() -> None:
    for w in catalogue():
        seq = w.default_seq_len
        for precision in w.precisions:
            spec = WorkloadSpec(model=w.name, task="infer", precision=precision)
            sig = signature_of(spec)
            assert sig.inputs and sig.outputs, w.name
            for t in (*sig.inputs, *sig.outputs):
                assert t.shape[0] == -1 and all(d > 0 for d in t.shape[1:]), (w.name, t)
                assert t.datatype in V2_BYTES and t.bytes_per_row > 0
                assert t.to_dict() == {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            names = [t.name for t in (*sig.inputs, *sig.outputs)]
            assert len(set(names)) == len(names)
            fp = "FP16" if precision == "fp16" else "FP32"
            if w.family == "nlp":
                assert [(t.name, t.datatype, t.shape) for t in sig.inputs] == [
                    (n, "INT64", (-1, seq)) for n in ("input_ids", "attention_mask", "token_type_ids")
                ]
                assert [(t.name, t.datatype, t.shape) for t in sig.outputs] == [
                    ("start_logits", "FP32", (-1, seq)),
                    ("end_logits", "FP32", (-1, seq)),
                ]
            elif w.family == "vision":
                size = w.image_size
                assert [(t.datatype, t.shape) for t in sig.inputs] == [(fp, (-1, 3, size, size))]
                assert [(t.name, t.datatype, t.shape) for t in sig.outputs] == [("logits", fp, (-1, 1000))]
            elif w.family == "time-series":
                assert sig.inputs[0].shape == (-1, seq, 64) and sig.inputs[0].datatype == "FP32"
                assert sig.outputs[0].shape == (-1, 64)
            elif w.family == "recommendation":
                assert sig.inputs[0].shape == (-1, 17_768) and sig.inputs[0].datatype == "UINT8"
                assert sig.outputs[0].shape == (-1, 17_768) and sig.outputs[0].datatype == fp
            else:
                assert w.family == "probabilistic"
                assert sig.inputs[0].shape == sig.outputs[0].shape == (-1, 128)
                assert sig.outputs[1] == TensorSpec("accepted", "BOOL", (-1,))
    # Sizes follow the spec: BERT at 384 tokens, the LSTM at a 32-step window.
    assert signature_of(WorkloadSpec(model="bert-large", task="infer", seq_len=384)).inputs[0].shape == (
        -1,
        384,
    )
    assert signature_of(WorkloadSpec(model="lstm", task="infer", seq_len=32)).inputs[0].shape == (-1, 32, 64)


@pytest.mark.parametrize(
    ("fixture", "seq", "inputs", "outputs"),
    [
        ("encoder", 256, [("input_ids", "INT64", (-1, 256))], [("logits", "FP32", (-1, 4))]),
        ("encoder-torchscript", 128, [("input_ids", "INT64", (-1, 128))], [("logits", "FP32", (-1, 4))]),
        ("lstm", 64, [("input_ids", "INT64", (-1, 64))], [("logits", "FP32", (-1, 5))]),
        ("lstm-torchscript", 128, [("input_ids", "INT64", (-1, 128))], [("logits", "FP32", (-1, 5))]),
        ("resnet", None, [("images", "FP32", (-1, 3, 64, 64))], [("logits", "FP32", (-1, 10))]),
        ("resnet-torchscript", None, [("images", "FP32", (-1, 3, 64, 64))], [("logits", "FP32", (-1, 10))]),
    ],
)
def test_torch_exports_serve_their_own_inputs_and_outputs(
    fixture: str, seq: int | None, inputs: list[object], outputs: list[object]
) -> None:
    # The classes (4, 5, 10) are the heads scripts/export_torch_fixtures.py gave each model.
    graph = load_graph((TORCH / f"{fixture}.onnx").read_bytes())
    spec = WorkloadSpec(model="m", task="infer", seq_len=seq, source=OnnxWorkload(graph, fixture))
    sig = signature_of(spec)
    assert [(t.name, t.datatype, t.shape) for t in sig.inputs] == inputs
    assert [(t.name, t.datatype, t.shape) for t in sig.outputs] == outputs
    sp = serve_plan(spec, machine="m2000", ipus=1, max_batch_size=8)
    assert sp.signature == sig and sp.latency_s(8) > sp.latency_s(1) > 0
    manifest = json.loads((TORCH / "manifest.json").read_text())
    listed = manifest["models"][fixture.removesuffix("-torchscript")]["input"]["name"]
    assert sig.inputs[0].name == listed


def test_outputs_are_deterministic_per_request_and_shaped_and_typed_by_the_signature() -> None:
    sig = Signature(
        (TensorSpec("x", "FP32", (-1, 4)),),
        (
            TensorSpec("logits", "FP16", (-1, 1000)),
            TensorSpec("ids", "INT64", (-1, 3, 2)),
            TensorSpec("ok", "BOOL", (-1,)),
            TensorSpec("raw", "BF16", (-1, 8)),
            TensorSpec("u", "UINT8", (-1, 5)),
        ),
    )
    first = outputs_for(sig, 3, b"request-1")
    again = outputs_for(sig, 3, b"request-1")
    other = outputs_for(sig, 3, b"request-2")
    assert [a.shape for a in first] == [(3, 1000), (3, 3, 2), (3,), (3, 8), (3, 5)]
    assert [a.dtype for a in first] == [np.float16, np.int64, np.bool_, np.uint16, np.uint8]
    assert [a.tobytes() for a in first] == [a.tobytes() for a in again]
    assert first[0].tobytes() != other[0].tobytes()
    assert np.isfinite(first[0]).all() and first[0].std() > 0.5
    # The same digest in another process gives the same bytes.
    code = (
        "import hashlib,sys;from vipu.emulator.serving import Signature,TensorSpec,outputs_for;"
        "s=Signature((),(TensorSpec('logits','FP16',(-1,1000)),));"
        "print(hashlib.sha256(outputs_for(s,3,b'request-1')[0].tobytes()).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == hashlib.sha256(first[0].tobytes()).hexdigest()
    with pytest.raises(ValueError):
        outputs_for(sig, 0, b"x")


def test_a_model_that_does_not_fit_the_replica_is_a_compile_error_naming_the_stage() -> None:
    spec = WorkloadSpec(model="bert-large", task="infer", seq_len=384)
    with pytest.raises(CompileError) as exc:
        serve_plan(spec, machine="c2", ipus=1, max_batch_size=1)
    err = exc.value
    assert err.stage == 0 and err.needed_bytes is not None and err.available_bytes is not None
    assert err.needed_bytes > err.available_bytes == MACHINES[MachineType.C2].sram_bytes
    assert "stage 0 of 1" in err.message and "304 MB" in err.message
    # More IPUs hold it, as the error suggests; auto finds the fewest that hold the batch asked.
    ipus = choose_serving_ipus(spec, machine="c2", max_batch_size=16)
    assert serve_plan(spec, machine="c2", ipus=ipus, max_batch_size=16).max_batch_size == 16
    smaller = ipus // 2
    try:
        assert serve_plan(spec, machine="c2", ipus=smaller, max_batch_size=16).max_batch_size < 16
    except CompileError:
        pass


def test_the_largest_batch_is_what_fits_and_no_more() -> None:
    spec = WorkloadSpec(model="bert-large", task="infer", seq_len=384)
    sp = serve_plan(spec, machine="m2000", ipus=1, max_batch_size=64)
    assert 1 < sp.max_batch_size < 64
    assert sp.memory_per_ipu_bytes <= MACHINES[MachineType.M2000].sram_bytes
    with pytest.raises(ValueError, match=f"1 to {sp.max_batch_size}"):
        sp.latency_s(sp.max_batch_size + 1)
    # Asking for exactly what fits gives the same layout; asking for less caps there.
    assert serve_plan(spec, machine="m2000", ipus=1, max_batch_size=sp.max_batch_size).max_batch_size == (
        sp.max_batch_size
    )
    assert serve_plan(spec, machine="m2000", ipus=1, max_batch_size=4).max_batch_size == 4
    # Two IPUs hold more: a pipeline or two copies of it.
    assert serve_plan(spec, machine="m2000", ipus=2, max_batch_size=64).max_batch_size > sp.max_batch_size


def test_bad_requests_are_refused() -> None:
    with pytest.raises(WorkloadError) as exc:
        serve_plan(WorkloadSpec(model="resnet50", task="train"), machine="m2000", ipus=1, max_batch_size=8)
    assert exc.value.field == "task"
    spec = TRIO["resnet50"]
    for bad in (0, 65_537, 2.0, True):
        with pytest.raises(ValueError):
            serve_plan(spec, machine="m2000", ipus=1, max_batch_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power of two"):
        serve_plan(spec, machine="m2000", ipus=3, max_batch_size=8)
    with pytest.raises(ValueError, match="at most 16"):
        serve_plan(spec, machine="c2", ipus=32, max_batch_size=8)


def test_the_executable_key_is_stable_across_processes_and_names_the_layout() -> None:
    spec = TRIO["bert-base"]
    key = serve_plan(spec, machine="m2000", ipus=1, max_batch_size=16).executable_key
    code = (
        "from vipu.emulator import WorkloadSpec, serve_plan;"
        "s=WorkloadSpec(model='bert-base',task='infer',seq_len=128);"
        "print(serve_plan(s,machine='m2000',ipus=1,max_batch_size=16).executable_key)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == key
    others = {
        serve_plan(spec, machine="bow", ipus=1, max_batch_size=16).executable_key,
        serve_plan(spec, machine="m2000", ipus=1, max_batch_size=8).executable_key,
        serve_plan(spec, machine="m2000", ipus=2, max_batch_size=16).executable_key,
        serve_plan(
            WorkloadSpec(model="bert-base", task="infer", seq_len=384),
            machine="m2000",
            ipus=1,
            max_batch_size=16,
        ).executable_key,
        plan(
            WorkloadSpec(model="bert-base", task="infer", seq_len=128, batch_size=16), 1, "m2000"
        ).executable_key,
    }
    assert key not in others and len(others) == 5


def test_the_plan_says_what_the_lead_needs_and_per_batch_times_are_cheap() -> None:
    sp = serve_plan(TRIO["resnet50"], machine="m2000", ipus=4, max_batch_size=64)
    d = sp.to_dict()
    for k in (
        "model",
        "machine",
        "ipus",
        "precision",
        "max_batch_size",
        "compile_s",
        "load_s",
        "executable_key",
        "host_call_s",
        "signature",
        "pipeline_stages",
        "replicas",
    ):
        assert k in d, k
    assert d["ipus"] == 4 == sp.pipeline_stages * sp.replicas
    assert json.loads(json.dumps(d)) == d
    assert sp.compile_s > 60 and sp.load_s > 10
    # Four copies of ResNet-50 share a batch: a batch of 64 takes what 16 take on one IPU.
    one = serve_plan(TRIO["resnet50"], machine="m2000", ipus=1, max_batch_size=64)
    assert sp.replicas == 4 and sp.device_s(64) == pytest.approx(one.device_s(16))
    start = time.perf_counter()
    for _ in range(10_000):
        sp.latency_s(37)
        sp.step_s(37)
    assert time.perf_counter() - start < 0.5
