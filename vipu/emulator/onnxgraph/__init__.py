"""Tenants' own models: ONNX graphs planned, fitted and timed like catalogue workloads (PopART's path).

- ``strip``: weights out of an ONNX file without loading it (stdlib only; the CLI runs it before upload).
- ``load``: parse, check (cycles, dangling inputs, unknown operators) and order a graph.
- ``lower``: bind dynamic dimensions, infer shapes, cost every node, fuse element-wise chains, cut layers.
  Its passes: ``classify`` (constants, views, roles), ``costs`` (each heavy node's ops), ``fuse``
  (element-wise regions), ``layers`` (where a pipeline boundary may fall).
- ``workload``: ``OnnxWorkload``, the ``WorkloadSpec`` source the planner takes, and ``describe``.
- ``renderings``: the catalogue's models written as ONNX graphs (parity checks, examples).

``docs/emulator.md`` ("Your own ONNX models") has the rules and the parity figures.
"""

from vipu.emulator.onnxgraph.errors import GraphError
from vipu.emulator.onnxgraph.load import OnnxGraph, load_graph
from vipu.emulator.onnxgraph.strip import (
    GraphTooLarge,
    StripError,
    Stripped,
    strip_any,
    strip_bytes,
    strip_file,
)
from vipu.emulator.onnxgraph.workload import OnnxWorkload, describe

__all__ = [
    "GraphError",
    "GraphTooLarge",
    "OnnxGraph",
    "OnnxWorkload",
    "StripError",
    "Stripped",
    "describe",
    "load_graph",
    "strip_any",
    "strip_bytes",
    "strip_file",
]
