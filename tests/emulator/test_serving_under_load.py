"""The plan's prediction under load: the replica's batching policy replayed on the plan's times."""

from __future__ import annotations

import pytest

from vipu import emulator


def _plan(model: str = "lstm") -> emulator.ServePlan:
    spec = emulator.WorkloadSpec(model=model, task="infer", seq_len=128, precision="fp16")
    return emulator.serve_plan(spec, machine="m2000", ipus=1, max_batch_size=8)


def test_an_idle_replica_gives_the_plans_latency() -> None:
    plan = _plan()
    gap = plan.step_s(1) * 1.5
    assert plan.under_load([i * gap for i in range(5)]) == pytest.approx([plan.latency_s(1)] * 5)
    assert plan.p99_under_load(0.5 / plan.step_s(1)) == pytest.approx(plan.latency_s(1))


def test_a_request_arriving_while_the_device_runs_waits_for_it_then_joins_the_next_batch() -> None:
    plan = _plan()
    s1 = plan.step_s(1)
    # One alone, then three while it runs: they wait for the device and go as one batch of 3.
    lat = plan.under_load([0.0, 0.1 * s1, 0.2 * s1, 0.3 * s1])
    assert lat[0] == pytest.approx(plan.latency_s(1))
    assert lat[1] == pytest.approx(0.9 * s1 + plan.latency_s(3))
    assert lat[3] == pytest.approx(0.7 * s1 + plan.latency_s(3))
    # Under a steady load the p99 is about a step above the latency alone, never two.
    p99 = plan.p99_under_load(0.5 * plan.throughput(8), max_batch_size=8)
    assert plan.latency_s(4) + 0.9 * s1 < p99 < plan.latency_s(8) + plan.step_s(8) * 1.01


def test_batches_stop_at_max_batch_size_and_wait_at_most_max_wait() -> None:
    plan = _plan()
    lat = plan.under_load([0.0] * 3, max_batch_size=2)
    assert lat[:2] == pytest.approx([plan.latency_s(2)] * 2)
    assert lat[2] == pytest.approx(plan.step_s(2) + plan.latency_s(1))
    # A lone request waits max_wait_ms for company, then goes alone.
    (alone,) = plan.under_load([0.0], max_batch_size=4, max_wait_ms=2.0)
    assert alone == pytest.approx(0.002 + plan.latency_s(1))
    # A batch that fills before max_wait_ms goes when it is full.
    full = plan.under_load([0.0, 0.0005], max_batch_size=2, max_wait_ms=2.0)
    assert full == pytest.approx([0.0005 + plan.latency_s(2), plan.latency_s(2)])
