"""Property: any valid spec on any partition either plans consistently and runs, or fails to compile."""

from hypothesis import given, settings
from hypothesis import strategies as st

from vipu.emulator import CompileError, EmulatedRun, WorkloadSpec, catalogue, plan
from vipu.emulator.machines import MACHINES


@st.composite
def jobs(draw: st.DrawFn) -> tuple[WorkloadSpec, int, str]:
    w = draw(st.sampled_from(catalogue()))
    task = draw(st.sampled_from(w.tasks))
    seq = draw(st.sampled_from(w.seq_lens)) if w.seq_lens else None
    batch = draw(st.integers(min_value=w.min_batch_size, max_value=w.max_batch_size))
    precision = draw(st.sampled_from(w.precisions))
    steps = draw(st.integers(min_value=1, max_value=10_000))
    machine = draw(st.sampled_from(sorted(MACHINES)))
    # Up to the largest partition the type forms (whole POD64s, or one C2 server).
    largest = min(12, MACHINES[machine].max_partition.bit_length() - 1)
    ipus = 2 ** draw(st.integers(min_value=0, max_value=largest))
    spec = WorkloadSpec(
        model=w.name, task=task, batch_size=batch, seq_len=seq, precision=precision, steps=steps
    )
    return spec, ipus, machine


@settings(max_examples=60, deadline=None)
@given(jobs(), st.floats(min_value=0.0, max_value=1.0))
def test_any_job_plans_consistently_or_fails_to_compile(job, fraction):
    spec, ipus, machine = job
    try:
        p = plan(spec, ipus, machine)
    except CompileError as err:
        assert err.suggestion
        if err.needed_bytes is not None:
            assert err.available_bytes is not None and err.needed_bytes > err.available_bytes
        return
    assert p.ipus_per_replica * p.replicas == ipus
    assert p.global_batch >= spec.global_batch
    assert p.global_batch == p.replicas * p.micro_batch * p.micro_batches_per_step
    assert p.memory_per_ipu_bytes <= MACHINES[machine].sram_bytes
    assert p.step_s > 0 and p.compile_s > 0 and p.load_s > 0
    run = EmulatedRun(p, spec, cached=False)
    t = fraction * run.total_s
    progress = run.progress_at(t)
    assert 0 <= progress.step <= run.steps
    assert 0.0 <= progress.percent <= 100.0
    events = run.events_between(0.0, t) + run.events_between(t, run.total_s + 1.0)
    assert [(e.t, e.kind) for e in events] == [(e.t, e.kind) for e in run.events()]
