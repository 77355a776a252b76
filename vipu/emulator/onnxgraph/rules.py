"""How each ONNX operator is costed: its role in the graph and its arithmetic per element.

Roles:

- ``gemm``: MatMul, Gemm, Einsum and their integer forms; an (m x k) by (k x n) product per group.
- ``conv``: Conv, ConvTranspose and their integer forms; an implicit GEMM (dense, grouped or depthwise).
- ``recurrent``: LSTM, GRU, RNN; one GEMM per time step, in sequence.
- ``attention``: the fused ``Attention`` operator (opset 23): QK^T, softmax and AV.
- ``gather``: an embedding lookup when its table is a weight, a free view of an activation otherwise.
- ``elementwise``: activations, arithmetic, normalisations, softmax, reductions, casts, resizes. Chains of
  them on the same tensor fuse into one vector pass (``fuse.py``), so a LayerNorm written as nine primitive
  operators and the fused ``LayerNormalization`` cost alike.
- ``pool``: max, average and global pooling; its own vector pass.
- ``free``: reshapes and layout views (Reshape, Transpose, Slice, Concat, ...) and anything computed from
  constants and shapes only: folded at compile time or resolved by Poplar as views.
- ``data_dependent``: operators whose output shape depends on values (NonZero, Unique, ...); allowed only
  when their inputs are constants.
- ``control``: If, Loop, Scan and sequences: no static plan exists.

Element-operations per element count the arithmetic a vector unit issues for each output element, on the
same scale as the catalogue's (``vipu/emulator/graph.py``): a primitive arithmetic operator or exp/tanh
is one, a sigmoid three (exp, add, reciprocal), erf four (a polynomial), a fused GELU eight, a
LayerNorm eight.
"""

from __future__ import annotations

from typing import Literal

from vipu.emulator import graph

Role = Literal[
    "gemm",
    "conv",
    "recurrent",
    "attention",
    "gather",
    "elementwise",
    "pool",
    "free",
    "data_dependent",
    "control",
]

HEAVY_ROLES = frozenset({"gemm", "conv", "recurrent", "attention", "gather"})

_ONE = (
    "Add Sub Mul Div Neg Abs Relu LeakyRelu PRelu ThresholdedRelu Max Min Mean Sum Where Equal Less "
    "LessOrEqual Greater GreaterOrEqual And Or Xor Not Sign Floor Ceil Round Clip Cast CastLike Mod BitShift "
    "BitwiseAnd BitwiseOr BitwiseXor BitwiseNot IsNaN IsInf Exp Log Sqrt Reciprocal Tanh Pow ReduceMean "
    "ReduceSum ReduceMax ReduceMin ReduceProd ReduceSumSquare ReduceL1 ArgMax ArgMin CumSum Pad Tile OneHot "
    "Trilu ScatterND ScatterElements GatherElements GatherND QuantizeLinear DequantizeLinear Shrink Hardmax "
    "RandomNormalLike RandomUniformLike Bernoulli Multinomial ReverseSequence"
)

ELEMENT_OPS: dict[str, float] = {op: 1.0 for op in _ONE.split()}
ELEMENT_OPS.update(
    {
        "Erf": 4.0,
        "Sigmoid": 3.0,
        "HardSigmoid": 2.0,
        "HardSwish": 3.0,
        "Swish": 4.0,
        "Softplus": 3.0,
        "Softsign": 2.0,
        "Elu": 3.0,
        "Celu": 3.0,
        "Selu": float(graph.SELU_OPS),
        "Gelu": float(graph.GELU_OPS),
        "Mish": 6.0,
        "Sin": 4.0,
        "Cos": 4.0,
        "Tan": 4.0,
        "Asin": 4.0,
        "Acos": 4.0,
        "Atan": 4.0,
        "Sinh": 4.0,
        "Cosh": 4.0,
        "Asinh": 4.0,
        "Acosh": 4.0,
        "Atanh": 4.0,
        "Softmax": float(graph.SOFTMAX_OPS),
        "LogSoftmax": float(graph.SOFTMAX_OPS),
        "LayerNormalization": float(graph.LAYERNORM_OPS),
        "MeanVarianceNormalization": float(graph.LAYERNORM_OPS),
        "BatchNormalization": float(graph.BATCHNORM_OPS),
        "InstanceNormalization": float(graph.BATCHNORM_OPS),
        "GroupNormalization": float(graph.BATCHNORM_OPS),
        "RMSNormalization": float(graph.BATCHNORM_OPS),
        "LpNormalization": 3.0,
        "LRN": float(graph.BATCHNORM_OPS),
        "ReduceL2": 2.0,
        "ReduceLogSum": 2.0,
        "ReduceLogSumExp": 3.0,
        "Resize": 2.0,
        "Upsample": 2.0,
        "TopK": 2.0,
        "DynamicQuantizeLinear": 3.0,
        "Dropout": float(graph.DROPOUT_OPS),
    }
)

