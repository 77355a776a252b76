"""The first-generation GC2 IPU (`c2`): modelled from its published figures through the same equations
and the same fitted constants as GC200 and Bow, with nothing off-chip but host memory over PCIe."""

from __future__ import annotations

import pytest

from vipu.emulator import CompileError, WorkloadSpec, catalogue, estimate, plan
from vipu.emulator.timing import FITTED, ring_allreduce_s
from vipu.machine_types import C2, M2000, MACHINES, get_machine


def test_the_registry_carries_the_published_gc2_figures() -> None:
    assert C2.tiles_per_ipu == 1216 and C2.threads_per_tile == 6
    assert C2.sram_bytes == 304 * 2**20  # 256 KiB per tile
    assert C2.fp16_flops == pytest.approx(1216 * 1.6e9 * 64, rel=1e-3)
    assert C2.amp_macs_per_cycle_per_tile("fp16") == pytest.approx(32, rel=1e-3)
    assert C2.streaming_memory_bytes == 0 and C2.gw_links_per_machine == 0
    assert C2.offchip_store == "host memory"
    assert C2.max_partition == 16 and M2000.max_partition == 65_536
    assert C2.models == ("dss8440", "nf5568m5") and C2.layouts == ("server",)


def test_one_machine_type_class_and_one_set_of_fitted_constants() -> None:
    from vipu.emulator import machines

    assert machines.Machine is type(C2) and machines.MACHINES is MACHINES
    # The calibrated constants are the ones fitted to the Bow Pod16 table; GC2 adds none.
    assert (FITTED.matmul_efficiency, FITTED.conv_efficiency, FITTED.superstep_cycles) == (
        0.407,
        0.846,
        10_800.0,
    )


def test_the_c2_ladder_is_narrower_than_the_pod64_torus() -> None:
    # Inside one card the twin links; across cards, a ring crosses every card boundary twice.
    assert C2.neighbour_link_bytes_per_s(2, ring=True) == 192e9
    assert C2.neighbour_link_bytes_per_s(16, ring=False) == 128e9
    assert C2.neighbour_link_bytes_per_s(16, ring=True) == 64e9
    assert M2000.neighbour_link_bytes_per_s(64, ring=True) == 320e9
    grads = 100e6
    c2_ipu, c2_gw = ring_allreduce_s(grads, 16, 1, C2)
    m2000_ipu, _ = ring_allreduce_s(grads, 16, 1, M2000)
    assert c2_gw == 0.0 and c2_ipu > 4 * m2000_ipu


@pytest.mark.parametrize("workload", catalogue(), ids=lambda w: w.name)
def test_every_catalogue_workload_on_c2_fits_or_says_clearly_why_not(workload) -> None:
    for task in workload.tasks:
        spec = WorkloadSpec(model=workload.name, task=task)
        for ipus in (1, 16):
            try:
                p = plan(spec, ipus, "c2")
            except CompileError as err:
                text = str(err)
                assert "304 MB" in text and "GC2" in text and err.suggestion
                assert err.available_bytes == C2.sram_bytes and err.needed_bytes > err.available_bytes
                continue
            assert p.memory_per_ipu_bytes <= C2.sram_bytes
            assert p.pods == 1 and not p.gw_links
        est = estimate(spec, "auto", "c2")
        assert est.fits or (est.error and "304 MB" in est.error), est.error


def test_no_c2_partition_spans_servers() -> None:
    spec = WorkloadSpec(model="resnet50", task="train")
    with pytest.raises(ValueError, match="at most 16 IPUs"):
        plan(spec, 32, "c2")
    est = estimate(spec, 16, "c2")
    assert est.fits and est.plan is not None and est.plan["pods"] == 1


def test_offchip_optimizer_state_crosses_pcie_to_host_memory() -> None:
    spec = WorkloadSpec(model="bert-large", task="train", seq_len=128)
    p = plan(spec, 16, "c2", optimizer_offchip=True)
    assert any("host memory" in note and "PCIe" in note for note in p.notes)
    on_m2000 = plan(spec, 16, "m2000", optimizer_offchip=True)
    assert not any("host memory" in note for note in on_m2000.notes)
    # The same state moves over a quarter of the host link, so the optimizer step takes longer.
    assert p.timing.optimizer_s > on_m2000.timing.optimizer_s


def test_a_large_model_that_needs_more_than_a_server_points_at_the_pod_types() -> None:
    spec = WorkloadSpec(model="bert-large", task="train", seq_len=512, batch_size=4096, precision="fp32")
    with pytest.raises(CompileError) as caught:
        plan(spec, 16, "c2")
    assert "m2000" in caught.value.suggestion or "fp16" in caught.value.suggestion.lower()


def test_gc200_against_gc2_per_box_is_near_the_vendors_generation_step() -> None:
    """Graphcore called the IPU-M2000 an "8X step up" over first-generation products (a vendor claim).
    The model reaches it from the chips' figures alone: per box, an M2000 (4 IPUs) against a C2 card
    (2 IPUs), ResNet-50 training, at the partition size each box gives."""
    spec = WorkloadSpec(model="resnet50", task="train")
    m2000_box = plan(spec, 4, "m2000").throughput
    c2_card = plan(spec, 2, "c2").throughput
    assert 4 <= m2000_box / c2_card <= 12
    assert get_machine("c2").rate < get_machine("m2000").rate < get_machine("bow").rate
