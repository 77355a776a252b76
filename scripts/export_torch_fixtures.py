"""Export small PyTorch models to ONNX, weights stripped, as the fixtures in ``tests/fixtures/torch/``.

The tests in ``tests/models/test_torch_exports.py`` check that graphs *PyTorch* writes (not ones built
with ``onnx.helper``) are taken, counted and run: a user's path from ``torch.onnx.export`` to a job.
PyTorch is not a dependency of ipucloud, so this script's outputs are committed and the tests need no
torch; run it again only to refresh them (a new torch, another model). It needs a separate environment
with torch and onnx, outside the project's ``.venv``:

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu   # or a wheel
    /tmp/torchvenv/bin/pip install onnx onnxscript    # onnxscript: the default (dynamo) exporter needs it
    PYTHONPATH=. /tmp/torchvenv/bin/python scripts/export_torch_fixtures.py

Each model is exported as a user would, in evaluation mode with dynamic batch (and sequence) axes, twice:
``NAME.onnx`` by the default exporter (``torch.onnx.export``, torch.export based since torch 2.9, at its
default opset) and ``NAME-torchscript.onnx`` by the TorchScript one (``dynamo=False``, opset 17). Each is
written with its weights to a temporary file, then stripped by ``vipu.emulator.onnxgraph.strip``, the code
the CLI runs before an upload, so a fixture is the graph ``ipucloud models push`` would send. Before export
the weights are perturbed (``as_if_trained``): exporters keep one initializer for equal tensors, which a
freshly initialised model is full of. ``tests/fixtures/torch/manifest.json`` records, for each, what torch
says about the model: its version, the opset, ``sum(p.numel() for p in model.parameters())`` and the
forward multiply-accumulates per sample counted from the modules' shapes (forward hooks: Linear, Conv2d,
LSTM, and MultiheadAttention's projections and QK^T/AV), for the tests to compare with the emulator's view.

The default exporter records each node's Python stack trace in the graph (``metadata_props``: three
quarters of a stripped ``encoder.onnx``), with this script's paths and line numbers, so running it again
from elsewhere, or after editing it, changes those bytes but not the graph (and not what is uploaded:
stripping drops those notes, vipu/emulator/onnxgraph/strip.py).

- ``encoder``: ``nn.Embedding`` + learned positions + ``nn.TransformerEncoder`` (2 layers, d_model 256, 4
  heads, GELU) + mean pooling + a classification head: ``LayerNormalization`` as one operator,
  attention as PyTorch writes it (MatMul, scaled Softmax, per-head reshapes).
- ``resnet``: a mini ResNet (Conv2d/BatchNorm2d/ReLU stem, MaxPool, three basic blocks with residual adds,
  one with a strided 1x1 downsample, AdaptiveAvgPool2d, Linear) on 3x64x64 images.
- ``lstm``: ``nn.Embedding`` + a two-layer ``nn.LSTM`` (batch first) + a Linear head on the last step.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vipu.emulator.onnxgraph.strip import strip_file  # noqa: E402  (after the path is set)

OUT = ROOT / "tests" / "fixtures" / "torch"
TORCHSCRIPT_OPSET = 17
SEQ = 128  # the sequence length the manifest's per-sample MACs are counted at
MAX_FIXTURE_BYTES = 512 * 1024


class Encoder(nn.Module):
    """A small BERT-like classifier: token + position embeddings, 2 encoder layers, mean pool, head."""

    def __init__(self, vocab: int = 1000, d_model: int = 256, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(512, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, dropout=0.1, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.tokens(input_ids) + self.positions(positions)
        x = self.encoder(x)
        return self.head(self.norm(x.mean(dim=1)))


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + self.down(x))


class MiniResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.blocks = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(images))), 1))


class LstmClassifier(nn.Module):
    def __init__(self, vocab: int = 1000, embed: int = 64, hidden: int = 128, classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(input_ids))
        return self.head(out[:, -1, :])


def forward_macs(model: nn.Module, example: torch.Tensor) -> dict[str, int]:
    """Multiply-accumulates of one forward pass of ``example`` (one sample), by module kind."""
    counts: dict[str, int] = {}

    def add(kind: str, n: int) -> None:
        counts[kind] = counts.get(kind, 0) + int(n)

    def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
        if isinstance(module, nn.Linear):
            add("linear", output.numel() * module.in_features)
        elif isinstance(module, nn.Conv2d):
            per_output = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            add("conv", output.numel() * per_output)
        elif isinstance(module, nn.LSTM):
            x = inputs[0]
            steps = x.shape[1] if module.batch_first else x.shape[0]
            h = module.hidden_size
            for layer in range(module.num_layers):
                fan_in = module.input_size if layer == 0 else h
                add("lstm", steps * 4 * h * (fan_in + h))
        elif isinstance(module, nn.MultiheadAttention):
            q = inputs[0]
            seq, e = (q.shape[1], q.shape[2]) if module.batch_first else (q.shape[0], q.shape[2])
            # Q, K, V and output projections (the out_proj Linear is used by weight, so no hook sees it),
            # then QK^T and AV over all heads.
            add("attention_projections", 4 * seq * e * e)
            add("attention_scores", 2 * seq * seq * e)

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
    return counts


def as_if_trained(model: nn.Module) -> nn.Module:
    """Give every parameter and statistic distinct values, as training would.

    A freshly initialised model has equal tensors (``nn.TransformerEncoder`` deep-copies one layer, every
    LayerNorm starts at ones and zeros, BatchNorm's statistics at zeros and ones), and the exporter keeps
    one initializer for equal tensors: the graph would share weights a trained model does not, and the
    emulator, which counts a shared weight once (a tied embedding), would count fewer parameters.
    """
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def export(
    name: str,
    model: nn.Module,
    example: torch.Tensor,
    input_name: str,
    dynamic: dict[int, tuple[str, int | None]],
    describe: str,
    *,
    dynamo: bool,
    extra: Callable[[nn.Module], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Export ``model`` as a user would, strip its weights, write it to ``OUT``; its manifest entry."""
    torch.manual_seed(0)
    as_if_trained(model).eval()
    path = OUT / f"{name}.onnx"
    axes = {axis: label for axis, (label, _) in dynamic.items()}
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / f"{name}.onnx"
        if dynamo:
            # The default exporter since torch 2.9 (torch.export, then onnxscript), at its default opset.
            shapes = {
                axis: torch.export.Dim(label, max=top or 65_536) for axis, (label, top) in dynamic.items()
            }
            torch.onnx.export(
                model,
                (example,),
                str(full),
                input_names=[input_name],
                output_names=["logits"],
                dynamic_shapes={input_name: shapes},
                dynamo=True,
                external_data=False,
            )
        else:
            torch.onnx.export(
                model,
                (example,),
                str(full),
                input_names=[input_name],
                output_names=["logits"],
                dynamic_axes={input_name: axes, "logits": {0: axes[0]}},
                opset_version=TORCHSCRIPT_OPSET,
                dynamo=False,
            )
        onnx.checker.check_model(str(full))
        stripped = strip_file(full)
        path.write_bytes(stripped.data)
    if len(stripped.data) > MAX_FIXTURE_BYTES:
        raise SystemExit(f"{path}: {len(stripped.data):,} bytes, more than {MAX_FIXTURE_BYTES:,}")
    graph = onnx.load_from_string(stripped.data)
    ops: dict[str, int] = {}
    for node in graph.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    macs = forward_macs(model, example[:1])
    entry: dict[str, Any] = {
        "file": path.name,
        "model": describe,
        "exporter": "dynamo (torch.export)" if dynamo else "torchscript (dynamo=False)",
        "opset": next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")),
        "input": {"name": input_name, "shape": list(example.shape), "dynamic_axes": axes},
        "dims": {label: int(example.shape[axis]) for axis, (label, _) in dynamic.items() if axis != 0},
        "exported_bytes": stripped.original_bytes,
        "stripped_bytes": len(stripped.data),
        "operators": dict(sorted(ops.items())),
        "torch_parameters": sum(p.numel() for p in model.parameters()),
        "forward_macs_per_sample": sum(macs.values()),
        "forward_macs_by_kind": macs,
        "forward_matmul_flops_per_sample": 2 * sum(macs.values()),
    }
    if extra is not None:
        entry.update(extra(model))
    return entry


def batchnorm_channels(model: nn.Module) -> dict[str, Any]:
    return {
        "batchnorm_channels": sum(m.num_features for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (2, SEQ))
    images = torch.randn(2, 3, 64, 64)
    tokens = {0: ("batch", None), 1: ("sequence", 512)}
    models = []
    for suffix, dynamo in (("", True), ("-torchscript", False)):
        models += [
            export(
                f"encoder{suffix}",
                Encoder(),
                ids,
                "input_ids",
                tokens,
                "Embedding + positions + TransformerEncoder(2 x d_model 256, 4 heads, GELU) + pool + Linear",
                dynamo=dynamo,
            ),
            export(
                f"resnet{suffix}",
                MiniResNet(),
                images,
                "images",
                {0: ("batch", None)},
                "mini ResNet: Conv/BatchNorm/ReLU stem, MaxPool, 3 basic blocks (32-128), avg pool, Linear",
                dynamo=dynamo,
                extra=batchnorm_channels,
            ),
            export(
                f"lstm{suffix}",
                LstmClassifier(),
                ids,
                "input_ids",
                tokens,
                "Embedding(1000, 64) + LSTM(64, 128, 2 layers, batch first) + Linear on the last step",
                dynamo=dynamo,
            ),
        ]
    manifest = {
        "generated_by": "scripts/export_torch_fixtures.py",
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "mode": "evaluation (model.eval())",
        "weights": "stripped by vipu.emulator.onnxgraph.strip (as `ipucloud models push` does)",
        "macs_counted_at": {"batch": 1, "sequence": SEQ},
        "models": {m["file"].removesuffix(".onnx"): m for m in models},
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for m in models:
        print(
            f"{m['file']}: {m['stripped_bytes']:,} bytes (exported {m['exported_bytes']:,}), "
            f"opset {m['opset']}, {m['torch_parameters']:,} parameters, "
            f"{m['forward_macs_per_sample']:,} MACs/sample"
        )


if __name__ == "__main__":
    main()
