"""Lower an ONNX graph to the emulator's layers and ops, for one binding of its dynamic dimensions.

1. Bind (``bind.py``): the batch dimension to one sample (everything below is per sample), the other
   dynamic dimensions to the job's sizes; run ONNX shape inference (``onnx.shape_inference``, strict,
   with data propagation, so shapes computed through Shape/Gather/Concat chains resolve).
2. Classify each node by its role (``classify.py``; the roles are ``rules.py``'s). Tensors computed only
   from constants and shapes are constants: folded at compile time, never activations. Reshapes and layout
   views are free: their output aliases the storage of their input.
3. Fuse (``fuse.py``; what each GEMM, convolution, pooling, cell and lookup costs is ``costs.py``):
   element-wise nodes working on the same tensor join one vector pass (a "region"), as the catalogue counts
   "residual + layernorm + dropout" or a GELU as one op. A node joins the open region that produced its
   full-size inputs; an input smaller than the output (a bias, a mask, a gate) never splits a region, and
   a small region only that node reads is folded into it. A region closes once anything outside it reads
   it, which keeps the fused graph acyclic. A bias Add straight after a GEMM or convolution is part of it,
   as Poplar adds it in the same pass.
4. Cut into layers (``layers.py``), the units a pipeline boundary may fall between (``_boundary``): after
   a unit whose own output carries nearly all (95%) of what crosses to later units, where no more crosses
   than at the neighbouring cuts (the residual stream of a transformer, the output of a ResNet or MBConv
   block), or after a dense layer or recurrent cell and its activation (MLPs, RNNs). A segment with no
   GEMM, convolution, recurrent cell or embedding joins its neighbour, and sub-blocks that repeat as a
   group (a transformer layer's attention and feed-forward halves) become one layer. Each layer's
   ``input_elements`` is what crosses its start: its recomputation checkpoint and what travels over
   IPU-Links when a stage starts there.

The result is a ``graph.ModelGraph``, so planner, memory and timing treat an uploaded graph exactly as
a catalogue workload.
"""

from __future__ import annotations

from dataclasses import dataclass

from vipu.emulator.graph import Layer, ModelGraph, Task
from vipu.emulator.onnxgraph.bind import bind, infer
from vipu.emulator.onnxgraph.classify import Lowering
from vipu.emulator.onnxgraph.errors import GraphError
from vipu.emulator.onnxgraph.fuse import fuse
from vipu.emulator.onnxgraph.layers import MIN_REPEATS, PLATEAU, REPEAT_PERIODS, WAIST_SHARE, layers
from vipu.emulator.onnxgraph.load import OnnxGraph
from vipu.emulator.spec import OPTIMIZERS

__all__ = [
    "MAX_BOUND_DIM",
    "MIN_REPEATS",
    "PLATEAU",
    "REPEAT_PERIODS",
    "WAIST_SHARE",
    "Lowered",
    "lower",
]

MAX_BOUND_DIM = 1_048_576


@dataclass(frozen=True)
class Lowered:
    """An ONNX graph lowered for one binding: the emulator's layers and what the description reports."""

    layers: tuple[Layer, ...]
    host_input_bytes_per_sample: float
    host_output_bytes_per_sample: float
    samples_per_graph_run: int
    """The graph's fixed batch size (1 when its batch dimension is dynamic): costs are divided by it."""
    approximations: dict[str, int]
    """Operators timed by an approximation (``rules.APPROXIMATIONS`` or declared element-wise): count."""
    nodes_free: int
    nodes_constant: int
    outputs: tuple[tuple[str, int, tuple[int | str | None, ...] | None], ...] = ()
    """The graph's outputs as inferred at these sizes: name, ONNX element type, shape (the batch axis at
    the size the lowering binds it to: 1, or the graph's fixed batch). What a serving signature reads."""

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def flops_per_sample(self) -> float:
        return sum(layer.flops for layer in self.layers)

    @property
    def activation_elements_per_sample(self) -> float:
        return sum(layer.saved for layer in self.layers)

    def breakdown(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for layer in self.layers:
            for op in layer.ops:
                row = out.setdefault(op.kind.value, {"flops": 0.0, "params": 0.0, "ops": 0.0})
                row["flops"] += op.flops
                row["params"] += op.params
                row["ops"] += 1
        return out

    def model_graph(self, name: str, task: Task, seq_len: int | None, optimizer: str) -> ModelGraph:
        train = task == "train"
        ops_per_param, state_per_param = OPTIMIZERS[optimizer]
        host = self.host_input_bytes_per_sample + (0.0 if train else self.host_output_bytes_per_sample)
        trainable = self.params > 0
        return ModelGraph(
            workload=name,
            task=task,
            seq_len=seq_len,
            image_size=None,
            objective="own ONNX graph",
            layers=self.layers,
            host_bytes_per_sample=host,
            optimizer=optimizer if train and trainable else "none",
            optimizer_ops_per_param=ops_per_param,
            optimizer_state_per_param=state_per_param,
            trainable=trainable,
        )


def lower(graph: OnnxGraph, bindings: dict[str, int], train: bool) -> Lowered:
    """Lower ``graph`` with its dynamic dimensions bound. Raises ``GraphError`` if shapes stay unknown."""
    for name, value in bindings.items():
        if not 1 <= value <= MAX_BOUND_DIM:
            raise GraphError(
                "unknown-shape", f"dimension {name!r} = {value} is outside 1..{MAX_BOUND_DIM:,}", (name,)
            )
    model, per_run = bind(graph, bindings)
    inferred = infer(model, graph)
    low = Lowering(graph, inferred, train, per_run)
    costed = low.classify()
    if not costed:
        raise GraphError(
            "unsupported-operators",
            "the graph does no work on its inputs: every node is a "
            "reshape or is computed from constants only",
        )
    units = fuse(low, costed)
    model_layers = layers(low, units)
    host_in, host_out = low.host_bytes()
    return Lowered(
        layers=model_layers,
        host_input_bytes_per_sample=host_in,
        host_output_bytes_per_sample=host_out,
        samples_per_graph_run=per_run,
        approximations=dict(sorted(low.approx.items())),
        nodes_free=low.free,
        nodes_constant=low.folded,
        outputs=low.output_types(),
    )
