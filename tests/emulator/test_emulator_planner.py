"""Planning: every workload fits and runs at its small and large sizes; what cannot fit says why."""

import pytest

from vipu.emulator import CompileError, EmulatedRun, WorkloadSpec, catalogue, choose_ipus_auto, plan
from vipu.emulator.machines import MACHINES

PHASES = {"compile": 0, "load": 1, "run": 2, "done": 3}
CASES = [(w.name, task) for w in catalogue() for task in w.tasks]


def run_to_completion(run: EmulatedRun) -> None:
    previous = None
    for i in range(61):
        p = run.progress_at(run.total_s * i / 60)
        if previous is not None:
            assert PHASES[p.phase] >= PHASES[previous.phase]
            assert p.step >= previous.step and p.samples >= previous.samples
            assert p.percent >= previous.percent and p.eta_s <= previous.eta_s
        assert p.memory_per_ipu_bytes == run.plan.memory_per_ipu_bytes
        previous = p
    assert previous is not None and previous.phase == "done"
    assert previous.step == run.steps
    assert previous.samples == run.steps * run.plan.global_batch
    events = run.events()
    assert events[-1].kind == "done"
    assert [e.t for e in events] == sorted(e.t for e in events)


def check_plan(p, ipus: int) -> None:
    assert p.ipus == ipus == p.ipus_per_replica * p.replicas
    assert p.global_batch == p.replicas * p.micro_batch * p.micro_batches_per_step
    assert p.memory_per_ipu_bytes <= MACHINES[p.machine].sram_bytes
    assert max(s.memory_bytes for s in p.stages) == p.memory_per_ipu_bytes
    assert sum(s.compute_share for s in p.stages) == pytest.approx(1.0)
    graph = p.spec.workload.graph(p.spec.task, p.spec.seq_len)
    covered = [i for s in p.stages for i in range(s.first_layer, s.last_layer + 1)]
    assert covered == list(range(len(graph.layers)))
    assert p.throughput > 0 and p.step_s > 0 and p.compile_s > 0


