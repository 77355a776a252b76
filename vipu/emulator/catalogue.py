"""The workload catalogue: each model derived from its published architecture, layer by layer.

A model is a sequence of layers (the unit a pipeline stage boundary may fall between); a layer is a
tuple of operations, each of one kind (matmul, convolution, depthwise convolution, recurrent cell,
element-wise, embedding) with its GEMM shape or element count *per sample*, its parameters and the
activations it keeps for the backward pass. Parameter counts and FLOPs therefore come out of the
architecture, not out of a table: ``tests/emulator`` checks them against the papers' own totals.

Sources: BERT (Devlin et al., 2019), ResNet (He et al., 2016; v1.5 strides as in torchvision),
ResNeXt (Xie et al., 2017, 32x4d), EfficientNet (Tan & Le, 2019), DeepRecommender (Kuchaiev & Ginsburg,
2017), HMC (Neal, 2011). Sequence packing for BERT phase 2 follows Graphcore's reference recipe
(graphcore/examples ``nlp/bert/popart/configs/packed``; Krell et al., 2021).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Literal

Task = Literal["train", "infer"]
Precision = Literal["fp16", "fp32"]


class OpKind(StrEnum):
    MATMUL = "matmul"
    CONV = "conv"
    GROUPED_CONV = "grouped_conv"
    DEPTHWISE_CONV = "depthwise_conv"
    RECURRENT = "recurrent"
    ELEMENTWISE = "elementwise"
    EMBEDDING = "embedding"


GEMM_KINDS = frozenset({OpKind.MATMUL, OpKind.CONV, OpKind.GROUPED_CONV, OpKind.RECURRENT})

# BSP supersteps per op and pass. A GEMM or convolution spread over the tiles needs an exchange of its
# operands, the compute phase and a reduction of partial sums across tiles (three syncs); a depthwise
# convolution exchanges its input windows then computes (two); an element-wise op or an embedding
# gather runs as one compute set; a recurrent cell's time step is a GEMM plus its gate arithmetic. Each
# superstep costs time (a sync) and memory (its exchange program and vertex state on every tile).
SUPERSTEPS = {
    OpKind.MATMUL: 3,
    OpKind.CONV: 3,
    OpKind.GROUPED_CONV: 3,
    OpKind.DEPTHWISE_CONV: 2,
    OpKind.RECURRENT: 4,
    OpKind.ELEMENTWISE: 1,
    OpKind.EMBEDDING: 1,
}

# Element-operations per element for the element-wise work, counted as the arithmetic a vector unit
# issues (a load-compute-store pass is one): batch/layer norm computes mean, variance, normalise, scale
# and shift; softmax max, subtract, exp, sum, divide; GELU's tanh form about eight; swish a sigmoid
# (exp, add, reciprocal) and a multiply.
LAYERNORM_OPS = 8
BATCHNORM_OPS = 5
SOFTMAX_OPS = 5
GELU_OPS = 8
SWISH_OPS = 5
SELU_OPS = 6
RELU_OPS = 1
ADD_OPS = 1
DROPOUT_OPS = 3
LSTM_GATE_OPS = 5  # per gate element: sigmoid/tanh, the cell update's multiply-adds
GRU_GATE_OPS = 5


@dataclass(frozen=True, slots=True)
class Op:
    """One operation, sized per sample.

    GEMM kinds multiply an (m x k) by a (k x n) matrix ``groups`` times per sample, ``steps`` times in
    sequence (an RNN's time steps); ``m`` grows with the micro-batch. Element-wise and depthwise work is
    counted in ``elements`` (element-operations per sample per step). ``saved`` is what the op keeps for
    the backward pass, in activation elements per sample.
    """

    name: str
    kind: OpKind
    m: float = 0.0
    k: int = 0
    n: int = 0
    groups: int = 1
    steps: int = 1
    in_channels_per_group: int = 0
    elements: float = 0.0
    params: int = 0
    saved: float = 0.0

    @property
    def macs(self) -> float:
        if self.kind in GEMM_KINDS or self.kind is OpKind.DEPTHWISE_CONV:
            return self.m * self.k * self.n * self.groups * self.steps
        return 0.0

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample: two per multiply-accumulate plus the element-wise operations."""
        return 2.0 * self.macs + self.elements * self.steps


@dataclass(frozen=True, slots=True)
class Layer:
    """A unit of the model that a pipeline stage boundary may fall after."""

    name: str
    ops: tuple[Op, ...]
    input_elements: float
    """Activation elements per sample entering the layer: the recomputation checkpoint and what crosses
    IPU-Links when the previous layer sits on another IPU."""
    # Sums over the ops, computed once: the planner reads them for every candidate split.
    params: int = field(init=False, compare=False)
    flops: float = field(init=False, compare=False)
    saved: float = field(init=False, compare=False)
    max_op_saved: float = field(init=False, compare=False)
    supersteps: int = field(init=False, compare=False)
    """Supersteps of one forward pass (a recurrent op's loop body is compiled once)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "supersteps", sum(SUPERSTEPS[op.kind] for op in self.ops))
        object.__setattr__(self, "params", sum(op.params for op in self.ops))
        object.__setattr__(self, "flops", sum(op.flops for op in self.ops))
        object.__setattr__(self, "saved", sum(op.saved for op in self.ops))
        object.__setattr__(self, "max_op_saved", max(op.saved for op in self.ops))


@dataclass(frozen=True, slots=True)
class ModelGraph:
    """A workload instantiated for one task and sequence length: what the planner and timing model see."""

    workload: str
    task: Task
    seq_len: int | None
    image_size: int | None
    objective: str
    layers: tuple[Layer, ...]
    host_bytes_per_sample: float
    """Bytes per sample between host and IPU (inputs in; for samplers, the draws out)."""
    optimizer: str
    optimizer_ops_per_param: int
    optimizer_state_per_param: int
    """Optimizer state elements per trained parameter (Adam/LAMB: two moments; momentum SGD: one)."""
    trainable: bool = True
    samples_per_slot: float = 1.0
    """Samples one sequence slot carries: above 1 when short sequences are packed into one slot."""

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def flops_per_sample(self) -> float:
        """Forward FLOPs per sample (training costs about three times this, more with recomputation)."""
        return sum(layer.flops for layer in self.layers)

    @property
    def ops_count(self) -> int:
        return sum(len(layer.ops) for layer in self.layers)

    def breakdown(self) -> dict[str, dict[str, float]]:
        """Forward FLOPs, parameters and op count per operation kind."""
        out: dict[str, dict[str, float]] = {}
        for layer in self.layers:
            for op in layer.ops:
                row = out.setdefault(op.kind.value, {"flops": 0.0, "params": 0.0, "ops": 0.0})
                row["flops"] += op.flops
                row["params"] += op.params
                row["ops"] += 1
        return out


@dataclass(frozen=True, eq=False)
class Workload:
    """A catalogue entry: what a user may ask for, and how to build its graph."""

    name: str
    family: str
    description: str
    sample_unit: str
    tasks: tuple[Task, ...]
    task_notes: dict[str, str]
    default_batch_size: int
    min_batch_size: int
    max_batch_size: int
    seq_lens: tuple[int, ...]
    default_seq_len: int | None
    seq_len_meaning: str
    image_size: int | None
    precisions: tuple[Precision, ...]
    default_precision: Precision
    default_steps: int
    max_ipus_per_replica: int
    architecture: dict[str, object]
    references: tuple[str, ...]
    build: Callable[[Task, int | None], ModelGraph] = field(repr=False, compare=False)

    def graph(self, task: Task, seq_len: int | None = None) -> ModelGraph:
        return _graph(self.name, task, seq_len if seq_len is not None else self.default_seq_len)

    def to_dict(self) -> dict[str, object]:
        default_task: Task = self.tasks[0]
        graph = self.graph(default_task)
        flops: dict[str, float] = {}
        for task in self.tasks:
            g = self.graph(task)
            flops[task] = g.flops_per_sample * (3.0 if task == "train" else 1.0)
        return {
            "name": self.name,
            "family": self.family,
            "description": self.description,
            "sample_unit": self.sample_unit,
            "tasks": list(self.tasks),
            "task_notes": dict(self.task_notes),
            "default_batch_size": self.default_batch_size,
            "min_batch_size": self.min_batch_size,
            "max_batch_size": self.max_batch_size,
            "seq_lens": list(self.seq_lens),
            "default_seq_len": self.default_seq_len,
            "seq_len_meaning": self.seq_len_meaning,
            "image_size": self.image_size,
            "precisions": list(self.precisions),
            "default_precision": self.default_precision,
            "default_steps": self.default_steps,
            "max_ipus_per_replica": self.max_ipus_per_replica,
            "parameters": graph.params,
            "flops_per_sample": flops,
            "layers": len(graph.layers),
            "architecture": dict(self.architecture),
            "references": list(self.references),
        }


# --------------------------------------------------------------------------------------------- BERT

BERT_VOCAB = 30_522
BERT_MAX_POSITIONS = 512
BERT_TOKEN_TYPES = 2
MASKED_FRACTION = 0.15

# Graphcore's packed phase-2 recipe (configs/packed/packed_pretrain_large_512.json) carries the
# 16,384-sequence batch of the unpacked recipe in 9,600 packs of 512 tokens: Wikipedia sequences at
# this length leave so much padding that 16,384 / 9,600 = 1.707 of them fit a 512-token slot on
# average. Phase 1 (128) is run unpacked, as in the published phase-1 figure. A property of the data,
# not of the hardware.
BERT_SEQUENCES_PER_PACK = {512: 16_384 / 9_600}


def _bert_objective(task: Task, seq_len: int) -> str:
    if task == "infer":
        return "squad-inference"
    return "pretraining" if seq_len in (128, 512) else "squad-finetuning"


def _bert_graph(name: str, hidden: int, num_layers: int, heads: int, task: Task, seq_len: int) -> ModelGraph:
    objective = _bert_objective(task, seq_len)
    per_slot = BERT_SEQUENCES_PER_PACK.get(seq_len, 1.0) if objective == "pretraining" else 1.0
    h = hidden
    ffn = 4 * hidden
    head_dim = hidden // heads
    tokens = seq_len / per_slot  # tokens per sample (sequence)
    # Attention is computed over the whole slot (the mask keeps packed sequences apart), so its cost per
    # sequence is the slot's divided by the sequences it holds.
    attn_rows = seq_len / per_slot
    scores = heads * seq_len * seq_len / per_slot

    embedding_ops: list[Op] = [
        Op(
            "token, position and segment embedding gather",
            OpKind.EMBEDDING,
            elements=3 * tokens * h,
            params=(BERT_VOCAB + BERT_MAX_POSITIONS + BERT_TOKEN_TYPES) * h,
            saved=tokens * h,
        ),
        Op(
            "embedding layernorm + dropout",
            OpKind.ELEMENTWISE,
            elements=tokens * h * (LAYERNORM_OPS + DROPOUT_OPS),
            params=2 * h,
            saved=2 * tokens * h,
        ),
    ]
    if objective == "pretraining":
        masked = math.ceil(MASKED_FRACTION * seq_len) / per_slot
        # The MLM decoder is tied to the word embedding, so it lives on the embedding's IPU (Graphcore
        # places embedding and heads together on IPU 0, hence their 3-7-7-7 layer split).
        embedding_ops += [
            Op("mlm transform", OpKind.MATMUL, m=masked, k=h, n=h, params=h * h + h, saved=masked * h),
            Op(
                "mlm gelu + layernorm",
                OpKind.ELEMENTWISE,
                elements=masked * h * (GELU_OPS + LAYERNORM_OPS),
                params=2 * h,
                saved=2 * masked * h,
            ),
            Op(
                "mlm decoder (tied to word embedding)",
                OpKind.MATMUL,
                m=masked,
                k=h,
                n=BERT_VOCAB,
                params=BERT_VOCAB,
                saved=masked * BERT_VOCAB,
            ),
            Op(
                "mlm softmax cross-entropy",
                OpKind.ELEMENTWISE,
                elements=masked * BERT_VOCAB * SOFTMAX_OPS,
                saved=masked * BERT_VOCAB,
            ),
            Op("nsp pooler", OpKind.MATMUL, m=1, k=h, n=h, params=h * h + h, saved=h),
            Op("nsp classifier", OpKind.MATMUL, m=1, k=h, n=2, params=2 * h + 2, saved=2),
        ]
    layers: list[Layer] = [
        Layer(
            "embeddings" + (" + mlm/nsp heads" if objective == "pretraining" else ""),
            tuple(embedding_ops),
            input_elements=3 * tokens,
        )
    ]
    for i in range(num_layers):
        ops = (
            Op(
                "qkv projection",
                OpKind.MATMUL,
                m=tokens,
                k=h,
                n=3 * h,
                params=3 * h * h + 3 * h,
                saved=3 * tokens * h,
            ),
            Op(
                "attention scores QK^T",
                OpKind.MATMUL,
                m=attn_rows,
                k=head_dim,
                n=seq_len,
                groups=heads,
                saved=scores,
            ),
            Op("attention softmax", OpKind.ELEMENTWISE, elements=scores * SOFTMAX_OPS, saved=scores),
            Op(
                "attention context AV",
                OpKind.MATMUL,
                m=attn_rows,
                k=seq_len,
                n=head_dim,
                groups=heads,
                saved=tokens * h,
            ),
            Op(
                "attention output projection",
                OpKind.MATMUL,
                m=tokens,
                k=h,
                n=h,
                params=h * h + h,
                saved=tokens * h,
            ),
            Op(
                "residual + layernorm + dropout",
                OpKind.ELEMENTWISE,
                elements=tokens * h * (ADD_OPS + LAYERNORM_OPS + DROPOUT_OPS),
                params=2 * h,
                saved=2 * tokens * h,
            ),
            Op(
                "feed-forward in",
                OpKind.MATMUL,
                m=tokens,
                k=h,
                n=ffn,
                params=h * ffn + ffn,
                saved=tokens * ffn,
            ),
            Op("gelu", OpKind.ELEMENTWISE, elements=tokens * ffn * GELU_OPS, saved=tokens * ffn),
            Op("feed-forward out", OpKind.MATMUL, m=tokens, k=ffn, n=h, params=ffn * h + h, saved=tokens * h),
            Op(
                "residual + layernorm + dropout",
                OpKind.ELEMENTWISE,
                elements=tokens * h * (ADD_OPS + LAYERNORM_OPS + DROPOUT_OPS),
                params=2 * h,
                saved=2 * tokens * h,
            ),
        )
        layers.append(Layer(f"encoder {i + 1}", ops, input_elements=tokens * h))
    if objective != "pretraining":
        layers.append(
            Layer(
                "squad span head",
                (
                    Op(
                        "span classifier",
                        OpKind.MATMUL,
                        m=tokens,
                        k=h,
                        n=2,
                        params=2 * h + 2,
                        saved=2 * tokens,
                    ),
                    Op(
                        "span softmax",
                        OpKind.ELEMENTWISE,
                        elements=2 * tokens * SOFTMAX_OPS,
                        saved=2 * tokens,
                    ),
                ),
                input_elements=tokens * h,
            )
        )
    int_bytes = 4
    if objective == "pretraining":
        masked_per_sample = math.ceil(MASKED_FRACTION * seq_len) / per_slot
        # ids, segments, positions, attention mask; masked positions and labels; the NSP label.
        host_bytes = 4 * tokens * int_bytes + 2 * masked_per_sample * int_bytes + int_bytes
        optimizer, opt_ops = "lamb", 20
    elif objective == "squad-finetuning":
        host_bytes = 3 * tokens * int_bytes + 2 * int_bytes
        optimizer, opt_ops = "adam", 12
    else:
        host_bytes = 3 * tokens * int_bytes + 2 * tokens * 2  # inputs in, start/end logits out
        optimizer, opt_ops = "none", 0
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=seq_len,
        image_size=None,
        objective=objective,
        layers=tuple(layers),
        host_bytes_per_sample=host_bytes,
        optimizer=optimizer,
        optimizer_ops_per_param=opt_ops,
        optimizer_state_per_param=2,
        samples_per_slot=per_slot,
    )


# --------------------------------------------------------------------------------------------- CNNs


def _out(size: int, stride: int) -> int:
    # "same" padding: the output is the input divided by the stride, rounded up.
    return -(-size // stride)


def _conv(name: str, size: int, cin: int, cout: int, ksize: int, stride: int, groups: int = 1) -> Op:
    out = _out(size, stride)
    pixels = out * out
    cin_g = cin // groups
    cout_g = cout // groups
    if groups == 1:
        kind = OpKind.CONV
    elif groups == cin == cout:
        kind = OpKind.DEPTHWISE_CONV
    else:
        kind = OpKind.GROUPED_CONV
    return Op(
        name,
        kind,
        m=pixels,
        k=cin_g * ksize * ksize,
        n=cout_g,
        groups=groups,
        in_channels_per_group=cin_g,
        params=cin_g * ksize * ksize * cout,
        saved=pixels * cout,
    )


def _norm_act(name: str, size: int, channels: int, ops_per_element: int) -> Op:
    elements = size * size * channels
    return Op(
        name, OpKind.ELEMENTWISE, elements=elements * ops_per_element, params=2 * channels, saved=elements
    )


IMAGE_BYTES_PER_PIXEL = 3  # 8-bit RGB streamed from the host, as Graphcore's CNN recipes do ("eight_bit_io")
IMAGENET_CLASSES = 1000


def _classifier(size: int, channels: int) -> Layer:
    return Layer(
        "classifier",
        (
            Op("global average pool", OpKind.ELEMENTWISE, elements=size * size * channels, saved=channels),
            Op(
                "fully connected",
                OpKind.MATMUL,
                m=1,
                k=channels,
                n=IMAGENET_CLASSES,
                params=channels * IMAGENET_CLASSES + IMAGENET_CLASSES,
                saved=IMAGENET_CLASSES,
            ),
            Op(
                "softmax cross-entropy",
                OpKind.ELEMENTWISE,
                elements=IMAGENET_CLASSES * SOFTMAX_OPS,
                saved=IMAGENET_CLASSES,
            ),
        ),
        input_elements=size * size * channels,
    )


def _resnet_graph(
    name: str, blocks: tuple[int, ...], widths: tuple[int, ...], groups: int, task: Task, image: int
) -> ModelGraph:
    """ResNet v1.5 / ResNeXt bottlenecks: stride on the 3x3, a projection on each stage's first block."""
    layers: list[Layer] = []
    size = image
    stem_out = _out(size, 2)
    pooled = _out(stem_out, 2)
    layers.append(
        Layer(
            "stem",
            (
                _conv("conv 7x7/2", size, 3, 64, 7, 2),
                _norm_act("batchnorm + relu", stem_out, 64, BATCHNORM_OPS + RELU_OPS),
                Op(
                    "max pool 3x3/2",
                    OpKind.ELEMENTWISE,
                    elements=pooled * pooled * 64 * 9,
                    saved=pooled * pooled * 64,
                ),
            ),
            input_elements=size * size * 3,
        )
    )
    size = pooled
    cin = 64
    for stage, (count, width) in enumerate(zip(blocks, widths, strict=True)):
        cout = 256 * 2**stage
        for b in range(count):
            stride = 2 if (b == 0 and stage > 0) else 1
            out = _out(size, stride)
            ops = [
                _conv("conv 1x1 reduce", size, cin, width, 1, 1),
                _norm_act("batchnorm + relu", size, width, BATCHNORM_OPS + RELU_OPS),
                _conv("conv 3x3" + (" grouped" if groups > 1 else ""), size, width, width, 3, stride, groups),
                _norm_act("batchnorm + relu", out, width, BATCHNORM_OPS + RELU_OPS),
                _conv("conv 1x1 expand", out, width, cout, 1, 1),
                _norm_act("batchnorm", out, cout, BATCHNORM_OPS),
            ]
            if b == 0:
                ops += [
                    _conv("projection shortcut 1x1", size, cin, cout, 1, stride),
                    _norm_act("shortcut batchnorm", out, cout, BATCHNORM_OPS),
                ]
            ops.append(_norm_act("residual add + relu", out, cout, ADD_OPS + RELU_OPS))
            layers.append(
                Layer(f"stage {stage + 1} block {b + 1}", tuple(ops), input_elements=size * size * cin)
            )
            size = out
            cin = cout
    layers.append(_classifier(size, cin))
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=None,
        image_size=image,
        objective="imagenet-classification",
        layers=tuple(layers),
        host_bytes_per_sample=image * image * IMAGE_BYTES_PER_PIXEL,
        optimizer="sgd-momentum" if task == "train" else "none",
        optimizer_ops_per_param=4,
        optimizer_state_per_param=1,
    )


