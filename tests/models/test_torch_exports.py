"""Graphs PyTorch itself exported (``tests/fixtures/torch/``, made by ``scripts/export_torch_fixtures.py``;
no torch needed here): taken, counted as torch counts them, planned at other sizes, and run through the CLI.

Each model is there twice: from the default exporter (``torch.onnx.export``, torch.export based, since
torch 2.9) and from the TorchScript one (``dynamo=False``, opset 17). ``manifest.json`` holds what torch
said about each model: ``sum(p.numel())`` and the multiply-accumulates of one forward pass per sample.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.errors import InvalidModel
from scheduler.services.own_models import analyse
from tests.cli.test_cli_client import Cli
from tests.support.cloud import RunningCloud
from tests.support.services import seed
from vipu.emulator import WorkloadError, WorkloadSpec
from vipu.emulator.onnxgraph import OnnxWorkload, load_graph, strip_file
from vipu.emulator.onnxgraph.workload import lowered

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "torch"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
MODELS: dict[str, dict[str, Any]] = MANIFEST["models"]


def test_the_manifest_names_every_fixture_and_they_are_small() -> None:
    assert sorted(f"{name}.onnx" for name in MODELS) == sorted(p.name for p in FIXTURES.glob("*.onnx"))
    assert {m["exporter"].split()[0] for m in MODELS.values()} == {"dynamo", "torchscript"}
    for m in MODELS.values():
        size = (FIXTURES / m["file"]).stat().st_size
        assert size == m["stripped_bytes"] < 512 * 1024 < m["exported_bytes"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_torch_export_is_taken_and_counted_as_torch_counts_it(name: str) -> None:
    m = MODELS[name]
    # The path of POST /api/v1/models: strip, check, bind the upload's dims, describe.
    analysed = analyse(data=FIXTURES / m["file"], dims=m["dims"], elementwise=(), max_graph_bytes=2**20)
    summary = analysed.summary
    assert summary["unmodelled"] == [], summary["unmodelled"]
    assert summary["opset"] == m["opset"] and summary["batch_dim"] == "batch"
    assert summary["dynamic_dims"] == list(m["dims"])
    expected = m["torch_parameters"]
    if "batchnorm_channels" in m:
        # Exported in evaluation mode, every BatchNorm2d is folded into the convolution before it: its
        # weight and bias (two per channel, which torch counts) become that convolution's bias (one).
        assert "BatchNormalization" not in summary["operators"]
        expected -= m["batchnorm_channels"]
    assert summary["parameters"] == expected
    # Every multiply-accumulate torch's modules do, and no more, is a GEMM, convolution or cell here.
    graph = analysed.graph
    bindings = OnnxWorkload(graph, "m", default_dims=m["dims"]).bindings(None, {})
    low = lowered(graph, bindings, False)
    macs = sum(op.macs for layer in low.layers for op in layer.ops)
    assert macs == m["forward_macs_per_sample"]
    # The rest (embeddings, softmax, norms, activations, pooling) is a few percent more.
    flops = summary["forward_flops_per_sample"]
    assert 2 * macs < flops < 1.03 * 2 * macs
    assert summary["tasks"] == ["train", "infer"]


@pytest.mark.parametrize("name", ["encoder", "lstm"])
def test_the_default_exporters_graphs_plan_at_any_sequence_length(name: str) -> None:
    own = _workload(name)
    at = {
        seq: WorkloadSpec(model="m", task="infer", seq_len=seq, source=own).graph() for seq in (64, 128, 512)
    }
    macs = {seq: sum(op.macs for layer in g.layers for op in layer.ops) for seq, g in at.items()}
    assert macs[128] == MODELS[name]["forward_macs_per_sample"]
    if name == "lstm":  # linear in the length, but for the head on the last step
        assert macs[512] - macs[128] == 6 * (macs[128] - macs[64]) > 0
    else:  # attention's scores grow with its square
        per_layer = lambda s: s * (4 * 256**2 + 2 * 256 * 1024) + 2 * s * s * 256  # noqa: E731
        assert macs[512] == 2 * per_layer(512) + 256 * 4


def test_a_torchscript_attention_export_runs_only_at_the_length_it_was_traced_at() -> None:
    # PyTorch's TorchScript exporter records k.view(k.shape[0], ...) in nn.MultiheadAttention with the
    # traced length as a constant: ONNX Runtime fails on this graph at any other length. Planned there it
    # would be costed with wrong shapes, so it is refused, naming the Reshape.
    own = _workload("encoder-torchscript")
    assert WorkloadSpec(model="m", task="infer", seq_len=128, source=own).graph().flops_per_sample > 0
    with pytest.raises(WorkloadError, match=r"self_attn/Reshape.*\(Reshape\).*exported at") as exc:
        WorkloadSpec(model="m", task="infer", seq_len=384, source=own).graph()
    assert exc.value.field == "dims"
    with pytest.raises(InvalidModel, match="exported at"):
        analyse(
            data=FIXTURES / "encoder-torchscript.onnx",
            dims={"sequence": 64},
            elementwise=(),
            max_graph_bytes=2**20,
        )


def _workload(name: str) -> OnnxWorkload:
    graph = load_graph(strip_file(FIXTURES / MODELS[name]["file"]).data)
    return OnnxWorkload(graph, "m", default_dims=MODELS[name]["dims"])


# ------------------------------------------------------------------------------ the user's path, end to end


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home" / "ipucloud" / "config.json")


@pytest.fixture
def cloud(env: dict[str, str], db: Any, tmp_path: Path) -> Iterator[RunningCloud]:
    seeded = seed(db, pods=1)
    with RunningCloud.start(env, tmp_path, admin_key=seeded.admin_key) as running:
        yield running


@pytest.mark.e2e
def test_push_estimate_and_run_a_pytorch_export_through_the_cli(
    cloud: RunningCloud, cli: Cli, tmp_path: Path
) -> None:
    _, key = cloud.create_tenant("torch-user")
    assert cli("login", "--url", cloud.url, "--key", key).exit_code == 0
    path = str(FIXTURES / "encoder.onnx")
    m = MODELS["encoder"]

    pushed = cli.json("models", "push", path, "--dim", "sequence=128")
    assert pushed["name"] == "encoder" and pushed["parameters"] == m["torch_parameters"]
    assert pushed["unmodelled"] == [] and pushed["dims"] == {"sequence": 128}

    job = ["--model", "encoder", "--task", "train", "--batch-size", "256", "--ipus", "1"]
    local = cli.json("estimate", "--model-file", path, "--seq-len", "256", *job[2:], "--machine", "m2000")
    dry = cli.json("jobs", "submit", *job, "--seq-len", "256", "--steps", "20", "--dry-run")
    assert dry["fits"] and local["fits"]
    assert dry["throughput"] == pytest.approx(local["throughput"], rel=1e-9)
    assert dry["ipu_hours"] > 0 and dry["charged_ipu_hours"] >= dry["ipu_hours"]

    run = cli("jobs", "submit", *job, "--seq-len", "256", "--steps", "20", "--optimizer", "sgd", "--follow")
    assert run.exit_code == 0, (run.stdout, run.stderr)
    assert "succeeded" in run.stderr
