"""The graph a workload is lowered to: operations sized per sample, grouped into layers.

A model is a sequence of layers (the unit a pipeline stage boundary may fall between); a layer is a
tuple of operations, each of one kind (matmul, convolution, depthwise convolution, recurrent cell,
element-wise, embedding) with its GEMM shape or element count *per sample*, its parameters and the
activations it keeps for the backward pass. The catalogue (``vipu/emulator/catalogue/``) builds these
from published architectures; ``onnxgraph`` builds them from a tenant's ONNX file; the planner, the
memory model and the timing model read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
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
