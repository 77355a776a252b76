"""Own ONNX graphs in the emulator: stripping weights without loading them, checking and ordering a
graph, costing its operators, and planning it like a catalogue workload (no database, no web)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.support import onnx_files
from vipu.emulator import CompileError, WorkloadError, WorkloadSpec, estimate, plan
from vipu.emulator.graph import OpKind
from vipu.emulator.onnxgraph import (
    GraphError,
    GraphTooLarge,
    OnnxWorkload,
    StripError,
    describe,
    load_graph,
    strip_any,
    strip_bytes,
    strip_file,
)
from vipu.emulator.onnxgraph.renderings import render, render_bytes
from vipu.emulator.onnxgraph.strip import STRIPPED_LOCATION


def source(
    data: bytes, dims: dict[str, int] | None = None, elementwise: tuple[str, ...] = ()
) -> OnnxWorkload:
    return OnnxWorkload(load_graph(strip_bytes(data).data, elementwise), "m", default_dims=dims)


# ------------------------------------------------------------------------------------------ stripping


def test_stripping_keeps_shapes_and_small_constants_and_drops_weight_data(tmp_path: Path) -> None:
    data = onnx_files.mlp(hidden=256, layers=3)
    stripped = strip_bytes(data)
    assert stripped.original_bytes == len(data) and len(stripped.data) < 4096
    assert stripped.weight_bytes_removed >= (256 * 64 + 2 * 256 * 256) * 4
    model = onnx.ModelProto.FromString(stripped.data)
    weights = {t.name: t for t in model.graph.initializer}
    assert list(weights["w0"].dims) == [256, 64] and weights["w0"].data_type == TensorProto.FLOAT
    assert weights["w0"].data_location == TensorProto.EXTERNAL and not weights["w0"].raw_data
    assert weights["w0"].external_data[0].value == STRIPPED_LOCATION
    # The same bytes from a file (read with seeks), from a stream, and a second time (idempotent).
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    assert strip_file(path).data == stripped.data == strip_any(io.BytesIO(data)).data
    again = strip_bytes(stripped.data)
    assert again.data == stripped.data and again.tensors_stripped == 0 and again.external_tensors == 3
    # Reshape targets and other small integer tensors keep their values.
    bert = onnx.ModelProto.FromString(strip_bytes(render_bytes("bert-base")).data)
    shapes = [t for t in bert.graph.initializer if t.data_type == TensorProto.INT64 and t.dims == [4]]
    assert shapes and all(list(t.int64_data) or t.raw_data for t in shapes)


def test_exporters_notes_on_nodes_are_stripped_and_the_graph_is_not_changed() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], name="relu", doc_string="File /home/alice/model.py, line 9")
    node.metadata_props.add(key="pkg.torch.onnx.stack_trace", value='File "/home/alice/model.py", line 9')
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = onnx.ModelProto.FromString(strip_bytes(model.SerializeToString()).data)
    assert b"alice" not in out.SerializeToString()
    kept = out.graph.node[0]
    assert (kept.name, kept.op_type, list(kept.input), list(kept.output)) == ("relu", "Relu", ["x"], ["y"])
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    bare = helper.make_graph([relu], "g", graph.input, graph.output)
    plain = helper.make_model(bare, opset_imports=[helper.make_opsetid("", 17)])
    # The same computation exported from anywhere is the same graph, and the same cached executable.
    assert strip_bytes(model.SerializeToString()).digest == strip_bytes(plain.SerializeToString()).digest


def test_constant_nodes_and_training_info_are_stripped_too() -> None:
    big = helper.make_tensor("v", TensorProto.FLOAT, [64, 64], [0.5] * 4096)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=big),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.training_info.add().algorithm.CopyFrom(graph)
    stripped = strip_bytes(model.SerializeToString())
    out = onnx.ModelProto.FromString(stripped.data)
    assert not out.training_info and stripped.tensors_stripped == 1
    assert list(out.graph.node[0].attribute[0].t.dims) == [64, 64]
    assert source(model.SerializeToString()).onnx_graph.parameters == 4096


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty file"),
        (b"\x0f\x00", "not an ONNX model"),
        (b"\x08\x01\x3a\x02\x0f\x00", "wire type 7"),  # an ONNX model whose graph breaks
        (b"\x08\x07", "no graph"),
        (render_bytes("resnet50")[:5000], "truncated"),
        (b"\xff" * 11, "varint longer"),
    ],
)
def test_bytes_that_are_not_a_model_are_refused_where_they_break(data: bytes, message: str) -> None:
    with pytest.raises(StripError, match=message):
        strip_bytes(data)


def test_a_graph_over_the_limit_is_refused_while_it_is_stripped(tmp_path: Path) -> None:
    path = tmp_path / "bert.onnx"
    path.write_bytes(render_bytes("bert-base"))
    with pytest.raises(GraphTooLarge):
        strip_file(path, max_graph_bytes=10_000)
    assert len(strip_file(path, max_graph_bytes=100_000).data) < 100_000


# ---------------------------------------------------------------------------------------------- loading


@pytest.mark.parametrize(
    ("data", "code", "names"),
    [
        (onnx_files.cycle_model(), "cycle", ("first", "second", "third")),
        (onnx_files.dangling_model(), "dangling-input", ("'ghost' (input of adder)",)),
        (onnx_files.custom_op_model(), "unknown-operators", ("acme::FastSwish",)),
        (onnx_files.loop_model(), "unsupported-operators", ("Loop",)),
    ],
)
def test_structural_problems_are_named(data: bytes, code: str, names: tuple[str, ...]) -> None:
    with pytest.raises(GraphError) as exc:
        load_graph(strip_bytes(data).data)
    assert exc.value.code == code
    for name in names:
        assert any(name in n for n in exc.value.names), exc.value.names


def test_nodes_out_of_order_are_sorted_and_inputs_described() -> None:
    model = onnx.ModelProto.FromString(onnx_files.mlp())
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(reversed(nodes))
    g = load_graph(strip_bytes(model.SerializeToString()).data)
    assert [n.name for n in g.model.graph.node] == [n.name for n in nodes]
    assert g.batch_dim == "batch" and g.dynamic_dims == () and g.op_counts == {"Gemm": 3, "Relu": 3}
    assert [i.to_dict() for i in g.inputs] == [
        {"name": "x", "dtype": "float32", "shape": ["batch", 64], "dynamic": [0]}
    ]


# -------------------------------------------------------------------------------------------- lowering


def test_the_renderings_cost_what_the_catalogue_counts() -> None:
    for name, task, seq in (
        ("resnet50", "train", None),
        ("bert-large", "infer", 384),
        ("lstm", "train", 128),
        ("efficientnet-b0", "train", None),
        ("deep-autoencoder", "train", None),
    ):
        own = WorkloadSpec(model="m", task=task, seq_len=seq, source=source(render_bytes(name, task, seq)))  # type: ignore[arg-type]
        theirs = WorkloadSpec(model=name, task=task, seq_len=seq)  # type: ignore[arg-type]
        g, c = own.graph(), theirs.graph()
        assert g.params == pytest.approx(c.params, rel=0.01), name
        assert g.flops_per_sample == pytest.approx(c.flops_per_sample, rel=0.02), name
        assert len(g.layers) == pytest.approx(len(c.layers), abs=2), name


def test_operator_families_become_the_right_kinds() -> None:
    g = WorkloadSpec(model="m", task="infer", source=source(render_bytes("efficientnet-b0"))).graph()
    kinds = {op.kind for layer in g.layers for op in layer.ops}
    assert {OpKind.CONV, OpKind.DEPTHWISE_CONV, OpKind.ELEMENTWISE, OpKind.MATMUL} <= kinds
    g = WorkloadSpec(model="m", task="infer", source=source(render_bytes("resnext101"))).graph()
    assert OpKind.GROUPED_CONV in {op.kind for layer in g.layers for op in layer.ops}
    g = WorkloadSpec(
        model="m", task="infer", seq_len=64, source=source(render_bytes("gru", "infer", 64))
    ).graph()
    (cell,) = [op for layer in g.layers for op in layer.ops if op.kind is OpKind.RECURRENT][:1]
    assert cell.steps == 64 and cell.n == 3 * 512
    bert = WorkloadSpec(
        model="m", task="infer", seq_len=128, source=source(render_bytes("bert-base"))
    ).graph()
    assert sum(op.kind is OpKind.EMBEDDING for layer in bert.layers for op in layer.ops) == 2
    # Attention's QK^T: a GEMM per head over the sequence; the scale, mask and softmax one vector pass.
    qk = next(op for layer in bert.layers for op in layer.ops if op.kind is OpKind.MATMUL and op.groups == 12)
    assert (qk.m, qk.k, qk.n) == (128, 64, 128)


def test_decomposed_layernorm_and_gelu_plan_like_the_fused_operators() -> None:
    for task, seq, ipus in (("infer", 128, 4), ("train", 384, 16)):
        fused = WorkloadSpec(
            model="m",
            task=task,
            seq_len=seq,
            batch_size=256,  # type: ignore[arg-type]
            source=source(render_bytes("bert-base", task, seq, fused=True)),
        )  # type: ignore[arg-type]
        primitive = WorkloadSpec(
            model="m",
            task=task,
            seq_len=seq,
            batch_size=256,  # type: ignore[arg-type]
            source=source(render_bytes("bert-base", task, seq, fused=False)),
        )  # type: ignore[arg-type]
        a, b = plan(fused, ipus, "bow"), plan(primitive, ipus, "bow")
        assert b.throughput == pytest.approx(a.throughput, rel=0.01)
        assert b.memory_per_ipu_bytes == pytest.approx(a.memory_per_ipu_bytes, rel=0.01)
        assert len(primitive.graph().layers) == len(fused.graph().layers)


def test_declared_elementwise_operators_take_the_shape_of_their_input() -> None:
    with pytest.raises(GraphError):
        source(onnx_files.custom_op_model())
    own = source(onnx_files.custom_op_model(), elementwise=("acme::FastSwish",))
    described = describe(own.onnx_graph)
    assert described["unmodelled"][0]["operator"] == "acme::FastSwish"
    assert described["parameters"] == 16 * 32 + 32 * 8
    assert plan(WorkloadSpec(model="m", task="infer", source=own), 1).throughput > 0


def test_dynamic_dimensions_are_bound_by_seq_len_dims_or_defaults() -> None:
    own = source(onnx_files.sequence_model(), dims={"sequence": 32})
    base = WorkloadSpec(model="m", task="infer", source=own)
    assert base.dims == (("sequence", 32),)
    longer = WorkloadSpec(model="m", task="infer", seq_len=256, source=own)
    assert longer.graph().flops_per_sample == pytest.approx(8 * base.graph().flops_per_sample)
    by_dims = WorkloadSpec(model="m", task="infer", dims={"sequence": 256}, source=own).graph()
    assert (
        by_dims.flops_per_sample == longer.graph().flops_per_sample
        and by_dims.layers == longer.graph().layers
    )
    with pytest.raises(WorkloadError, match="no dynamic dimension 'width'") as exc:
        WorkloadSpec(model="m", task="infer", dims={"width": 3}, source=own)
    assert exc.value.field == "dims"
    with pytest.raises(WorkloadError, match="'sequence'") as exc:
        WorkloadSpec(model="m", task="infer", source=source(onnx_files.sequence_model()))
    with pytest.raises(WorkloadError, match="batch dimension"):
        WorkloadSpec(model="m", task="infer", dims={"batch": 3}, source=own)
    with pytest.raises(WorkloadError, match="own ONNX models only"):
        WorkloadSpec(model="bert-base", dims={"sequence": 3})


def test_shapes_inference_cannot_resolve_are_refused_with_the_tensor_named() -> None:
    with pytest.raises(GraphError) as exc:
        describe(source(onnx_files.shape_mismatch_model()).onnx_graph)
    assert exc.value.code == "shape-inference"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    nodes = [
        helper.make_node("NonZero", ["x"], ["idx"], name="nz"),
        helper.make_node("Cast", ["idx"], ["y"], to=TensorProto.FLOAT, name="cast"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(GraphError) as exc:
        describe(source(data).onnx_graph)
    assert exc.value.code == "unsupported-operators" and "NonZero" in exc.value.message


def _heads_model() -> bytes:
    """Attention scores as PyTorch's TorchScript exporter writes the head split: the head size computed
    from the tensor's shape with an integer ``Div``, which ONNX's data propagation does not follow."""
    i64 = TensorProto.INT64
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 256])
    consts = {"i0": [0], "i1": [1], "i2": [2], "heads": [4], "four": [4]}
    nodes = [
        helper.make_node("Constant", [], [n], value=helper.make_tensor(n, i64, [1], v))
        for n, v in consts.items()
    ]
    nodes += [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("Shape", ["h"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Gather", ["s", "i2"], ["e"], axis=0),
        helper.make_node("Div", ["e", "four"], ["d"], name="head_dim"),
        helper.make_node("Concat", ["b", "t", "heads", "d"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["split"], name="split"),
        helper.make_node("Transpose", ["split"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["split"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.zeros((256, 256), np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_shape_arithmetic_onnx_does_not_propagate_is_evaluated_at_the_bound_sizes() -> None:
    own = source(_heads_model(), dims={"sequence": 32})
    for seq in (32, 96):
        g = WorkloadSpec(model="m", task="infer", seq_len=seq, source=own).graph()
        macs = sum(op.macs for layer in g.layers for op in layer.ops)
        assert macs == seq * 256 * 256 + 4 * seq * seq * 64
    assert describe(own.onnx_graph, {"sequence": 32})["parameters"] == 256 * 256


def test_a_reshape_the_export_fixed_is_refused_at_other_sizes() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 8])
    target = helper.make_tensor("target", TensorProto.INT64, [3], [1, 32, 8])  # traced at sequence 32
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Reshape", ["a", "target"], ["r"], name="fixed"),
        helper.make_node("MatMul", ["r", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [target, onnx.numpy_helper.from_array(np.zeros((8, 16), np.float32), "w")],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    own = source(data, dims={"sequence": 32})
    assert WorkloadSpec(model="m", task="infer", source=own).graph().flops_per_sample > 0
    with pytest.raises(
        WorkloadError, match=r"fixed \(Reshape\) turns .* \[1, 64, 8\] \(512 elements\)"
    ) as exc:
        WorkloadSpec(model="m", task="infer", seq_len=64, source=own).graph()
    assert exc.value.field == "dims" and "exported at" in exc.value.message


# -------------------------------------------------------------------------------------------- planning


def test_an_own_graph_fits_or_fails_naming_its_nodes_and_stage() -> None:
    own = source(render_bytes("bert-large", "train", 128), dims={"sequence": 128})
    spec = WorkloadSpec(model="m", task="train", batch_size=1024, source=own)
    with pytest.raises(CompileError) as exc:
        plan(spec, 1, "bow")
    assert exc.value.stage == 0 and exc.value.stage_layers and "Gather" in exc.value.message
    assert "more IPUs per replica" in exc.value.suggestion
    fits = estimate(spec, "auto", "bow")
    assert fits.fits and fits.ipus and fits.ipus > 1 and fits.plan
    p = plan(spec, 16, "bow")
    assert p.ipus_per_replica > 1 and sum(p.layers_per_ipu) == len(spec.graph().layers)


def test_the_executable_key_is_the_graphs_content_and_scope() -> None:
    data = strip_bytes(onnx_files.mlp()).data
    a = OnnxWorkload(load_graph(data), "one", scope="tenant-a", model_id="mdl_a")
    b = OnnxWorkload(load_graph(data), "two", scope="tenant-a", model_id="mdl_b")
    c = OnnxWorkload(load_graph(data), "one", scope="tenant-b", model_id="mdl_c")
    other = OnnxWorkload(load_graph(strip_bytes(onnx_files.mlp(hidden=128)).data), "one", scope="tenant-a")

    def key(src: OnnxWorkload, **kw: object) -> str:
        return plan(WorkloadSpec(model=src.model_id, task="train", source=src, **kw), 1).executable_key  # type: ignore[arg-type]

    assert key(a) == key(b), "the same graph under two names shares its executable"
    assert key(a) != key(c), "another tenant's upload of the same graph does not"
    assert key(a) != key(other) and key(a) != key(a, optimizer="sgd")
    assert key(a) != plan(WorkloadSpec(model="resnet50"), 1).executable_key


def test_compile_time_grows_with_the_graph() -> None:
    small = source(render_bytes("bert-base", "infer", 128), dims={"sequence": 128})
    large = source(render_bytes("bert-large", "infer", 128), dims={"sequence": 128})
    a = plan(WorkloadSpec(model="s", task="infer", batch_size=64, source=small), 4, "bow")
    b = plan(WorkloadSpec(model="l", task="infer", batch_size=64, source=large), 4, "bow")
    assert b.compile_s > a.compile_s > 60


def test_renderings_are_well_typed_onnx() -> None:
    # The weights are absent (marked as stripped external data), so the checker's file lookup does not
    # apply; strict type and shape inference checks every node against its schema.
    for name in ("bert-base", "resnet50", "efficientnet-b0", "lstm", "deep-autoencoder"):
        model = render(name)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        assert all(o.type.tensor_type.HasField("shape") for o in inferred.graph.output), name


def test_declarations_apply_only_to_operators_the_emulator_does_not_know() -> None:
    with pytest.raises(GraphError) as exc:
        load_graph(strip_bytes(onnx_files.loop_model()).data, ("Loop",))
    assert exc.value.code == "unsupported-operators"
    plain = source(onnx_files.mlp())
    declared = source(onnx_files.mlp(), elementwise=("Gemm", "Relu"))
    assert describe(declared.onnx_graph)["unmodelled"] == []
    a = WorkloadSpec(model="m", task="infer", source=plain).graph()
    b = WorkloadSpec(model="m", task="infer", source=declared).graph()
    assert a.flops_per_sample == b.flops_per_sample and [len(x.ops) for x in a.layers] == [
        len(x.ops) for x in b.layers
    ]


def test_a_model_saved_with_external_weights_plans_without_them(tmp_path: Path) -> None:
    model = onnx.ModelProto.FromString(onnx_files.mlp(hidden=256, layers=3))
    path = tmp_path / "mlp.onnx"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp.data",
        size_threshold=1024,
    )
    (tmp_path / "mlp.data").unlink()  # the weights never come along
    stripped = strip_file(path)
    assert stripped.external_tensors == 6 and stripped.weight_bytes_removed == 0
    described = describe(load_graph(stripped.data))
    assert described["parameters"] == 256 * 64 + 256 + 2 * (256 * 256 + 256)