# EfficientNet-B0 stages: (expansion, kernel, stride, output channels, repeats), Tan & Le (2019) Table 1.
_EFFNET_B0 = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)


def _round_filters(filters: int, width: float) -> int:
    # The reference implementation's rounding: scale, round to a multiple of 8, never lose over 10%.
    scaled = filters * width
    rounded = max(8, int(scaled + 4) // 8 * 8)
    if rounded < 0.9 * scaled:
        rounded += 8
    return rounded


def _efficientnet_graph(name: str, width: float, depth: float, task: Task, image: int) -> ModelGraph:
    layers: list[Layer] = []
    size = image
    stem = _round_filters(32, width)
    out = _out(size, 2)
    layers.append(
        Layer(
            "stem",
            (
                _conv("conv 3x3/2", size, 3, stem, 3, 2),
                _norm_act("batchnorm + swish", out, stem, BATCHNORM_OPS + SWISH_OPS),
            ),
            input_elements=size * size * 3,
        )
    )
    size = out
    cin = stem
    for stage, (expand, ksize, stride, base_out, repeats) in enumerate(_EFFNET_B0):
        cout = _round_filters(base_out, width)
        for b in range(math.ceil(depth * repeats)):
            s = stride if b == 0 else 1
            mid = cin * expand
            o = _out(size, s)
            squeeze = max(1, int(cin * 0.25))
            ops: list[Op] = []
            if expand != 1:
                ops += [
                    _conv("expand conv 1x1", size, cin, mid, 1, 1),
                    _norm_act("batchnorm + swish", size, mid, BATCHNORM_OPS + SWISH_OPS),
                ]
            ops += [
                _conv(f"depthwise conv {ksize}x{ksize}", size, mid, mid, ksize, s, groups=mid),
                _norm_act("batchnorm + swish", o, mid, BATCHNORM_OPS + SWISH_OPS),
                Op("squeeze-excite pool", OpKind.ELEMENTWISE, elements=o * o * mid, saved=mid),
                Op(
                    "squeeze-excite reduce",
                    OpKind.MATMUL,
                    m=1,
                    k=mid,
                    n=squeeze,
                    params=mid * squeeze + squeeze,
                    saved=squeeze,
                ),
                Op(
                    "squeeze-excite expand",
                    OpKind.MATMUL,
                    m=1,
                    k=squeeze,
                    n=mid,
                    params=squeeze * mid + mid,
                    saved=mid,
                ),
                Op(
                    "squeeze-excite gate",
                    OpKind.ELEMENTWISE,
                    elements=o * o * mid + mid * SWISH_OPS,
                    saved=o * o * mid,
                ),
                _conv("project conv 1x1", o, mid, cout, 1, 1),
                _norm_act("batchnorm", o, cout, BATCHNORM_OPS),
            ]
            if s == 1 and cin == cout:
                ops.append(_norm_act("residual add", o, cout, ADD_OPS))
            layers.append(
                Layer(f"stage {stage + 1} block {b + 1}", tuple(ops), input_elements=size * size * cin)
            )
            size = o
            cin = cout
    head = _round_filters(1280, width)
    layers.append(
        Layer(
            "head conv",
            (
                _conv("conv 1x1", size, cin, head, 1, 1),
                _norm_act("batchnorm + swish", size, head, BATCHNORM_OPS + SWISH_OPS),
            ),
            input_elements=size * size * cin,
        )
    )
    layers.append(_classifier(size, head))
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=None,
        image_size=image,
        objective="imagenet-classification",
        layers=tuple(layers),
        host_bytes_per_sample=image * image * IMAGE_BYTES_PER_PIXEL,
        optimizer="rmsprop" if task == "train" else "none",
        optimizer_ops_per_param=8,
        optimizer_state_per_param=2,
    )


