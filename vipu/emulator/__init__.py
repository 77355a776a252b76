"""The emulated IPU: a performance emulator in the spirit of Poplar's IPU Model.

Pure library: no database, no web, no clock. Given a workload (from the catalogue, or a tenant's own
ONNX graph through ``onnxgraph``), a machine type and a partition it plans the job (pipelining and
replication), checks every IPU's share fits in 900 MB, models compile time with an executable cache,
and times every step from compute, exchange, sync, links and host I/O. ``docs/emulator.md`` has the
model and its calibration.
"""

from vipu.emulator.catalogue import Workload, catalogue, get_workload
from vipu.emulator.errors import CompileError, WorkloadError
from vipu.emulator.estimate import Estimate, estimate, predicted_runtime_s
from vipu.emulator.machines import MACHINES, Machine
from vipu.emulator.planner import Plan, StagePlan, choose_ipus_auto, plan
from vipu.emulator.run import EmulatedRun, Progress, RunEvent, Timeline
from vipu.emulator.serving import (
    MAX_SERVE_BATCH,
    ServePlan,
    Signature,
    TensorSpec,
    choose_serving_ipus,
    outputs_for,
    serve_plan,
    signature_of,
)
from vipu.emulator.spec import WorkloadSpec

__all__ = [
    "MACHINES",
    "MAX_SERVE_BATCH",
    "CompileError",
    "EmulatedRun",
    "Estimate",
    "Machine",
    "Plan",
    "Progress",
    "RunEvent",
    "ServePlan",
    "Signature",
    "StagePlan",
    "TensorSpec",
    "Timeline",
    "Workload",
    "WorkloadError",
    "WorkloadSpec",
    "catalogue",
    "choose_ipus_auto",
    "choose_serving_ipus",
    "estimate",
    "get_workload",
    "outputs_for",
    "plan",
    "predicted_runtime_s",
    "serve_plan",
    "signature_of",
]
