"""Estimates: what POST /estimates and `ipucloud estimate --json` return."""

import json

import pytest

from vipu.emulator import EmulatedRun, WorkloadError, WorkloadSpec, estimate, plan, predicted_runtime_s


def test_estimate_has_the_contract_fields_and_is_json():
    est = estimate(
        {"model": "bert-large", "task": "train", "batch_size": 4096, "seq_len": 128, "steps": 100}, 16, "bow"
    )
    d = json.loads(json.dumps(est.to_dict()))
    for key in (
        "fits",
        "plan",
        "throughput",
        "compile_s",
        "step_s",
        "total_s",
        "ipu_hours",
        "memory_per_ipu_bytes",
        "error",
    ):
        assert key in d
    assert d["fits"] is True and d["error"] is None
    assert d["ipu_hours"] == pytest.approx(16 * d["total_s"] / 3600)
    assert d["total_s"] == pytest.approx(d["compile_s"] + d["load_s"] + 100 * d["step_s"])
    assert d["plan"]["ipus"] == 16


def test_auto_reports_the_chosen_partition():
    est = estimate(WorkloadSpec(model="bert-large", batch_size=512), "auto", "m2000")
    assert est.fits and est.ipus_auto and est.ipus is not None and est.ipus >= 4


def test_a_job_that_does_not_fit_is_an_answer_not_an_exception():
    est = estimate({"model": "bert-large", "precision": "fp32", "batch_size": 64}, 1)
    assert est.fits is False
    assert est.error is not None and "900 MB" in est.error
    assert est.memory_per_ipu_bytes is not None and est.memory_per_ipu_bytes > 940_000_000
    assert est.throughput is None and est.total_s is None
    json.dumps(est.to_dict())


def test_bad_input_still_raises():
    with pytest.raises(WorkloadError):
        estimate({"model": "nope"}, 4)
    with pytest.raises(ValueError):
        estimate({"model": "lstm"}, 6)
    with pytest.raises(ValueError):
        estimate({"model": "lstm"}, "some")  # type: ignore[arg-type]


def test_cached_estimate_is_shorter_by_the_compile_time():
    spec = WorkloadSpec(model="resnet50", batch_size=1024)
    cold, warm = estimate(spec, 8, "bow"), estimate(spec, 8, "bow", cached=True)
    assert warm.compile_s == 0 and cold.compile_s is not None and cold.compile_s > 0
    assert warm.total_s is not None and cold.total_s is not None
    assert warm.total_s == pytest.approx(cold.total_s - cold.compile_s)


def test_predicted_runtime_is_the_uncached_total():
    spec = WorkloadSpec(model="gru", batch_size=2048, steps=300)
    run = EmulatedRun(plan(spec, 4, "m2000"), spec, cached=False)
    assert predicted_runtime_s(spec, 4, "m2000") == run.total_s