_FREE = (
    "Reshape Flatten Squeeze Unsqueeze Transpose Identity Slice Split Concat Expand DepthToSpace "
    "SpaceToDepth Shape Size Constant ConstantOfShape Range EyeLike RandomNormal RandomUniform Optional "
    "OptionalGetElement OptionalHasElement"
)
_POOL = "MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool GlobalLpPool"
_CONTROL = (
    "If Loop Scan SequenceAt SequenceConstruct SequenceEmpty SequenceErase SequenceInsert SequenceLength "
    "SequenceMap SplitToSequence ConcatFromSequence"
)
_DATA_DEPENDENT = (
    "NonZero Unique NonMaxSuppression Compress RoiAlign MaxRoiPool StringNormalizer TfIdfVectorizer"
)

ROLES: dict[str, Role] = {}
ROLES.update({op: "elementwise" for op in ELEMENT_OPS})
ROLES.update({op: "free" for op in _FREE.split()})
ROLES.update({op: "pool" for op in _POOL.split()})
ROLES.update({op: "control" for op in _CONTROL.split()})
ROLES.update({op: "data_dependent" for op in _DATA_DEPENDENT.split()})
ROLES.update({op: "gemm" for op in ("MatMul", "Gemm", "Einsum", "MatMulInteger", "QLinearMatMul")})
ROLES.update({op: "conv" for op in ("Conv", "ConvInteger", "QLinearConv", "ConvTranspose")})
ROLES.update({op: "recurrent" for op in ("LSTM", "GRU", "RNN")})
ROLES["Attention"] = "attention"
ROLES["Gather"] = "gather"

DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})

# The gates of each recurrent cell and the element-operations per gate element.
RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
RECURRENT_GATE_OPS = {"LSTM": graph.LSTM_GATE_OPS, "GRU": graph.GRU_GATE_OPS, "RNN": 1}

# What the emulator approximates rather than models, by role or operator, for a model's description.
APPROXIMATIONS: dict[str, str] = {
    "Resize": "timed as two element-operations per output element",
    "Upsample": "timed as two element-operations per output element",
    "TopK": "timed as two element-operations per input element",
    "ConvTranspose": "timed as the convolution with the same arithmetic",
    "Einsum": "timed as the GEMM of its contracted and free indices",
    "ScatterND": "timed as one element-operation per element",
    "ScatterElements": "timed as one element-operation per element",
    "GatherElements": "timed as one element-operation per element",
    "GatherND": "timed as one element-operation per element",
    "Dropout": "free in inference; three element-operations per element in training",
    "Concat": "free: a view, as Poplar concatenates without copying where it can",
    "Transpose": "free: a view",
    "Pad": "timed as one element-operation per output element",
}


def qualified(domain: str, op_type: str) -> str:
    """The name a user sees and declares: ``Op`` in the default domain, ``domain::Op`` otherwise."""
    return op_type if domain in DEFAULT_DOMAINS else f"{domain}::{op_type}"


def role_of(domain: str, op_type: str, declared: frozenset[str]) -> Role | None:
    """The operator's role; for an operator the emulator does not know, ``elementwise`` when the user
    declared it so (a declaration never overrides what the emulator knows), else None."""
    known = ROLES.get(op_type) if domain in DEFAULT_DOMAINS else None
    if known is not None:
        return known
    return "elementwise" if qualified(domain, op_type) in declared else None


def is_declared(domain: str, op_type: str, declared: frozenset[str]) -> bool:
    """Costed as the user declared it: an operator the emulator does not know, declared element-wise."""
    known = domain in DEFAULT_DOMAINS and op_type in ROLES
    return not known and qualified(domain, op_type) in declared


def element_ops(op_type: str, declared: bool, train: bool) -> float:
    if declared:
        return 1.0
    if op_type == "Dropout" and not train:
        return 0.0
    return ELEMENT_OPS.get(op_type, 1.0)


def coverage() -> dict[Role, list[str]]:
    """Every operator the emulator knows, by role (for the coverage table in docs/emulator.md)."""
    out: dict[Role, list[str]] = {}
    for op, role in sorted(ROLES.items()):
        out.setdefault(role, []).append(op)
    return out
