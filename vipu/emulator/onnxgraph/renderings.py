"""The catalogue's models written as ONNX graphs with ``onnx.helper``, without weights.

Each rendering is the network a framework would export for the catalogue entry
(``vipu/emulator/catalogue/``), the way ``torch.onnx.export`` writes it: standard ONNX operators,
biases as separate inputs, inputs with a dynamic batch axis (and a dynamic sequence axis for the NLP
and time-series models). Weights are initializers with their shapes and no data (marked as stripped
external data), exactly what the CLI uploads. They serve three purposes: the parity check (an
uploaded graph plans like the catalogue entry it renders: ``tests/emulator/test_onnx_parity.py`` and
``benchmarks/onnx_parity.py``), examples for users, and test inputs.

``fused=False`` writes LayerNorm and GELU as the primitive operators older exporters emit
(ReduceMean, Sub, Pow, Sqrt, Div, ...; Div, Erf, Add, Mul), to check that they plan like the fused ones.

Not rendered: ``mcmc`` (a sampler, not a network a framework exports), and BERT's sequence packing at 512
(a property of the data fed to the graph, not of the graph).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import TensorProto, helper

from vipu.emulator.catalogue import get_workload, nlp, recommendation, series, vision
from vipu.emulator.graph import Task
from vipu.emulator.onnxgraph.strip import STRIPPED_LOCATION

OPSET = 20
RENDERED = (
    "bert-base",
    "bert-large",
    "resnet50",
    "resnext101",
    "efficientnet-b0",
    "efficientnet-b4",
    "lstm",
    "gru",
    "deep-autoencoder",
)

_F = TensorProto.FLOAT


@dataclass
class _Builder:
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    weights: list[onnx.TensorProto] = field(default_factory=list)
    counter: int = 0

    def name(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}_{self.counter}"

    def weight(self, hint: str, dims: list[int]) -> str:
        """A float initializer without its data: dims and type only, marked as stripped."""
        name = self.name(hint)
        t = TensorProto(name=name, data_type=_F, dims=dims)
        t.data_location = TensorProto.EXTERNAL
        entry = t.external_data.add()
        entry.key, entry.value = "location", STRIPPED_LOCATION
        self.weights.append(t)
        return name

    def const(self, hint: str, values: list[float] | list[int], dtype: int = _F, scalar: bool = False) -> str:
        name = self.name(hint)
        self.weights.append(helper.make_tensor(name, dtype, [] if scalar else [len(values)], values))
        return name

    def scalar(self, value: float) -> str:
        return self.const("scalar", [value], scalar=True)

    def ints(self, values: list[int]) -> str:
        return self.const("shape", values, TensorProto.INT64)

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name(op), **attrs))
        return outs

    def op(self, op: str, *inputs: str, **attrs: object) -> str:
        return self.node(op, list(inputs), 1, **attrs)[0]

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[str]) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, _F, None) for o in outputs]
        graph = helper.make_graph(self.nodes, name, inputs, outs, self.weights)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ipucloud renderings"
        )
        # Declare the outputs' shapes as an exporter does (symbolic in the batch and sequence).
        inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.output}
        for out in model.graph.output:
            if out.name in inferred:
                out.type.CopyFrom(inferred[out.name].type)
        return model


# ------------------------------------------------------------------------------------------ building blocks


def _linear(b: _Builder, x: str, fan_in: int, fan_out: int, hint: str) -> str:
    y = b.op("MatMul", x, b.weight(f"{hint}.weight", [fan_in, fan_out]))
    return b.op("Add", y, b.weight(f"{hint}.bias", [fan_out]))


def _layernorm(b: _Builder, x: str, hidden: int, fused: bool) -> str:
    gamma, beta = b.weight("ln.weight", [hidden]), b.weight("ln.bias", [hidden])
    if fused:
        return b.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=1e-12)
    axes = b.ints([-1])
    mean = b.op("ReduceMean", x, axes)
    centred = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Pow", centred, b.scalar(2.0)), axes)
    std = b.op("Sqrt", b.op("Add", var, b.scalar(1e-12)))
    return b.op("Add", b.op("Mul", b.op("Div", centred, std), gamma), beta)


def _gelu(b: _Builder, x: str, fused: bool) -> str:
    if fused:
        return b.op("Gelu", x)
    erf = b.op("Erf", b.op("Div", x, b.scalar(math.sqrt(2.0))))
    return b.op("Mul", b.op("Mul", x, b.op("Add", erf, b.scalar(1.0))), b.scalar(0.5))


def _dropout(b: _Builder, x: str) -> str:
    return b.op("Dropout", x, b.scalar(0.1))


# -------------------------------------------------------------------------------------------------- BERT


def bert(name: str, task: Task = "infer", seq_len: int = 128, fused: bool = True) -> onnx.ModelProto:
    """BERT with the catalogue's heads: MLM + NSP when training at 128 or 512, SQuAD's span head otherwise."""
    w = get_workload(name)
    arch: dict[str, Any] = dict(w.architecture)  # BERT's entries are all integers
    hidden, layers, heads = int(arch["hidden"]), int(arch["layers"]), int(arch["heads"])
    ffn, head_dim = 4 * hidden, hidden // heads
    pretraining = task == "train" and seq_len in (128, 512)
    b = _Builder()
    seq = "sequence"
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", seq])
        for n in ("input_ids", "token_type_ids", "attention_mask")
    ]
    word = b.weight("word_embeddings", [nlp.BERT_VOCAB, hidden])
    x = b.op("Gather", word, "input_ids")
    x = b.op(
        "Add",
        x,
        b.op("Gather", b.weight("token_type_embeddings", [nlp.BERT_TOKEN_TYPES, hidden]), "token_type_ids"),
    )
    # Position ids follow from the sequence length alone: a constant once the length is known.
    length = b.op("Gather", b.op("Shape", "input_ids"), b.ints([1]))
    positions = b.op(
        "Range",
        b.const("zero", [0], TensorProto.INT64, scalar=True),
        b.op("Squeeze", length),
        b.const("one", [1], TensorProto.INT64, scalar=True),
    )
    x = b.op(
        "Add", x, b.op("Gather", b.weight("position_embeddings", [nlp.BERT_MAX_POSITIONS, hidden]), positions)
    )
    x = _dropout(b, _layernorm(b, x, hidden, fused))
    mask = b.op("Unsqueeze", b.op("Cast", "attention_mask", to=_F), b.ints([1, 2]))
    mask = b.op("Mul", b.op("Sub", b.scalar(1.0), mask), b.scalar(-10000.0))
    split = b.ints([hidden, hidden, hidden])
    for _ in range(layers):
        qkv = _linear(b, x, hidden, 3 * hidden, "attention.qkv")
        q, k, v = b.node("Split", [qkv, split], 3, axis=-1)
        shape = b.ints([0, 0, heads, head_dim])
        q = b.op("Transpose", b.op("Reshape", q, shape), perm=[0, 2, 1, 3])
        k = b.op("Transpose", b.op("Reshape", k, shape), perm=[0, 2, 3, 1])
        v = b.op("Transpose", b.op("Reshape", v, shape), perm=[0, 2, 1, 3])
        scores = b.op("Add", b.op("Div", b.op("MatMul", q, k), b.scalar(math.sqrt(head_dim))), mask)
        probs = _dropout(b, b.op("Softmax", scores, axis=-1))
        ctx = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", ctx, b.ints([0, 0, hidden]))
        attn = _dropout(b, _linear(b, ctx, hidden, hidden, "attention.output"))
        x = _layernorm(b, b.op("Add", attn, x), hidden, fused)
        inner = _gelu(b, _linear(b, x, hidden, ffn, "intermediate"), fused)
        out = _dropout(b, _linear(b, inner, ffn, hidden, "output"))
        x = _layernorm(b, b.op("Add", out, x), hidden, fused)
    if pretraining:
        masked = math.ceil(nlp.MASKED_FRACTION * seq_len)
        inputs.append(
            helper.make_tensor_value_info("masked_lm_positions", TensorProto.INT32, ["batch", masked])
        )
        picked = b.op(
            "GatherElements",
            x,
            b.op(
                "Expand", b.op("Unsqueeze", "masked_lm_positions", b.ints([2])), b.ints([1, masked, hidden])
            ),
            axis=1,
        )
        t = _layernorm(b, _gelu(b, _linear(b, picked, hidden, hidden, "mlm.transform"), fused), hidden, fused)
        logits = b.op(
            "Add",
            b.op("MatMul", t, b.op("Transpose", word, perm=[1, 0])),
            b.weight("mlm.bias", [nlp.BERT_VOCAB]),
        )
        mlm = b.op("Softmax", logits, axis=-1)
        first = b.op("Gather", x, b.const("cls", [0], TensorProto.INT64), axis=1)
        pooled = b.op("Tanh", _linear(b, first, hidden, hidden, "pooler"))
        nsp = _linear(b, pooled, hidden, 2, "nsp")
        outputs = [mlm, nsp]
    else:
        span = b.op("Softmax", _linear(b, x, hidden, 2, "qa_outputs"), axis=1)
        outputs = [span]
    return b.model(name, inputs, outputs)


# -------------------------------------------------------------------------------------------------- CNNs


def _conv(
    b: _Builder, x: str, cin: int, cout: int, k: int, stride: int, groups: int = 1, bias: bool = False
) -> str:
    args = [x, b.weight("conv.weight", [cout, cin // groups, k, k])]
    if bias:
        args.append(b.weight("conv.bias", [cout]))
    pad = k // 2
    return b.op(
        "Conv", *args, kernel_shape=[k, k], strides=[stride, stride], pads=[pad, pad, pad, pad], group=groups
    )


def _bn(b: _Builder, x: str, channels: int) -> str:
    params = [b.weight(f"bn.{p}", [channels]) for p in ("weight", "bias", "running_mean", "running_var")]
    return b.op("BatchNormalization", x, *params, epsilon=1e-5)


def _swish(b: _Builder, x: str) -> str:
    return b.op("Mul", x, b.op("Sigmoid", x))


def _image_input(b: _Builder, size: int) -> tuple[list[onnx.ValueInfoProto], str]:
    # 8-bit images from the host, as the catalogue (and Graphcore's CNN recipes) stream them.
    inputs = [helper.make_tensor_value_info("images", TensorProto.UINT8, ["batch", 3, size, size])]
    return inputs, b.op("Cast", "images", to=_F)


def _classifier(b: _Builder, x: str, channels: int) -> str:
    pooled = b.op("Flatten", b.op("GlobalAveragePool", x))
    logits = b.op(
        "Gemm",
        pooled,
        b.weight("fc.weight", [vision.IMAGENET_CLASSES, channels]),
        b.weight("fc.bias", [vision.IMAGENET_CLASSES]),
        transB=1,
    )
    return b.op("Softmax", logits, axis=-1)


def resnet(name: str) -> onnx.ModelProto:
    """ResNet-50 v1.5 or ResNeXt-101 32x4d, as torchvision builds them."""
    if name == "resnet50":
        blocks, widths, groups = (3, 4, 6, 3), (64, 128, 256, 512), 1
    else:
        blocks, widths, groups = (3, 4, 23, 3), (128, 256, 512, 1024), 32
    b = _Builder()
    inputs, x = _image_input(b, 224)
    x = b.op("Relu", _bn(b, _conv(b, x, 3, 64, 7, 2), 64))
    x = b.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (count, width) in enumerate(zip(blocks, widths, strict=True)):
        cout = 256 * 2**stage
        for i in range(count):
            stride = 2 if i == 0 and stage > 0 else 1
            y = b.op("Relu", _bn(b, _conv(b, x, cin, width, 1, 1), width))
            y = b.op("Relu", _bn(b, _conv(b, y, width, width, 3, stride, groups), width))
            y = _bn(b, _conv(b, y, width, cout, 1, 1), cout)
            shortcut = _bn(b, _conv(b, x, cin, cout, 1, stride), cout) if i == 0 else x
            x = b.op("Relu", b.op("Add", y, shortcut))
            cin = cout
    return b.model(name, inputs, [_classifier(b, x, cin)])


def efficientnet(name: str) -> onnx.ModelProto:
    """EfficientNet-B0 or -B4 (MBConv blocks with squeeze-and-excitation), as the reference builds them."""
    width, depth, image = (1.0, 1.0, 224) if name == "efficientnet-b0" else (1.4, 1.8, 380)
    b = _Builder()
    inputs, x = _image_input(b, image)
    stem = vision.round_filters(32, width)
    x = _swish(b, _bn(b, _conv(b, x, 3, stem, 3, 2), stem))
    cin = stem
    for expand, k, stride, base_out, repeats in vision.EFFNET_B0:
        cout = vision.round_filters(base_out, width)
        for i in range(math.ceil(depth * repeats)):
            s = stride if i == 0 else 1
            mid = cin * expand
            squeeze = max(1, int(cin * 0.25))
            y = x
            if expand != 1:
                y = _swish(b, _bn(b, _conv(b, y, cin, mid, 1, 1), mid))
            y = _swish(b, _bn(b, _conv(b, y, mid, mid, k, s, groups=mid), mid))
            se = b.op("GlobalAveragePool", y)
            se = _swish(b, _conv(b, se, mid, squeeze, 1, 1, bias=True))
            se = b.op("Sigmoid", _conv(b, se, squeeze, mid, 1, 1, bias=True))
            y = _bn(b, _conv(b, b.op("Mul", y, se), mid, cout, 1, 1), cout)
            if s == 1 and cin == cout:
                y = b.op("Add", y, x)
            x, cin = y, cout
    head = vision.round_filters(1280, width)
    x = _swish(b, _bn(b, _conv(b, x, cin, head, 1, 1), head))
    return b.model(name, inputs, [_classifier(b, x, head)])


# --------------------------------------------------------------------------------- time series, autoencoder


def rnn(name: str) -> onnx.ModelProto:
    """The catalogue's two-layer LSTM or GRU forecaster: a window of readings in, the next reading out."""
    op, gates = ("LSTM", 4) if name == "lstm" else ("GRU", 3)
    h, features = series.SERIES_HIDDEN, series.SERIES_FEATURES
    b = _Builder()
    inputs = [helper.make_tensor_value_info("window", _F, ["batch", "time", features])]
    x = b.op("Transpose", "window", perm=[1, 0, 2])  # ONNX recurrent ops take time first
    fan_in = features
    for layer in range(series.SERIES_LAYERS):
        weights = [
            b.weight(f"{op}.W", [1, gates * h, fan_in]),
            b.weight(f"{op}.R", [1, gates * h, h]),
            b.weight(f"{op}.B", [1, 2 * gates * h]),
        ]
        extra = {"linear_before_reset": 1} if op == "GRU" else {}
        y, y_h = b.node(op, [x, *weights], 2, hidden_size=h, **extra)
        x = b.op("Squeeze", y, b.ints([1])) if layer + 1 < series.SERIES_LAYERS else y_h
        fan_in = h
    last = b.op("Squeeze", x, b.ints([0]))
    forecast = b.op(
        "Gemm", last, b.weight("head.weight", [features, h]), b.weight("head.bias", [features]), transB=1
    )
    return b.model(name, inputs, [forecast])


