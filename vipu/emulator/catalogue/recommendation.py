"""A DeepRecommender-style autoencoder over the Netflix items (Kuchaiev & Ginsburg, 2017)."""

from __future__ import annotations

from vipu.emulator.catalogue.workload import Workload
from vipu.emulator.graph import DROPOUT_OPS, SELU_OPS, Layer, ModelGraph, Op, OpKind, Task

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


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="deep-autoencoder",
        family="recommendation",
        description="DeepRecommender-style autoencoder over 17,768 items (Netflix): 512-512-1024 "
        "encoder, mirrored decoder, SELU, 20M parameters",
        sample_unit="user rating vector",
        task_notes={
            "train": "masked-MSE training on rating vectors",
            "infer": "predict a user's ratings",
        },
        default_batch_size=512,
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
)
