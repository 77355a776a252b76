"""Which machine type a job that may run on several runs on: heterogeneity-aware placement.

A job submitted with ``machine: any`` carries one ``MachineOption`` per type it fits on (its
partition size there, the emulator's predicted run time there, the rate it would be billed). Before
a pass places such a job, ``Chooser.settle`` turns it into a job of one type, and from there on the
pass treats it like any typed job: it starts, is reserved for, is backfilled around, on that type.

- ``finish`` (the default policy): the type where it is predicted to **finish** first, counting the
  wait there and the run time there. A type where it can start now finishes at ``now + run time``;
  one where it cannot finishes at its reserved start (the same earliest-start question EASY
  backfill asks, answered on the time table of running jobs) plus its run time. So a job waits a
  few minutes for a Bow partition rather than starting now on a first-generation server where it
  would run three times longer, but takes the server when the wait would cost more than that.
  A job whose tenant asked for ``prefer: cost`` goes where it spends the least of its grant
  (rate x size x run time), ties broken by the earliest finish.
- ``first-fit`` (the type-blind baseline): the first type, in registry order, with room for it now;
  when none has room, the type where it can start soonest. It knows which types the job fits on,
  not how fast it runs on each.

Start estimates are cached per (type, size) for the pass: free space only shrinks while a pass
places jobs, so a cached start is never later than the truth by more than what the pass itself
started, and it is asked only when a type without room could beat one with room.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, Protocol

from scheduler.policy.model import MachineOption, QueuedJob, Reservation

Objective = Literal["finish", "first-fit"]
OBJECTIVES: tuple[Objective, ...] = ("finish", "first-fit")


class Planner(Protocol):
    """What the chooser asks of a pass's planner (``scheduler.policy.planners``)."""

    def fits_now(self, job: QueuedJob) -> bool: ...

    def reserve(self, job: QueuedJob) -> Reservation: ...


def typed(job: QueuedJob, option: MachineOption) -> QueuedJob:
    """The job as a job of ``option``'s type only. (Its quota was judged before, on what its
    reservation covers: its dearest option.)"""
    # Built directly rather than with dataclasses.replace: a pass settles thousands of jobs.
    fields = {name: getattr(job, name) for name in _FIELDS}
    fields.update(
        machine_type=option.machine_type,
        size=option.size,
        predicted_runtime_s=option.predicted_runtime_s,
        options=(),
    )
    return QueuedJob(**fields)


_FIELDS = tuple(QueuedJob.__dataclass_fields__)


class Chooser:
    """Settles jobs with several machine options on one, for one pass."""

    def __init__(
        self,
        planner: Planner,
        now: float,
        objective: Objective,
        *,
        timed: bool = True,
        hopeless: Callable[[str, int], bool] | None = None,
        room: Callable[[str, int], bool] | None = None,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown machine choice {objective!r}; one of {', '.join(OBJECTIVES)}")
        self._planner = planner
        self._now = now
        self._objective = objective
        # Without a time table (a count-only planner) reservations are counts, not starts on a type:
        # only first-fit is meaningful.
        self._timed = timed
        # What the pass already knows cannot start now (a size of a type that failed this pass):
        # asking the planner again would only cost time.
        self._hopeless = hopeless or (lambda kind, size: False)
        # Whether a partition of a size and type could form now; by default the planner's answer.
        self._room = room
        self._starts: dict[tuple[str, int], float] = {}

    def settle(self, job: QueuedJob, *, first: bool = True) -> QueuedJob:
        """``job`` as a job of the type it should run on (unchanged when it has no choice).

        ``first``: it is first in line, so where it waits matters (its reservation is made there).
        Behind the first job a job that has no room now on any type waits for the next pass, which
        asks again; it is settled on its first type without asking when each type would have room.
        """
        if job.machine_type is not None or not job.options:
            return job
        if len(job.options) == 1:
            return typed(job, job.options[0])
        return typed(job, self.choose(job, first=first))

    def _fits(self, job: QueuedJob, option: MachineOption) -> bool:
        if self._hopeless(option.machine_type, option.size):
            return False
        if self._room is not None:
            return self._room(option.machine_type, option.size)
        return self._planner.fits_now(typed(job, option))

    def choose(self, job: QueuedJob, *, first: bool = True) -> MachineOption:
        options = job.options
        room = [self._fits(job, option) for option in options]
        if not first and not any(room):
            return options[0]
        if self._objective == "first-fit" or not self._timed:
            for option, fits in zip(options, room, strict=True):
                if fits:
                    return option
            if not self._timed:
                return options[0]
            return min(options, key=lambda o: (self._start(job, o), options.index(o)))

        def finish(option: MachineOption, fits: bool) -> float:
            start = self._now if fits else self._start(job, option)
            return start + option.predicted_runtime_s

        if job.prefer == "cost":
            ranked = sorted(
                zip(options, room, strict=True),
                key=lambda pair: (pair[0].cost_ipu_ms, options.index(pair[0])),
            )
            # The cheapest type it can ever start on; among equally cheap ones, the earliest finish.
            cheapest = [p for p in ranked if p[0].cost_ipu_ms == ranked[0][0].cost_ipu_ms]
            for option, fits in sorted(cheapest, key=lambda p: finish(*p)):
                if math.isfinite(finish(option, fits)):
                    return option
            for option, fits in ranked:
                if math.isfinite(finish(option, fits)):
                    return option
            return ranked[0][0]

        best: tuple[float, int] | None = None
        for n, (option, fits) in enumerate(zip(options, room, strict=True)):
            if fits:
                candidate = (self._now + option.predicted_runtime_s, n)
                if best is None or candidate < best:
                    best = candidate
        for n, (option, fits) in enumerate(zip(options, room, strict=True)):
            if fits:
                continue
            if best is not None and self._now + option.predicted_runtime_s >= best[0]:
                continue  # even starting at once there, it would not finish first
            candidate = (finish(option, False), n)
            if best is None or candidate < best:
                best = candidate
        if best is None or not math.isfinite(best[0]):
            # It can start on no type, not even when everything running has ended (machines are
            # down): wait for the first type, where it is explained.
            return options[0]
        return options[best[1]]

    def _start(self, job: QueuedJob, option: MachineOption) -> float:
        key = (option.machine_type, option.size)
        start = self._starts.get(key)
        if start is None:
            start = self._planner.reserve(typed(job, option)).start
            self._starts[key] = start
        return start
