"""Two-layer LSTM and GRU forecasters (Hochreiter & Schmidhuber, 1997; Cho et al., 2014)."""

from __future__ import annotations

from typing import Literal

from vipu.emulator.catalogue.workload import Workload
from vipu.emulator.graph import GRU_GATE_OPS, LSTM_GATE_OPS, Layer, ModelGraph, Op, OpKind, Task

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


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        name="lstm",
        family="time-series",
        description=f"{SERIES_LAYERS}-layer LSTM, hidden {SERIES_HIDDEN}, forecasting {SERIES_FEATURES} "
        "series one step ahead from a window of readings",
        sample_unit="window",
        task_notes={"train": "forecasting training (MSE)", "infer": "one-step-ahead forecast"},
        default_batch_size=1024,
        seq_lens=(32, 64, 128, 256, 512),
        default_seq_len=128,
        seq_len_meaning="time steps per window",
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
        task_notes={"train": "forecasting training (MSE)", "infer": "one-step-ahead forecast"},
        default_batch_size=1024,
        seq_lens=(32, 64, 128, 256, 512),
        default_seq_len=128,
        seq_len_meaning="time steps per window",
        max_ipus_per_replica=2,
        architecture={"layers": SERIES_LAYERS, "hidden": SERIES_HIDDEN, "features": SERIES_FEATURES},
        references=("Cho et al., Learning Phrase Representations using RNN Encoder-Decoder, EMNLP 2014",),
        build=lambda task, seq: _rnn_graph("gru", "gru", task, seq or 128),
    ),
)