# --------------------------------------------------------------------------------------- time series

SERIES_FEATURES = 64
SERIES_HIDDEN = 512
SERIES_LAYERS = 2
SERIES_READING_BYTES = 4  # each reading arrives from the host as FP32


def _rnn_graph(name: str, cell: Literal["lstm", "gru"], task: Task, seq_len: int) -> ModelGraph:
    gates = 4 if cell == "lstm" else 3
    gate_ops = LSTM_GATE_OPS if cell == "lstm" else GRU_GATE_OPS
    h = SERIES_HIDDEN
    layers: list[Layer] = []
    fan_in = SERIES_FEATURES
    for i in range(SERIES_LAYERS):
        # LSTM: 4 gates with one bias each; GRU (reset-after): 3 gates with input and recurrent biases.
        params = 4 * (fan_in * h + h * h + h) if cell == "lstm" else 3 * (fan_in * h + h * h + 2 * h)
        layers.append(
            Layer(
                f"{cell} layer {i + 1}",
                (
                    Op(
                        f"{cell} cell (input + recurrent GEMM per time step)",
                        OpKind.RECURRENT,
                        m=1,
                        k=fan_in + h,
                        n=gates * h,
                        steps=seq_len,
                        elements=gates * h * gate_ops,
                        params=params,
                        # gate pre-activations, cell and hidden states at every step, for BPTT
                        saved=seq_len * (gates + 2) * h,
                    ),
                ),
                input_elements=seq_len * fan_in,
            )
        )
        fan_in = h
    layers.append(
        Layer(
            "forecast head",
            (
                Op(
                    "dense forecast",
                    OpKind.MATMUL,
                    m=1,
                    k=h,
                    n=SERIES_FEATURES,
                    params=h * SERIES_FEATURES + SERIES_FEATURES,
                    saved=SERIES_FEATURES,
                ),
                Op("mse loss", OpKind.ELEMENTWISE, elements=SERIES_FEATURES * 3, saved=SERIES_FEATURES),
            ),
            input_elements=h,
        )
    )
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=seq_len,
        image_size=None,
        objective="multivariate forecasting",
        layers=tuple(layers),
        host_bytes_per_sample=(seq_len + 1) * SERIES_FEATURES * SERIES_READING_BYTES,
        optimizer="adam" if task == "train" else "none",
        optimizer_ops_per_param=12,
        optimizer_state_per_param=2,
    )