@pytest.mark.parametrize(("name", "task"), CASES)
def test_smallest_size_fits_on_the_auto_partition_and_runs(name, task):
    w = next(w for w in catalogue() if w.name == name)
    seq = min(w.seq_lens) if w.seq_lens else None
    spec = WorkloadSpec(model=name, task=task, batch_size=32, seq_len=seq, steps=20)
    ipus = choose_ipus_auto(spec, "m2000")
    p = plan(spec, ipus, "m2000")
    check_plan(p, ipus)
    if ipus > 1:
        with pytest.raises(CompileError):
            plan(spec, ipus // 2, "m2000")
    run_to_completion(EmulatedRun(p, spec, cached=False))


@pytest.mark.parametrize(("name", "task"), CASES)
def test_largest_size_fits_across_pod64s_and_runs(name, task):
    w = next(w for w in catalogue() if w.name == name)
    seq = max(w.seq_lens) if w.seq_lens else None
    spec = WorkloadSpec(model=name, task=task, batch_size=w.max_batch_size, seq_len=seq, samples=10**7)
    p = plan(spec, 256, "bow")
    check_plan(p, 256)
    assert p.pods == 4 and p.gw_links
    run = EmulatedRun(p, spec, cached=True)
    assert run.steps * run.samples_per_step >= 10**7
    run_to_completion(run)


def test_bert_large_fp32_with_a_huge_micro_batch_on_one_ipu_does_not_compile():
    spec = WorkloadSpec(model="bert-large", task="train", batch_size=512, precision="fp32")
    with pytest.raises(CompileError) as info:
        plan(spec, 1, "m2000", micro_batch=512)
    err = info.value
    assert err.stage == 0
    assert err.needed_bytes is not None and err.available_bytes is not None
    assert err.needed_bytes > err.available_bytes == MACHINES["m2000"].sram_bytes
    text = str(err)
    assert "stage 0" in text and "900 MB" in text and f"{err.needed_bytes:,} bytes" in text
    assert err.suggestion and "Suggestion:" in text
    assert "micro-batch" in err.suggestion and "IPUs" in err.suggestion


def test_the_error_names_the_stage_that_overflows():
    # Pinned to 2 IPUs per replica, BERT-Large training cannot fit; the report is about one stage.
    spec = WorkloadSpec(model="bert-large", task="train", batch_size=64)
    with pytest.raises(CompileError) as info:
        plan(spec, 2, "bow")
    assert info.value.stage in (0, 1)
    assert info.value.stage_layers
    assert f"stage {info.value.stage} of 2" in str(info.value)


def test_auto_picks_the_smallest_power_of_two_that_fits():
    spec = WorkloadSpec(model="bert-large", task="train", batch_size=256)
    ipus = choose_ipus_auto(spec, "bow")
    assert ipus >= 4
    plan(spec, ipus, "bow")
    with pytest.raises(CompileError):
        plan(spec, ipus // 2, "bow")
    assert choose_ipus_auto(WorkloadSpec(model="lstm", batch_size=64), "m2000") == 1


def test_executable_key_covers_what_changes_the_program_and_nothing_else():
    spec = WorkloadSpec(model="resnet50", batch_size=1024, steps=10)
    key = plan(spec, 16, "m2000").executable_key
    assert key == plan(WorkloadSpec(model="resnet50", batch_size=1024, steps=999), 16, "m2000").executable_key
    fp32 = WorkloadSpec(model="resnet50", batch_size=1024, precision="fp32")
    assert key != plan(fp32, 16, "m2000").executable_key
    assert key != plan(spec, 32, "m2000").executable_key
    assert key != plan(spec, 16, "bow").executable_key
    assert key != plan(spec, 16, "m2000", micro_batch=8).executable_key


def test_overrides_pin_the_ipuconfig_choices():
    spec = WorkloadSpec(model="bert-large", task="train", batch_size=2048)
    p = plan(spec, 16, "bow", ipus_per_replica=4, micro_batch=8, optimizer_offchip=True, recompute=True)
    assert (p.ipus_per_replica, p.replicas, p.micro_batch, p.grad_accum) == (4, 4, 8, 64)
    assert p.optimizer_offchip and p.recompute
    with pytest.raises(CompileError):
        plan(spec, 16, "bow", ipus_per_replica=3)
    with pytest.raises(CompileError):
        plan(spec, 16, "bow", micro_batch=7)


def test_a_batch_that_does_not_divide_over_the_replicas_is_rounded_up_and_said_so():
    spec = WorkloadSpec(model="mcmc", task="infer", batch_size=100)
    p = plan(spec, 64, "m2000")
    assert p.global_batch == 128 and p.requested_batch == 100
    assert any("rounded up" in note for note in p.notes)


def test_a_batch_smaller_than_the_replicas_cannot_be_spread():
    spec = WorkloadSpec(model="mcmc", task="infer", batch_size=8)
    with pytest.raises(CompileError) as info:
        plan(spec, 64, "m2000")
    assert "batch_size of at least" in str(info.value)


def test_bad_partitions_are_rejected():
    spec = WorkloadSpec(model="lstm")
    for bad in (0, 3, 24, 2**17):
        with pytest.raises(ValueError):
            plan(spec, bad, "m2000")
    with pytest.raises(ValueError):
        plan(spec, 4, "a100")


def test_plan_dict_uses_ipuconfig_names_and_is_json():
    import json

    d = json.loads(json.dumps(plan(WorkloadSpec(model="bert-base", batch_size=4096), 16, "bow").to_dict()))
    for key in (
        "ipus_per_replica",
        "replication_factor",
        "layers_per_ipu",
        "gradient_accumulation_steps",
        "device_iterations",
        "optimizer_state_offchip",
        "global_batch",
        "stages",
        "executable_key",
        "memory_per_ipu_bytes",
    ):
        assert key in d
    assert sum(d["layers_per_ipu"]) == 13
