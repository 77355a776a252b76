"""Errors the emulator raises: bad workload specs and graphs that do not compile."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload spec that names an unknown model or breaks one of the model's limits.

    ``field`` names the offending key of the job spec's ``workload`` object so an API can point at it.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"workload.{field}: {message}")


class CompileError(Exception):
    """The graph cannot be compiled for the partition, as Poplar would refuse it.

    Out-of-memory failures carry the stage (pipeline stage = IPU within a replica), the bytes that stage
    needs and the bytes an IPU has; other failures (a batch too small to spread over the replicas) leave
    them ``None``. ``suggestion`` says what to change.
    """

    def __init__(
        self,
        message: str,
        *,
        suggestion: str,
        stage: int | None = None,
        stage_layers: tuple[str, ...] = (),
        needed_bytes: int | None = None,
        available_bytes: int | None = None,
    ) -> None:
        self.message = message
        self.suggestion = suggestion
        self.stage = stage
        self.stage_layers = stage_layers
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        super().__init__(f"{message} Suggestion: {suggestion}")