# ------------------------------------------------------------------------------------ recommendation

# DeepRecommender's Netflix-full model: 17,768 items, encoder 512-512-1024, mirrored decoder, SELU,
# dropout 0.8 on the 1,024-wide code (Kuchaiev & Ginsburg, 2017, section 3).
AUTOENCODER_ITEMS = 17_768
AUTOENCODER_HIDDEN = (512, 512, 1024)


def _autoencoder_graph(name: str, task: Task, _seq_len: int | None) -> ModelGraph:
    widths = (AUTOENCODER_ITEMS, *AUTOENCODER_HIDDEN, *reversed(AUTOENCODER_HIDDEN[:-1]), AUTOENCODER_ITEMS)
    layers: list[Layer] = []
    for i in range(len(widths) - 1):
        fan_in, fan_out = widths[i], widths[i + 1]
        part = "encoder" if i < len(AUTOENCODER_HIDDEN) else "decoder"
        ops = [
            Op(
                f"{part} dense {fan_in}->{fan_out}",
                OpKind.MATMUL,
                m=1,
                k=fan_in,
                n=fan_out,
                params=fan_in * fan_out + fan_out,
                saved=fan_out,
            ),
            Op("selu", OpKind.ELEMENTWISE, elements=fan_out * SELU_OPS, saved=fan_out),
        ]
        if fan_out == AUTOENCODER_HIDDEN[-1]:
            ops.append(
                Op("dropout on the code", OpKind.ELEMENTWISE, elements=fan_out * DROPOUT_OPS, saved=fan_out)
            )
        if i == len(widths) - 2:
            ops.append(Op("masked mse loss", OpKind.ELEMENTWISE, elements=fan_out * 4, saved=fan_out))
        layers.append(Layer(f"{part} layer {i + 1}", tuple(ops), input_elements=fan_in))
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=None,
        image_size=None,
        objective="collaborative filtering",
        layers=tuple(layers),
        # a user's rating vector, one byte per item (ratings 0-5), streamed dense
        host_bytes_per_sample=AUTOENCODER_ITEMS,
        optimizer="adam" if task == "train" else "none",
        optimizer_ops_per_param=12,
        optimizer_state_per_param=2,
    )


