"""The catalogue: every contract name is there, and each model's size comes out of its architecture."""

import json

import pytest

from vipu.emulator import catalogue, get_workload
from vipu.emulator.graph import OpKind

CONTRACT_NAMES = {
    "bert-base",
    "bert-large",
    "resnet50",
    "resnext101",
    "efficientnet-b0",
    "efficientnet-b4",
    "lstm",
    "gru",
    "deep-autoencoder",
    "mcmc",
}


def test_catalogue_has_exactly_the_contract_names():
    assert {w.name for w in catalogue()} == CONTRACT_NAMES


def test_listing_is_json_and_says_what_a_user_may_ask_for():
    for w in catalogue():
        d = json.loads(json.dumps(w.to_dict()))
        for key in (
            "name",
            "family",
            "description",
            "tasks",
            "default_batch_size",
            "min_batch_size",
            "max_batch_size",
            "seq_lens",
            "image_size",
            "precisions",
            "default_steps",
            "parameters",
        ):
            assert key in d, (w.name, key)
        assert d["min_batch_size"] <= d["default_batch_size"] <= d["max_batch_size"]
        assert set(d["precisions"]) <= {"fp16", "fp32"}
        assert d["parameters"] > 0


@pytest.mark.parametrize(
    ("name", "task", "seq", "params_m", "macs_g"),
    [
        # The papers' own totals: parameters (millions) and forward multiply-adds (billions) per sample.
        ("resnet50", "train", None, 25.6, 4.1),
        ("resnext101", "train", None, 44.2, 8.0),
        ("efficientnet-b0", "train", None, 5.3, 0.39),
        ("efficientnet-b4", "train", None, 19.0, 4.2),
        ("bert-base", "infer", 128, 110.0, None),
        ("bert-large", "infer", 128, 340.0, None),
        ("deep-autoencoder", "train", None, 19.8, None),
    ],
)
def test_sizes_match_the_published_architectures(name, task, seq, params_m, macs_g):
    graph = get_workload(name).graph(task, seq)
    assert graph.params / 1e6 == pytest.approx(params_m, rel=0.05)
    if macs_g is not None:
        macs = sum(op.macs for layer in graph.layers for op in layer.ops)
        assert macs / 1e9 == pytest.approx(macs_g, rel=0.07)


def test_bert_flops_follow_the_transformer_arithmetic():
    # Forward FLOPs per token of BERT-Large's encoder: 2 x 12 H^2 x 24 layers plus attention 4 L H x 24.
    h, layers, seq = 1024, 24, 384
    per_token = 2 * 12 * h * h * layers + 4 * seq * h * layers
    graph = get_workload("bert-large").graph("infer", seq)
    assert graph.flops_per_sample / seq == pytest.approx(per_token, rel=0.03)


def test_per_layer_type_breakdown_names_the_kinds_the_timing_model_needs():
    kinds = {}
    for name in CONTRACT_NAMES:
        w = get_workload(name)
        kinds[name] = set(w.graph(w.tasks[0]).breakdown())
    assert {"matmul", "elementwise", "embedding"} <= kinds["bert-large"]
    assert "conv" in kinds["resnet50"]
    assert "grouped_conv" in kinds["resnext101"]
    assert "depthwise_conv" in kinds["efficientnet-b4"]
    assert "recurrent" in kinds["lstm"] and "recurrent" in kinds["gru"]
    assert "recurrent" in kinds["mcmc"]


def test_longer_sequences_and_bigger_images_cost_more():
    bert = get_workload("bert-base")
    assert bert.graph("infer", 512).flops_per_sample > bert.graph("infer", 384).flops_per_sample
    assert bert.graph("infer", 384).flops_per_sample > bert.graph("infer", 128).flops_per_sample
    lstm = get_workload("lstm")
    doubled = 2 * lstm.graph("train", 128).flops_per_sample
    assert lstm.graph("train", 256).flops_per_sample == pytest.approx(doubled, rel=0.01)
    assert (
        get_workload("efficientnet-b4").graph("train").flops_per_sample
        > 5 * get_workload("efficientnet-b0").graph("train").flops_per_sample
    )


def test_phase_two_packs_sequences_so_a_sequence_costs_less_than_a_full_slot():
    bert = get_workload("bert-large")
    packed = bert.graph("train", 512)
    assert packed.objective == "pretraining" and packed.samples_per_slot > 1.5
    assert packed.flops_per_sample < bert.graph("infer", 512).flops_per_sample / 1.5
    assert bert.graph("train", 384).objective == "squad-finetuning"
    assert bert.graph("train", 128).samples_per_slot == 1.0


def test_mcmc_flops_come_from_dimension_and_leapfrog_steps():
    from vipu.emulator.catalogue.probabilistic import MCMC_DIMENSION, MCMC_LEAPFROG_STEPS, MCMC_OBSERVATIONS

    graph = get_workload("mcmc").graph("infer")
    # Each leapfrog step: X.theta and X^T.r, 2 x N x d MACs; one more X.theta for the energy.
    macs = (2 * MCMC_LEAPFROG_STEPS + 1) * MCMC_OBSERVATIONS * MCMC_DIMENSION
    assert sum(op.macs for layer in graph.layers for op in layer.ops) == macs
    assert not graph.trainable
    kinds = {op.kind for layer in graph.layers for op in layer.ops}
    assert OpKind.RECURRENT in kinds
