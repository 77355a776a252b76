"""The calibration: every published Bow Pod16 row within 15%, and the compile-time figures."""

import pytest

from vipu.emulator import EmulatedRun, WorkloadSpec, plan
from vipu.emulator.calibration import BOW_POD16_TABLE


@pytest.mark.parametrize("row", BOW_POD16_TABLE, ids=lambda r: r.label)
def test_bow_pod16_row_within_15_percent(row):
    spec = WorkloadSpec(
        model=row.model, task="train", batch_size=row.global_batch, seq_len=row.seq_len, precision="fp16"
    )
    p = plan(spec, 16, "bow")
    assert p.global_batch == row.global_batch
    assert p.throughput == pytest.approx(row.published, rel=0.15)


def test_compile_times_match_the_reference():
    base = EmulatedRun(plan(WorkloadSpec(model="bert-base", batch_size=65536), 4, "bow"), cached=False)
    assert 7 * 60 <= base.compile_s <= 9 * 60
    large = EmulatedRun(plan(WorkloadSpec(model="bert-large", batch_size=65536), 64, "bow"), cached=False)
    assert 8 * 60 <= large.compile_s <= 11 * 60
