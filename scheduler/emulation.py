"""What the control plane asks of the emulator: validate a workload, size it, predict its run time.

Results are cached by the request's fields: the planner is deterministic, and admission calls it
on every submission.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from sqlalchemy.orm import Session

from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import MAX_FLEET_IPUS, WorkloadRequest
from scheduler.services import own_models
from vipu import emulator
from vipu.emulator.catalogue import WORKLOAD_NAMES
from vipu.emulator.spec import GraphSource
from vipu.topology import pods_of

# What an estimate with no machine named is made for when the fleet says nothing else (the
# reference type: rate 1.0). Jobs that may run on any type are resolved on each type they may use.
DEFAULT_MACHINE = "m2000"


@dataclass(frozen=True)
class Resolved:
    ipus: int
    machine: str
    predicted_runtime_s: float  # compile included
    executable_key: str = ""
    cached_runtime_s: float | None = None  # when the executable is in the cache: no compile

    def given_cache(self, cached: bool) -> Resolved:
        """This answer with the run time the job will have: without compile when ``cached``."""
        if not cached or self.cached_runtime_s is None:
            return self
        return dataclasses.replace(self, predicted_runtime_s=self.cached_runtime_s)


def to_workload_spec(req: WorkloadRequest, source: GraphSource | None = None) -> emulator.WorkloadSpec:
    """The emulator's spec of a request; ``source`` is the tenant's own graph it names (``own_models``)."""
    try:
        return emulator.WorkloadSpec(
            model=getattr(source, "model_id", req.model) if source is not None else req.model,
            task=req.task,
            batch_size=req.batch_size,
            seq_len=req.seq_len,
            precision=req.precision,
            steps=req.steps,
            samples=req.samples,
            dims=req.dims,
            optimizer=req.optimizer,
            source=source,
        )
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc), field=getattr(exc, "field", None))
    except ValueError as exc:
        raise InvalidRequest(str(exc))


def resolve(
    req: WorkloadRequest, ipus: int | Literal["auto"], machine: str | None, source: GraphSource | None = None
) -> Resolved:
    return _resolve_cached(req.model_dump_json(), str(ipus), machine, source)


@lru_cache(maxsize=4096)
def _resolve_cached(req_json: str, ipus: str, machine: str | None, source: GraphSource | None) -> Resolved:
    req = WorkloadRequest.model_validate_json(req_json)
    spec = to_workload_spec(req, source)
    m = machine or DEFAULT_MACHINE
    try:
        size = emulator.choose_ipus_auto(spec, m) if ipus == "auto" else int(ipus)
        planned = emulator.plan(spec, size, m)
    except emulator.CompileError as exc:
        raise DoesNotFit(str(exc), ipus=None if ipus == "auto" else int(ipus), machine=m)
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc))
    except ValueError as exc:
        # A partition this type can never form (larger than one C2 server, say).
        raise DoesNotFit(str(exc), ipus=None if ipus == "auto" else int(ipus), machine=m)
    return Resolved(
        ipus=size,
        machine=m,
        predicted_runtime_s=emulator.predicted_runtime_s(spec, size, m),
        executable_key=planned.executable_key,
        cached_runtime_s=emulator.predicted_runtime_s(spec, size, m, cached=True),
    )


def stored_workload_spec(workload: Mapping[str, Any], *, session: Session | None) -> emulator.WorkloadSpec:
    """The emulator's spec of a job's stored ``workload``: a catalogue model, or an own model by id."""
    model = workload.get("model")
    source = None
    if isinstance(model, str) and model not in WORKLOAD_NAMES:
        source = own_models.cached_source(model)
        if source is None and session is not None:
            source = own_models.source_by_id(session=session, model_id=model)
        if source is None:
            raise emulator.WorkloadError("model", f"model {model} no longer exists")
    return emulator.WorkloadSpec.from_dict(workload, source=source)


def plan_on_partition(
    spec: dict[str, object],
    size: int,
    machine_type: str,
    ipu_ids: list[str],
    *,
    session: Session | None = None,
) -> tuple[emulator.Plan, emulator.WorkloadSpec]:
    """How a job's workload runs on the partition it really got: timed on the POD64s it spans and
    whether GW-Links join them. What a host agent asks when it takes an attempt; raises the
    emulator's CompileError or WorkloadError when it cannot run there.

    A tenant's own model is read through ``session`` the first time (the job's spec carries its id, as
    admission stored it) and cached: any host plans it as the API admitted it."""
    workload = stored_workload_spec(spec["workload"], session=session)  # type: ignore[arg-type]
    pods = pods_of(ipu_ids)
    return emulator.plan(workload, size, machine_type, pods=len(pods), gw_links=len(pods) > 1), workload


def serve_plan_on_partition(
    spec: dict[str, object], size: int, machine_type: str, *, session: Session | None = None
) -> tuple[emulator.ServePlan, emulator.WorkloadSpec]:
    """How a serving replica's model is laid out on the partition it got: what a host agent asks
    when it takes a replica's attempt, for batches of up to the spec's ``max_batch_size``; raises the
    emulator's CompileError or WorkloadError when it cannot serve there."""
    workload = stored_workload_spec(spec["workload"], session=session)  # type: ignore[arg-type]
    batch = int(spec.get("max_batch_size") or workload.batch_size or 1)  # type: ignore[call-overload]
    return _serve_plan_cached(workload, size, machine_type, batch), workload


