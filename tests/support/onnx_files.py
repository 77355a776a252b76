"""Small ONNX files for tests, good and bad, built with onnx.helper (weights present unless stripped)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vipu.emulator.onnxgraph.renderings import render_bytes
from vipu.emulator.onnxgraph.strip import strip_bytes

F = TensorProto.FLOAT


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    weights: list[onnx.TensorProto],
    opset: int = 17,
    domains: tuple[str, ...] = (),
) -> bytes:
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs], weights
    )
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="ipucloud tests").SerializeToString()


def _weight(name: str, *dims: int, seed: int = 0) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(dims).astype(np.float32), name)


def mlp(hidden: int = 256, layers: int = 3, features: int = 64, *, seed: int = 0) -> bytes:
    """An MLP with its weights in the file: a dynamic batch, Gemm + Relu layers (``hidden`` wide)."""
    x = helper.make_tensor_value_info("x", F, ["batch", features])
    nodes, weights = [], []
    prev, width = "x", features
    for i in range(layers):
        weights += [_weight(f"w{i}", hidden, width, seed=seed + i), _weight(f"b{i}", hidden, seed=seed + i)]
        nodes += [
            helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"h{i}"], transB=1, name=f"dense{i}"),
            helper.make_node("Relu", [f"h{i}"], [f"a{i}"], name=f"relu{i}"),
        ]
        prev, width = f"a{i}", hidden
    return _model(nodes, [x], [prev], weights)


def sequence_model(op: str = "Relu") -> bytes:
    """A dynamic batch and a dynamic ``sequence`` axis: MatMul over tokens, then ``op``."""
    x = helper.make_tensor_value_info("tokens", F, ["batch", "sequence", 32])
    return _model(
        [helper.make_node("MatMul", ["tokens", "w"], ["h"], name="proj"), helper.make_node(op, ["h"], ["y"])],
        [x],
        ["y"],
        [_weight("w", 32, 64)],
    )


def dynamic_export_model() -> bytes:
    """What ``torch.onnx.export(..., dynamo=True, dynamic_shapes=...)`` gives for a token model with a
    dynamic batch and a dynamic sequence: both axes symbolic, named ``s0`` and ``s1`` as the exporter
    names them, on the input and the declared output; two MatMuls with a Relu between."""
    x = helper.make_tensor_value_info("x", F, ["s0", "s1", 32])
    y = helper.make_tensor_value_info("y", F, ["s0", "s1", 8])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="down"),
    ]
    graph = helper.make_graph(nodes, "exported", [x], [y], [_weight("w1", 32, 64), _weight("w2", 64, 8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="pytorch")
    return model.SerializeToString()


def custom_op_model() -> bytes:
    """A graph with an operator of another domain (``acme::FastSwish``) between two MatMuls."""
    x = helper.make_tensor_value_info("x", F, ["batch", 16])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("FastSwish", ["h"], ["s"], domain="acme", name="swish"),
        helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2"),
    ]
    return _model(nodes, [x], ["y"], [_weight("w1", 16, 32), _weight("w2", 32, 8)], domains=("acme",))


def cycle_model() -> bytes:
    x = helper.make_tensor_value_info("x", F, ["batch", 8])
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Neg", ["b"], ["c"], name="third"),
    ]
    return _model(nodes, [x], ["b"], [])


def dangling_model() -> bytes:
    x = helper.make_tensor_value_info("x", F, ["batch", 8])
    return _model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [x], ["y"], [])


def loop_model() -> bytes:
    x = helper.make_tensor_value_info("x", F, ["batch", 4])
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Relu", ["v_in"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", F, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", F, None),
        ],
    )
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [3])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    node = helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body, name="loop")
    return _model([node], [x], ["y"], [trip, cond])


def shape_mismatch_model() -> bytes:
    """MatMul of a (batch, 8) by a (16, 4) weight: shape inference refuses it."""
    x = helper.make_tensor_value_info("x", F, ["batch", 8])
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="bad")], [x], ["y"], [_weight("w", 16, 4)]
    )


def rendering(name: str = "bert-base", task: str = "infer", seq_len: int | None = 128) -> bytes:
    """A catalogue model rendered as ONNX, stripped as the CLI sends it."""
    return strip_bytes(render_bytes(name, task, seq_len)).data  # type: ignore[arg-type]


# Hostile files (issue 32 item 3), built on the wire where onnx.helper would refuse or recurse.


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def nested_subgraphs(depth: int) -> bytes:
    """A model whose graph holds an ``If`` whose branch holds an ``If``... ``depth`` deep."""
    inner = _field(2, b"g")
    for _ in range(depth):
        attr = _field(1, b"then_branch") + _field(6, inner) + _varint(20 << 3) + _varint(5)
        node = _field(4, b"If") + _field(1, b"c") + _field(2, b"y") + _field(5, attr)
        inner = _field(1, node) + _field(2, b"g")
    return _varint(1 << 3) + _varint(8) + _field(7, inner) + _field(8, _varint(2 << 3) + _varint(17))


def nested_sequence_types(depth: int) -> bytes:
    """An MLP with a value_info whose type is a sequence of a sequence of ... ``depth`` deep."""
    raw = helper.make_tensor_type_proto(F, ["batch", 4]).SerializeToString()
    for _ in range(depth):
        raw = _field(4, _field(1, raw))  # TypeProto.sequence_type { elem_type }
    return mlp(hidden=8, layers=1, features=4) + _field(7, _field(13, _field(1, b"h0") + _field(2, raw)))


def external_initializer(*dims: int) -> bytes:
    """A graph with an initializer of ``dims`` whose data is external (so any dims can be declared)."""
    x = helper.make_tensor_value_info("x", F, ["batch", 4])
    w = TensorProto(name="w", data_type=F, dims=list(dims), data_location=TensorProto.EXTERNAL)
    w.external_data.add(key="location", value="w.bin")
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["w"], ["z"])]
    outputs = [helper.make_tensor_value_info(o, F, None) for o in ("y", "z")]
    graph = helper.make_graph(nodes, "g", [x], outputs, [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def negative_input() -> bytes:
    """A graph whose input declares a negative dimension."""
    x = helper.make_tensor_value_info("x", F, ["batch", -4])
    return _model([helper.make_node("Relu", ["x"], ["y"])], [x], ["y"], [])