# --------------------------------------------------------------------------------------------- MCMC

# Hamiltonian Monte Carlo on a Bayesian logistic regression whose data set stays resident in SRAM.
MCMC_DIMENSION = 128
MCMC_OBSERVATIONS = 16_384
MCMC_LEAPFROG_STEPS = 10


def _mcmc_graph(name: str, task: Task, _seq_len: int | None) -> ModelGraph:
    d, n, steps = MCMC_DIMENSION, MCMC_OBSERVATIONS, MCMC_LEAPFROG_STEPS
    layer = Layer(
        "hmc transition",
        (
            # Each leapfrog step needs the gradient of the log posterior: logits X.theta, the residual
            # y - sigmoid(logits), then X^T.residual; chains are the batch, X is shared.
            Op(
                "leapfrog: logits X.theta",
                OpKind.RECURRENT,
                m=1,
                k=d,
                n=n,
                steps=steps,
                elements=n * 6,
                params=n * d,
                saved=n,
            ),
            Op(
                "leapfrog: gradient X^T.residual",
                OpKind.RECURRENT,
                m=1,
                k=n,
                n=d,
                steps=steps,
                elements=d * 6,
                saved=3 * d,
            ),
            Op("proposal energy X.theta'", OpKind.MATMUL, m=1, k=d, n=n, saved=n),
            Op("log-likelihood and Metropolis accept", OpKind.ELEMENTWISE, elements=n * 6 + d * 4, saved=d),
        ),
        input_elements=2 * d,
    )
    return ModelGraph(
        workload=name,
        task=task,
        seq_len=None,
        image_size=None,
        objective="posterior sampling",
        layers=(layer,),
        host_bytes_per_sample=d * 4,  # each draw of theta goes back to the host in FP32
        optimizer="none",
        optimizer_ops_per_param=0,
        optimizer_state_per_param=0,
        trainable=False,
    )


