"""What the control plane asks of the emulator: validate a workload, size it, predict its run time.

Results are cached by the request's fields: the planner is deterministic, and admission calls it
on every submission.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from scheduler.errors import DoesNotFit, InvalidRequest
from scheduler.jobspec import WorkloadRequest
from vipu import emulator

# What an estimate with no machine named is made for when the fleet says nothing else (the
# reference type: rate 1.0). Jobs that may run on any type are resolved on each type they may use.
DEFAULT_MACHINE = "m2000"


@dataclass(frozen=True)
class Resolved:
    ipus: int
    machine: str
    predicted_runtime_s: float


def to_workload_spec(req: WorkloadRequest) -> emulator.WorkloadSpec:
    try:
        return emulator.WorkloadSpec(
            model=req.model,
            task=req.task,
            batch_size=req.batch_size,
            seq_len=req.seq_len,
            precision=req.precision,
            steps=req.steps,
            samples=req.samples,
        )
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc), field=getattr(exc, "field", None))
    except ValueError as exc:
        raise InvalidRequest(str(exc))


def resolve(req: WorkloadRequest, ipus: int | Literal["auto"], machine: str | None) -> Resolved:
    return _resolve_cached(req.model_dump_json(), str(ipus), machine)


@lru_cache(maxsize=4096)
def _resolve_cached(req_json: str, ipus: str, machine: str | None) -> Resolved:
    req = WorkloadRequest.model_validate_json(req_json)
    spec = to_workload_spec(req)
    m = machine or DEFAULT_MACHINE
    try:
        size = emulator.choose_ipus_auto(spec, m) if ipus == "auto" else int(ipus)
        emulator.plan(spec, size, m)
    except emulator.CompileError as exc:
        raise DoesNotFit(str(exc), ipus=None if ipus == "auto" else int(ipus), machine=m)
    except emulator.WorkloadError as exc:
        raise InvalidRequest(str(exc))
    except ValueError as exc:
        # A partition this type can never form (larger than one C2 server, say).
        raise DoesNotFit(str(exc), ipus=None if ipus == "auto" else int(ipus), machine=m)
    return Resolved(ipus=size, machine=m, predicted_runtime_s=emulator.predicted_runtime_s(spec, size, m))
