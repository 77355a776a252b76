"""Why an ONNX graph cannot be taken: each reason has a code an API turns into its problem."""

from __future__ import annotations

from typing import Literal

GraphProblem = Literal[
    "not-onnx",
    "corrupt",
    "cycle",
    "dangling-input",
    "unknown-operators",
    "unsupported-operators",
    "shape-inference",
    "unknown-shape",
    "too-large",
]


class GraphError(ValueError):
    """An ONNX graph the emulator cannot plan. ``code`` names the kind of problem, ``names`` the nodes,
    tensors, operators or dimensions it is about, so a caller can list them."""

    def __init__(self, code: GraphProblem, message: str, names: tuple[str, ...] = ()) -> None:
        self.code = code
        self.message = message
        self.names = names
        super().__init__(message)
