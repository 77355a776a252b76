"""Job traces: read a CSV of submissions (Philly's format by default) into jobs the simulator replays.

Columns are mapped by name, so any trace with a submission time, a run time, a size and a tenant
works. Sizes are rounded up to a power of two (a partition's size is one) and capped at the largest
partition the simulated fleet can form. Jobs are replayed in submission order; rows submitted in the
same second keep their order in the file.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO


class TraceError(ValueError):
    """The trace cannot be read with the given column mapping."""


@dataclass(frozen=True)
class Columns:
    submit: str = "timestamp"
    duration: str = "duration"
    size: str = "num_gpus"
    tenant: str = "cluster"


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit_s: float  # seconds after the first submission
    duration_s: float
    size: int
    tenant: str
    requested_size: int  # as in the trace, before rounding and capping
    # The run time the user asked for, where the trace has it (SWF logs do: scheduler/simulator/swf.py);
    # the ``user`` estimate model then uses it instead of modelling one.
    requested_s: float | None = None
    # Submitted preemptible (an SWF log's best-effort queue): any job that is not may stop it.
    preemptible: bool = False


def round_size(requested: int, largest: int) -> int:
    """The partition a job asks for: the next power of two, at most ``largest``."""
    size = 1 << max(requested - 1, 0).bit_length()
    return min(size, largest)


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise TraceError(f"submission time {text!r} is neither seconds nor an ISO date and time") from exc
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def open_trace(path: Path) -> TextIO:
    """A trace file as text; ``.gz`` traces (the Philly trace the repository carries) are read in place."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return path.open(newline="")


def load_trace(
    path: Path,
    *,
    largest_partition: int,
    columns: Columns = Columns(),
    limit: int | None = None,
    start_row: int = 0,
) -> list[TraceJob]:
    """Read a trace; ``start_row``/``limit`` take a slice of the rows in submission order."""
    try:
        handle = open_trace(path)
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = {columns.submit, columns.duration, columns.size, columns.tenant} - set(
            reader.fieldnames or ()
        )
        if missing:
            raise TraceError(
                f"trace {path} has no column(s) {', '.join(sorted(missing))}; "
                f"it has {', '.join(reader.fieldnames or ())} (map them with the --*-column options)"
            )
        rows: list[tuple[float, int, float, int, str]] = []
        for number, row in enumerate(reader):
            try:
                submitted = _parse_time(row[columns.submit])
                duration = float(row[columns.duration])
                size = int(float(row[columns.size]))
            except (TypeError, ValueError) as exc:
                raise TraceError(f"row {number + 2} of {path}: {exc}") from exc
            if size < 1 or duration < 0:
                raise TraceError(
                    f"row {number + 2} of {path}: size {size} and duration {duration} are not valid"
                )
            rows.append((submitted, number, duration, size, row[columns.tenant]))
    rows.sort()
    if start_row or limit is not None:
        rows = rows[start_row : None if limit is None else start_row + limit]
    if not rows:
        return []
    first = rows[0][0]
    return [
        TraceJob(
            id=f"j{index:06d}",
            submit_s=submitted - first,
            duration_s=duration,
            size=round_size(size, largest_partition),
            tenant=tenant,
            requested_size=size,
        )
        for index, (submitted, _, duration, size, tenant) in enumerate(rows)
    ]