def autoencoder(name: str = "deep-autoencoder") -> onnx.ModelProto:
    items = recommendation.AUTOENCODER_ITEMS
    hidden = recommendation.AUTOENCODER_HIDDEN
    widths = (items, *hidden, *reversed(hidden[:-1]), items)
    b = _Builder()
    inputs = [helper.make_tensor_value_info("ratings", TensorProto.UINT8, ["batch", items])]
    x = b.op("Cast", "ratings", to=_F)
    for fan_in, fan_out in itertools.pairwise(widths):
        x = b.op(
            "Selu",
            b.op(
                "Gemm",
                x,
                b.weight("dense.weight", [fan_out, fan_in]),
                b.weight("dense.bias", [fan_out]),
                transB=1,
            ),
        )
        if fan_out == hidden[-1]:
            x = _dropout(b, x)
    return b.model(name, inputs, [x])


def render(
    name: str, task: Task = "infer", seq_len: int | None = None, fused: bool = True
) -> onnx.ModelProto:
    """The ONNX rendering of catalogue workload ``name`` (see ``RENDERED``)."""
    if name.startswith("bert"):
        return bert(name, task, seq_len or 128, fused)
    if name in ("resnet50", "resnext101"):
        return resnet(name)
    if name.startswith("efficientnet"):
        return efficientnet(name)
    if name in ("lstm", "gru"):
        return rnn(name)
    if name == "deep-autoencoder":
        return autoencoder(name)
    raise ValueError(f"no ONNX rendering of {name!r}; rendered: {', '.join(RENDERED)}")


def render_bytes(name: str, task: Task = "infer", seq_len: int | None = None, fused: bool = True) -> bytes:
    return render(name, task, seq_len, fused).SerializeToString()
