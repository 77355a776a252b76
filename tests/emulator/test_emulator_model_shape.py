"""The shape of the model: scaling, machine, precision, cache, links and task behave as hardware does."""

import itertools

import pytest

from vipu.emulator import EmulatedRun, WorkloadSpec, catalogue, plan


@pytest.mark.parametrize("model", ["resnet50", "bert-large"])
def test_throughput_grows_with_the_partition_but_never_faster_than_linearly(model):
    spec = WorkloadSpec(model=model, batch_size=65536)
    sizes = [16, 32, 64, 128, 256]
    throughput = [plan(spec, n, "bow").throughput for n in sizes]
    for small, big in itertools.pairwise(throughput):
        assert small < big <= 2.0 * small


@pytest.mark.parametrize(
    ("model", "task", "batch"),
    [
        ("resnet50", "train", 1024),
        ("bert-large", "train", 4096),
        ("efficientnet-b0", "infer", 1024),
        ("lstm", "train", 1024),
        ("mcmc", "infer", 1024),
        ("deep-autoencoder", "train", 512),
    ],
)
def test_bow_is_faster_than_m2000_by_its_clock_ratio(model, task, batch):
    spec = WorkloadSpec(model=model, task=task, batch_size=batch)
    ratio = plan(spec, 16, "bow").throughput / plan(spec, 16, "m2000").throughput
    assert 1.2 <= ratio <= 1.45


@pytest.mark.parametrize("model", ["resnet50", "bert-base", "gru", "efficientnet-b0"])
def test_fp32_is_slower_than_fp16(model):
    fp16 = plan(WorkloadSpec(model=model, batch_size=1024, precision="fp16"), 16, "m2000")
    fp32 = plan(WorkloadSpec(model=model, batch_size=1024, precision="fp32"), 16, "m2000")
    assert fp32.throughput < fp16.throughput
    assert fp32.memory_per_ipu_bytes > 0


def test_a_cached_rerun_skips_compilation():
    p = plan(WorkloadSpec(model="bert-large", batch_size=4096, steps=10), 16, "m2000")
    first = EmulatedRun(p, cached=False)
    again = EmulatedRun(p, cached=True)
    assert first.compile_s > 60 and again.compile_s == 0
    assert again.total_s == pytest.approx(first.total_s - first.compile_s)
    assert again.progress_at(0).phase == "load"
    kinds = [e.kind for e in again.events()]
    assert "cache_hit" in kinds and "compile_start" not in kinds
    assert "compile_start" in [e.kind for e in first.events()]


@pytest.mark.parametrize("model", ["resnet50", "bert-large"])
def test_crossing_gw_links_costs_more_allreduce_per_step(model):
    spec = WorkloadSpec(model=model, batch_size=65536)
    inside = plan(spec, 64, "m2000")
    across = plan(spec, 128, "m2000")
    assert not inside.gw_links and across.gw_links and across.pods == 2
    assert inside.timing.allreduce_gw_link_s == 0
    assert across.timing.allreduce_gw_link_s > 0
    assert across.timing.allreduce_s > inside.timing.allreduce_s
    # The same partition size with its traffic kept off the GW-Links would be cheaper.
    pinned = dict(
        ipus_per_replica=across.ipus_per_replica,
        micro_batch=across.micro_batch,
        optimizer_offchip=across.optimizer_offchip,
        recompute=across.recompute,
    )
    no_gw = plan(spec, 128, "m2000", pods=1, gw_links=False, **pinned)
    assert no_gw.timing.allreduce_s < across.timing.allreduce_s


@pytest.mark.parametrize("name", [w.name for w in catalogue() if "train" in w.tasks])
def test_inference_is_faster_per_sample_than_training(name):
    w = next(w for w in catalogue() if w.name == name)
    train = plan(WorkloadSpec(model=name, task="train", batch_size=1024), 16, "m2000")
    infer = plan(
        WorkloadSpec(
            model=name, task="infer", batch_size=1024, seq_len=train.spec.seq_len if w.seq_lens else None
        ),
        16,
        "m2000",
    )
    assert infer.throughput > train.throughput


def test_longer_sequences_are_slower():
    short = plan(WorkloadSpec(model="lstm", batch_size=1024, seq_len=64), 4, "bow")
    long = plan(WorkloadSpec(model="lstm", batch_size=1024, seq_len=256), 4, "bow")
    assert long.throughput < short.throughput / 2
