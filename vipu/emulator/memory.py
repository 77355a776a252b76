"""What one IPU of a pipeline stage holds in its 900 MB of In-Processor-Memory.

Per stage (one IPU of a replica):

    weights      = params x bytes(precision)
    gradients    = params x bytes(precision)                      (training: the accumulators)
    optimizer    = params x state elements x 4 bytes              (training, state kept on chip)
    stash        = in-flight micro-batches x micro-batch x kept elements x bytes(precision)
                   kept = the layers' inputs with recomputation, every op's saved activations without
                   in-flight = P - s for stage s of P (a 1F1B pipeline keeps that many alive)
    working set  = micro-batch x the largest layer's activations (re-materialised for its backward pass)
    code         = CODE_BASE_BYTES + CODE_PER_SUPERSTEP_BYTES x superstep instances on the IPU
    io buffers   = double-buffered host streams and pipeline-boundary activations

Poplar fails compilation when any tile runs out of memory; the model checks the whole IPU against
1,472 x 624 KiB, so it is the optimistic bound of a perfectly balanced tile mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from vipu.emulator.graph import Layer, ModelGraph

# Not published: Poplar's always-live memory per IPU (control program, sync and host-exchange code, the
# runtime's vertex code) is modelled as 48 MiB, and each superstep instance (a superstep of one op in one
# pass: forward, backward or recomputation) as 192 KiB of exchange program and vertex state spread over
# the tiles, about 130 bytes per tile. BERT-Large's 3-7-7-7 split then spends 140-165 MB per IPU on code
# and ResNet-50 on one IPU ~220 MB, the order PopVision memory reports show for those models; deep,
# many-op graphs (ResNeXt-101, EfficientNet-B4) run out of room on one IPU, as Graphcore's recipes,
# which pipeline them over two or more IPUs, suggest.
CODE_BASE_BYTES = 48 * 2**20
CODE_PER_SUPERSTEP_BYTES = 192 * 2**10
OPTIMIZER_STATE_BYTES = 4  # optimizer moments are kept in FP32 in either precision


def dtype_bytes(precision: str) -> int:
    return 2 if precision == "fp16" else 4


def passes(train: bool, recompute: bool) -> int:
    """Passes over each op per micro-batch: forward; input and weight gradients; recomputation."""
    return (3 + (1 if recompute else 0)) if train else 1


def superstep_instances(layers: tuple[Layer, ...] | list[Layer], train: bool, recompute: bool) -> int:
    return passes(train, recompute) * sum(layer.supersteps for layer in layers)


@dataclass(frozen=True, slots=True)
class StageMemory:
    weights: int
    gradients: int
    optimizer: int
    stash: int
    working: int
    code: int
    io_buffers: int

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.stash
            + self.working
            + self.code
            + self.io_buffers
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer,
            "activation_stash": self.stash,
            "working_set": self.working,
            "code_and_exchange": self.code,
            "io_buffers": self.io_buffers,
            "total": self.total,
        }


class StageAggregate:
    """Running sums over a stage's layers, so a stage can grow one layer at a time in O(1)."""

    __slots__ = (
        "first",
        "input_sum",
        "last",
        "max_input",
        "max_live",
        "max_op_live",
        "params",
        "saved_sum",
        "supersteps",
    )

    def __init__(self) -> None:
        self.params = 0
        self.input_sum = 0.0
        self.saved_sum = 0.0
        self.max_input = 0.0
        self.max_live = 0.0
        self.max_op_live = 0.0
        self.supersteps = 0
        self.first: Layer | None = None
        self.last: Layer | None = None

    def add(self, layer: Layer) -> None:
        if self.first is None:
            self.first = layer
        self.last = layer
        self.params += layer.params
        self.input_sum += layer.input_elements
        saved = layer.saved
        self.saved_sum += saved
        self.max_input = max(self.max_input, layer.input_elements)
        self.max_live = max(self.max_live, saved + layer.input_elements)
        self.max_op_live = max(self.max_op_live, layer.max_op_saved + layer.input_elements)
        self.supersteps += layer.supersteps

    def copy(self) -> StageAggregate:
        other = StageAggregate()
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        return other


def memory_of(
    graph: ModelGraph,
    agg: StageAggregate,
    *,
    stage: int,
    stages: int,
    micro_batch: int,
    precision: str,
    train: bool,
    recompute: bool,
    optimizer_offchip: bool,
    first: bool,
    last: bool,
) -> StageMemory:
    """Memory of the stage whose layers were added to ``agg`` (see the module docstring)."""
    b = dtype_bytes(precision)
    weights = agg.params * b
    trained = train and graph.trainable
    gradients = agg.params * b if trained else 0
    optimizer = 0
    if trained and not optimizer_offchip:
        optimizer = agg.params * graph.optimizer_state_per_param * OPTIMIZER_STATE_BYTES
    if train:
        in_flight = stages - stage
        kept = agg.input_sum if recompute else agg.saved_sum
        stash = int(in_flight * micro_batch * kept * b)
        # The layer being differentiated is live in full (re-materialised when recomputing) with the
        # gradient flowing back through it; without recomputation its activations are in the stash.
        working = int(micro_batch * (agg.max_live if recompute else agg.max_input) * b)
    else:
        stash = 0
        # Inference keeps only an op's input and output alive, double-buffered.
        working = int(2 * micro_batch * agg.max_op_live * b)
    code = CODE_BASE_BYTES + CODE_PER_SUPERSTEP_BYTES * passes(train, recompute) * agg.supersteps
    io = 0
    if first:
        io += int(2 * micro_batch * graph.host_bytes_per_sample)
    if stages > 1 and agg.first is not None and agg.last is not None:
        incoming = 0.0 if first else agg.first.input_elements
        outgoing = 0.0 if last else agg.last.ops[-1].saved
        io += int(2 * micro_batch * (incoming + outgoing) * b)
    return StageMemory(weights, gradients, optimizer, stash, working, code, io)


def stage_memory(
    graph: ModelGraph,
    layers: tuple[Layer, ...],
    *,
    stage: int,
    stages: int,
    micro_batch: int,
    precision: str,
    train: bool,
    recompute: bool,
    optimizer_offchip: bool,
    first: bool,
    last: bool,
) -> StageMemory:
    agg = StageAggregate()
    for layer in layers:
        agg.add(layer)
    return memory_of(
        graph,
        agg,
        stage=stage,
        stages=stages,
        micro_batch=micro_batch,
        precision=precision,
        train=train,
        recompute=recompute,
        optimizer_offchip=optimizer_offchip,
        first=first,
        last=last,
    )
