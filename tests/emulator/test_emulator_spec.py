"""Job-spec validation: clear errors naming the field, defaults from the catalogue."""

import pytest

from vipu.emulator import WorkloadError, WorkloadSpec


def test_defaults_come_from_the_catalogue():
    spec = WorkloadSpec(model="bert-large")
    assert spec.task == "train"
    assert spec.batch_size == 1024 and spec.seq_len == 128 and spec.precision == "fp16"
    assert spec.steps == 100 and spec.samples is None
    assert WorkloadSpec(model="mcmc", task="infer").precision == "fp32"
    assert WorkloadSpec(model="resnet50", samples=5000).steps is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model": "gpt-5"}, "model"),
        ({"model": "mcmc", "task": "train"}, "task"),
        ({"model": "resnet50", "task": "finetune"}, "task"),
        ({"model": "bert-base", "seq_len": 256}, "seq_len"),
        ({"model": "resnet50", "seq_len": 128}, "seq_len"),
        ({"model": "resnet50", "batch_size": 0}, "batch_size"),
        ({"model": "resnet50", "batch_size": 10**7}, "batch_size"),
        ({"model": "resnet50", "batch_size": True}, "batch_size"),
        ({"model": "resnet50", "batch_size": 8.0}, "batch_size"),
        ({"model": "resnet50", "precision": "bf16"}, "precision"),
        ({"model": "resnet50", "steps": 10, "samples": 100}, "steps"),
        ({"model": "resnet50", "steps": 0}, "steps"),
        ({"model": "resnet50", "samples": -1}, "samples"),
    ],
)
def test_bad_specs_raise_a_workload_error_naming_the_field(kwargs, field):
    with pytest.raises(WorkloadError) as info:
        WorkloadSpec(**kwargs)
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_from_dict_rejects_unknown_keys_and_needs_a_model():
    with pytest.raises(WorkloadError) as info:
        WorkloadSpec.from_dict({"model": "resnet50", "epochs": 3})
    assert info.value.field == "epochs"
    with pytest.raises(WorkloadError) as info:
        WorkloadSpec.from_dict({"task": "train"})
    assert info.value.field == "model"
    spec = WorkloadSpec.from_dict({"model": "gru", "task": "infer", "seq_len": 64, "samples": 1000})
    assert spec.to_dict() == {
        "model": "gru",
        "task": "infer",
        "batch_size": 1024,
        "seq_len": 64,
        "precision": "fp16",
        "samples": 1000,
    }


def test_specs_are_hashable_values():
    assert WorkloadSpec(model="lstm") == WorkloadSpec(model="lstm", seq_len=128, precision="fp16")
    assert len({WorkloadSpec(model="lstm"), WorkloadSpec(model="lstm", seq_len=128)}) == 1
