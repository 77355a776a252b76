"""ResNet-50 v1.5 (He et al., 2016; strides as in torchvision), ResNeXt-101 32x4d (Xie et al., 2017)
and EfficientNet-B0/B4 (Tan & Le, 2019)."""

from __future__ import annotations

import math

from vipu.emulator.catalogue.workload import Workload
from vipu.emulator.graph import (
    ADD_OPS,
    BATCHNORM_OPS,
    RELU_OPS,
    SOFTMAX_OPS,
    SWISH_OPS,
    Layer,
    ModelGraph,
    Op,
    OpKind,
    Task,
)


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
EFFNET_B0 = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)


def round_filters(filters: int, width: float) -> int:
    # The reference implementation's rounding: scale, round to a multiple of 8, never lose over 10%.
    scaled = filters * width
    rounded = max(8, int(scaled + 4) // 8 * 8)
    if rounded < 0.9 * scaled:
        rounded += 8
    return rounded


def _efficientnet_graph(name: str, width: float, depth: float, task: Task, image: int) -> ModelGraph:
    layers: list[Layer] = []
    size = image
    stem = round_filters(32, width)
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
    for stage, (expand, ksize, stride, base_out, repeats) in enumerate(EFFNET_B0):
        cout = round_filters(base_out, width)
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
    head = round_filters(1280, width)
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


_TASKS = {"train": "ImageNet classification training", "infer": "ImageNet classification inference"}

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="resnet50",
        family="vision",
        description="ResNet-50 v1.5: 16 bottleneck blocks, 25.6M parameters, 224x224 images",
        sample_unit="image",
        task_notes=_TASKS,
        default_batch_size=1024,
        image_size=224,
        max_ipus_per_replica=16,
        architecture={"blocks": [3, 4, 6, 3], "widths": [64, 128, 256, 512], "image_size": 224},
        references=("He et al., Deep Residual Learning, CVPR 2016 (arXiv:1512.03385)",),
        build=lambda task, _seq: _resnet_graph("resnet50", (3, 4, 6, 3), (64, 128, 256, 512), 1, task, 224),
    ),
    Workload(
        name="resnext101",
        family="vision",
        description="ResNeXt-101 32x4d: 33 grouped-convolution bottleneck blocks, 44M parameters, 224x224",
        sample_unit="image",
        task_notes=_TASKS,
        default_batch_size=768,
        image_size=224,
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
        task_notes=_TASKS,
        default_batch_size=1024,
        image_size=224,
        max_ipus_per_replica=16,
        architecture={"width": 1.0, "depth": 1.0, "image_size": 224},
        references=("Tan & Le, EfficientNet, ICML 2019 (arXiv:1905.11946)",),
        build=lambda task, _seq: _efficientnet_graph("efficientnet-b0", 1.0, 1.0, task, 224),
    ),
    Workload(
        name="efficientnet-b4",
        family="vision",
        description="EfficientNet-B4: EfficientNet-B0 scaled 1.4x wide, 1.8x deep, 380x380, 19M parameters",
        sample_unit="image",
        task_notes=_TASKS,
        default_batch_size=512,
        image_size=380,
        max_ipus_per_replica=32,
        architecture={"width": 1.4, "depth": 1.8, "image_size": 380},
        references=("Tan & Le, EfficientNet, ICML 2019 (arXiv:1905.11946)",),
        build=lambda task, _seq: _efficientnet_graph("efficientnet-b4", 1.4, 1.8, task, 380),
    ),
)