@lru_cache(maxsize=1024)
def _serve_plan_cached(
    workload: emulator.WorkloadSpec, size: int, machine_type: str, max_batch_size: int
) -> emulator.ServePlan:
    return emulator.serve_plan(workload, machine=machine_type, ipus=size, max_batch_size=max_batch_size)


_RUNS: dict[tuple[str, bool], emulator.EmulatedRun] = {}
_RUNS_MAX = 1024


def emulated_run(
    plan: emulator.Plan, spec: emulator.WorkloadSpec, *, cached: bool, first_step: int = 0
) -> emulator.EmulatedRun:
    """The run's timeline and events; immutable, so one object serves every attempt of the same
    configuration (a host agent may drive thousands of them). `first_step`: resumed from a
    checkpoint after that step."""
    key = (f"{plan.executable_key}|{plan.ipus}|{plan.timing.step_s!r}|{spec!r}|{first_step}", cached)
    run = _RUNS.get(key)
    if run is None:
        if len(_RUNS) >= _RUNS_MAX:
            _RUNS.clear()
        run = _RUNS[key] = emulator.EmulatedRun(plan, spec, cached=cached, first_step=first_step)
    return run


@dataclass(frozen=True)
class RuntimeAdvice:
    """A job predicted to run longer than its plan allows, and what of it would fit."""

    predicted_s: float
    limit_s: int
    ipus: int
    unit: Literal["steps", "samples"]
    fitting_amount: int  # steps (or samples) that end within the limit on the same IPUs; 0: none
    fitting_ipus: int | None  # the smallest larger partition (within the plan) where all of it ends in time

    def message(self, plan_name: str) -> str:
        options = []
        if self.fitting_amount > 0:
            options.append(f"at most {self.fitting_amount:,} {self.unit} on {self.ipus} IPUs")
        if self.fitting_ipus is not None:
            options.append(f"all of it on {self.fitting_ipus} IPUs")
        fits = f"It would fit with {' or '.join(options)}; or" if options else "Or"
        return (
            f"This job is predicted to run {self.predicted_s:,.0f} s ({self.predicted_s / 3600:.1f} h) "
            f"but the {plan_name} plan allows {self.limit_s:,} s ({self.limit_s / 3600:.1f} h) per job: "
            f"it would be stopped, unfinished, and billed. {fits} set max_runtime_s "
            f"(at most {self.limit_s:,}) to run it for that long and stop it there."
        )

    def fields(self) -> dict[str, object]:
        return {
            "predicted_runtime_s": round(self.predicted_s, 3),
            "max_runtime_s": self.limit_s,
            f"fitting_{self.unit}": self.fitting_amount,
            "fitting_ipus": self.fitting_ipus,
        }


def runtime_advice(
    req: WorkloadRequest,
    ipus: int,
    machine: str | None,
    limit_s: int,
    max_ipus: int,
    source: GraphSource | None = None,
) -> RuntimeAdvice | None:
    """None if the job ends within `limit_s` cluster seconds on `ipus` IPUs; else what would fit.

    Predicted as admission predicts (on the slower machine when either may run it, no executable
    cache), so the advice holds wherever the job lands."""
    return _runtime_advice_cached(req.model_dump_json(), ipus, machine, limit_s, max_ipus, source)


@lru_cache(maxsize=1024)
def _runtime_advice_cached(
    req_json: str, ipus: int, machine: str | None, limit_s: int, max_ipus: int, source: GraphSource | None
) -> RuntimeAdvice | None:
    req = WorkloadRequest.model_validate_json(req_json)
    spec = to_workload_spec(req, source)
    m = machine or DEFAULT_MACHINE
    run = emulator.EmulatedRun(emulator.plan(spec, ipus, m), spec, cached=False)
    if run.total_s <= limit_s:
        return None
    steps = max(0, math.floor((limit_s - run.compile_s - run.load_s) / run.step_s))
    by_samples = req.samples is not None
    fitting_ipus = None
    size = ipus * 2
    while size <= min(max_ipus, MAX_FLEET_IPUS):
        try:
            if emulator.predicted_runtime_s(spec, size, m) <= limit_s:
                fitting_ipus = size
                break
        except emulator.CompileError:
            pass
        size *= 2
    return RuntimeAdvice(
        predicted_s=run.total_s,
        limit_s=limit_s,
        ipus=ipus,
        unit="samples" if by_samples else "steps",
        fitting_amount=steps * run.samples_per_step if by_samples else steps,
        fitting_ipus=fitting_ipus,
    )