# ---------------------------------------------------------------------------------------- catalogue

_BOTH: tuple[Task, ...] = ("train", "infer")
_PRECISIONS: tuple[Precision, ...] = ("fp16", "fp32")
_BERT_TASKS = {
    "train": "seq_len 128: pre-training phase 1 (MLM + NSP); 384: SQuAD v1.1 fine-tuning; "
    "512: pre-training phase 2 (MLM + NSP, sequences packed 1.71 per slot)",
    "infer": "SQuAD question answering (span prediction) at the given sequence length",
}
_IMAGE_TASKS = {"train": "ImageNet classification training", "infer": "ImageNet classification inference"}


def _make_catalogue() -> dict[str, Workload]:
    entries = [
        Workload(
            name="bert-base",
            family="nlp",
            description="BERT-Base: 12 transformer layers, hidden 768, 12 heads, 110M parameters",
            sample_unit="sequence",
            tasks=_BOTH,
            task_notes=_BERT_TASKS,
            default_batch_size=1024,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(128, 384, 512),
            default_seq_len=128,
            seq_len_meaning="tokens per sequence",
            image_size=None,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=8,
            architecture={
                "layers": 12,
                "hidden": 768,
                "heads": 12,
                "intermediate": 3072,
                "vocab": BERT_VOCAB,
            },
            references=("Devlin et al., BERT, NAACL 2019 (arXiv:1810.04805)",),
            build=lambda task, seq: _bert_graph("bert-base", 768, 12, 12, task, seq or 128),
        ),
        Workload(
            name="bert-large",
            family="nlp",
            description="BERT-Large: 24 transformer layers, hidden 1024, 16 heads, 340M parameters",
            sample_unit="sequence",
            tasks=_BOTH,
            task_notes=_BERT_TASKS,
            default_batch_size=1024,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(128, 384, 512),
            default_seq_len=128,
            seq_len_meaning="tokens per sequence",
            image_size=None,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=16,
            architecture={
                "layers": 24,
                "hidden": 1024,
                "heads": 16,
                "intermediate": 4096,
                "vocab": BERT_VOCAB,
            },
            references=("Devlin et al., BERT, NAACL 2019 (arXiv:1810.04805)",),
            build=lambda task, seq: _bert_graph("bert-large", 1024, 24, 16, task, seq or 128),
        ),
        Workload(
            name="resnet50",
            family="vision",
            description="ResNet-50 v1.5: 16 bottleneck blocks, 25.6M parameters, 224x224 images",
            sample_unit="image",
            tasks=_BOTH,
            task_notes=_IMAGE_TASKS,
            default_batch_size=1024,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(),
            default_seq_len=None,
            seq_len_meaning="",
            image_size=224,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=16,
            architecture={"blocks": [3, 4, 6, 3], "widths": [64, 128, 256, 512], "image_size": 224},
            references=("He et al., Deep Residual Learning, CVPR 2016 (arXiv:1512.03385)",),
            build=lambda task, _seq: _resnet_graph(
                "resnet50", (3, 4, 6, 3), (64, 128, 256, 512), 1, task, 224
            ),
        ),
        Workload(
            name="resnext101",
            family="vision",
            description="ResNeXt-101 32x4d: 33 grouped-convolution bottleneck blocks, 44M parameters, "
            "224x224",
            sample_unit="image",
            tasks=_BOTH,
            task_notes=_IMAGE_TASKS,
            default_batch_size=768,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(),
            default_seq_len=None,
            seq_len_meaning="",
            image_size=224,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=32,
            architecture={"blocks": [3, 4, 23, 3], "cardinality": 32, "group_width": 4, "image_size": 224},
            references=("Xie et al., Aggregated Residual Transformations, CVPR 2017 (arXiv:1611.05431)",),
            build=lambda task, _seq: _resnet_graph(
                "resnext101", (3, 4, 23, 3), (128, 256, 512, 1024), 32, task, 224
            ),
        ),
        Workload(
            name="efficientnet-b0",
            family="vision",
            description="EfficientNet-B0: MBConv blocks with depthwise convolutions and squeeze-excite, 5.3M "
            "parameters, 224x224",
            sample_unit="image",
            tasks=_BOTH,
            task_notes=_IMAGE_TASKS,
            default_batch_size=1024,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(),
            default_seq_len=None,
            seq_len_meaning="",
            image_size=224,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=16,
            architecture={"width": 1.0, "depth": 1.0, "image_size": 224},
            references=("Tan & Le, EfficientNet, ICML 2019 (arXiv:1905.11946)",),
            build=lambda task, _seq: _efficientnet_graph("efficientnet-b0", 1.0, 1.0, task, 224),
        ),
        Workload(
            name="efficientnet-b4",
            family="vision",
            description="EfficientNet-B4: EfficientNet-B0 scaled 1.4x wide, 1.8x deep, 380x380, "
            "19M parameters",
            sample_unit="image",
            tasks=_BOTH,
            task_notes=_IMAGE_TASKS,
            default_batch_size=512,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(),
            default_seq_len=None,
            seq_len_meaning="",
            image_size=380,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=32,
            architecture={"width": 1.4, "depth": 1.8, "image_size": 380},
            references=("Tan & Le, EfficientNet, ICML 2019 (arXiv:1905.11946)",),
            build=lambda task, _seq: _efficientnet_graph("efficientnet-b4", 1.4, 1.8, task, 380),
        ),
        Workload(
            name="lstm",
            family="time-series",
            description=f"{SERIES_LAYERS}-layer LSTM, hidden {SERIES_HIDDEN}, forecasting {SERIES_FEATURES} "
            "series one step ahead from a window of readings",
            sample_unit="window",
            tasks=_BOTH,
            task_notes={"train": "forecasting training (MSE)", "infer": "one-step-ahead forecast"},
            default_batch_size=1024,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(32, 64, 128, 256, 512),
            default_seq_len=128,
            seq_len_meaning="time steps per window",
            image_size=None,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=2,
            architecture={"layers": SERIES_LAYERS, "hidden": SERIES_HIDDEN, "features": SERIES_FEATURES},
            references=("Hochreiter & Schmidhuber, Long Short-Term Memory, Neural Computation 1997",),
            build=lambda task, seq: _rnn_graph("lstm", "lstm", task, seq or 128),
        ),
        Workload(
            name="gru",
            family="time-series",
            description=f"{SERIES_LAYERS}-layer GRU, hidden {SERIES_HIDDEN}, forecasting {SERIES_FEATURES} "
            "series one step ahead from a window of readings",
            sample_unit="window",
            tasks=_BOTH,
            task_notes={"train": "forecasting training (MSE)", "infer": "one-step-ahead forecast"},
            default_batch_size=1024,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(32, 64, 128, 256, 512),
            default_seq_len=128,
            seq_len_meaning="time steps per window",
            image_size=None,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=2,
            architecture={"layers": SERIES_LAYERS, "hidden": SERIES_HIDDEN, "features": SERIES_FEATURES},
            references=("Cho et al., Learning Phrase Representations using RNN Encoder-Decoder, EMNLP 2014",),
            build=lambda task, seq: _rnn_graph("gru", "gru", task, seq or 128),
        ),
        Workload(
            name="deep-autoencoder",
            family="recommendation",
            description="DeepRecommender-style autoencoder over 17,768 items (Netflix): 512-512-1024 "
            "encoder, mirrored decoder, SELU, 20M parameters",
            sample_unit="user rating vector",
            tasks=_BOTH,
            task_notes={
                "train": "masked-MSE training on rating vectors",
                "infer": "predict a user's ratings",
            },
            default_batch_size=512,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(),
            default_seq_len=None,
            seq_len_meaning="",
            image_size=None,
            precisions=_PRECISIONS,
            default_precision="fp16",
            default_steps=100,
            max_ipus_per_replica=4,
            architecture={
                "items": AUTOENCODER_ITEMS,
                "encoder": list(AUTOENCODER_HIDDEN),
                "activation": "selu",
            },
            references=(
                "Kuchaiev & Ginsburg, Training Deep AutoEncoders for Collaborative Filtering, 2017 "
                "(arXiv:1708.01715)",
            ),
            build=lambda task, seq: _autoencoder_graph("deep-autoencoder", task, seq),
        ),
        Workload(
            name="mcmc",
            family="probabilistic",
            description=f"Hamiltonian Monte Carlo for Bayesian logistic regression: {MCMC_DIMENSION} "
            f"dimensions, {MCMC_OBSERVATIONS:,} observations in SRAM, {MCMC_LEAPFROG_STEPS} leapfrog steps "
            "per draw; the batch is the number of parallel chains",
            sample_unit="chain step (one HMC draw of one chain)",
            tasks=("infer",),
            task_notes={"infer": "sampling the posterior (there is nothing to train)"},
            default_batch_size=1024,
            min_batch_size=1,
            max_batch_size=65_536,
            seq_lens=(),
            default_seq_len=None,
            seq_len_meaning="",
            image_size=None,
            precisions=_PRECISIONS,
            default_precision="fp32",
            default_steps=1000,
            max_ipus_per_replica=1,
            architecture={
                "dimension": MCMC_DIMENSION,
                "observations": MCMC_OBSERVATIONS,
                "leapfrog_steps": MCMC_LEAPFROG_STEPS,
            },
            references=("Neal, MCMC using Hamiltonian dynamics, Handbook of MCMC 2011 (arXiv:1206.1901)",),
            build=lambda task, seq: _mcmc_graph("mcmc", task, seq),
        ),
    ]
    return {w.name: w for w in entries}


_CATALOGUE = _make_catalogue()
WORKLOAD_NAMES: tuple[str, ...] = tuple(_CATALOGUE)


@lru_cache(maxsize=256)
def _graph(name: str, task: Task, seq_len: int | None) -> ModelGraph:
    return _CATALOGUE[name].build(task, seq_len)


def catalogue() -> list[Workload]:
    """Every workload, in catalogue order."""
    return list(_CATALOGUE.values())


def get_workload(name: str) -> Workload:
    """The named workload; ``KeyError`` if there is none (``WorkloadSpec`` turns that into a clear error)."""
    return _CATALOGUE[name]
