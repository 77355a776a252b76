"""The run timeline: cluster time only, deterministic, every event once, phases in order."""

import math

from vipu.emulator import EmulatedRun, WorkloadSpec, plan


def make_run(**kwargs) -> EmulatedRun:
    spec = WorkloadSpec(model="resnet50", batch_size=1024, **kwargs)
    return EmulatedRun(plan(spec, 16, "m2000"), spec, cached=False)


def test_timeline_adds_up():
    run = make_run(steps=500)
    assert run.total_s == run.compile_s + run.load_s + run.steps * run.step_s
    assert run.samples_per_step == 1024
    assert run.ipu_hours == 16 * run.total_s / 3600


def test_samples_round_up_to_whole_steps():
    run = make_run(samples=10_000)
    assert run.steps == math.ceil(10_000 / 1024)
    assert run.progress_at(math.inf).samples == run.steps * 1024


def test_phases_follow_compile_load_run_done():
    run = make_run(steps=50)
    assert run.progress_at(0).phase == "compile"
    assert run.progress_at(run.compile_s + run.load_s / 2).phase == "load"
    mid = run.progress_at(run.run_start_s + 10.5 * run.step_s)
    assert mid.phase == "run" and mid.step == 10 and mid.samples == 10 * 1024 and mid.throughput > 0
    assert run.progress_at(run.total_s).phase == "done"
    assert run.progress_at(-5).phase == "compile"


def test_polling_in_windows_returns_every_event_exactly_once():
    run = make_run(steps=1000)
    everything = run.events()
    seen = []
    t = 0.0
    tick = run.total_s / 997  # windows that do not line up with steps
    while t < run.total_s + tick:
        seen.extend(run.events_between(t, t + tick))
        t += tick
    assert [(e.t, e.kind) for e in seen] == [(e.t, e.kind) for e in everything]
    kinds = [e.kind for e in everything]
    assert kinds[:3] == ["plan", "compile_start", "compile_end"] or kinds[:2] == ["plan", "compile_start"]
    assert kinds.count("done") == 1 and kinds[-1] == "done"
    steps = [e.data["step"] for e in everything if e.kind == "step"]
    assert steps == sorted(steps) and 9 <= len(steps) <= 200


def test_a_window_ending_at_the_end_gets_done_and_the_next_does_not():
    run = make_run(steps=5)
    assert run.events_between(0, run.total_s)[-1].kind == "done"
    assert run.events_between(run.total_s, run.total_s + 100) == []


def test_compile_end_reports_memory_per_stage_and_events_are_json():
    import json

    run = make_run(steps=5)
    end = next(e for e in run.events() if e.kind == "compile_end")
    assert end.data["memory_per_stage_bytes"] == [s.memory_bytes for s in run.plan.stages]
    assert "MB" in end.message
    json.dumps([e.to_dict() for e in run.events()])
    json.dumps(run.progress_at(123.0).to_dict())


def test_same_inputs_same_timeline():
    a, b = make_run(steps=77), make_run(steps=77)
    assert [e.to_dict() for e in a.events()] == [e.to_dict() for e in b.events()]
    assert a.progress_at(1234.5) == b.progress_at(1234.5)
