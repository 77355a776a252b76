"""Preemption: stop running work so a job that waits can start now.

Two kinds of work may be stopped, never a job in a reserved partition (stopping it frees nothing for
anyone else) nor a session's hold on its partition (its owner is working in it):
- work its owner submitted `preemptible` (cheaper), for any job that is not, whoever's: the user's
  choice, always on;
- with the operator's switch (IPUCLOUD_PREEMPTION), any job of a strictly lower priority class.

Victims are tried preemptible first, then lowest class first, then those that would lose least: the
least work since their last checkpoint (times their size: IPU-seconds), the smallest, the most
recently started. Then only the victims whose IPUs the new partition actually needs are kept. A
preempted attempt is requeued and billed only for the work up to its checkpoint, which it keeps
(docs/checkpoints.md).

A job opted out of preemption (``never_preempt``) is never a victim. A policy may add a guard
(`worth_preempting`): a minimum run since the victim's last start, a bound on how often one job is
preempted, and preemption only when what the waiting job gains exceeds what the stop costs
(`PreemptionCost`, the emulator's figures).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from scheduler.policy.model import QueuedJob
from scheduler.policy.running import RunningJob
from vipu.allocator import Allocator, Placement

# The emulator's figures (vipu/emulator/timing.py): attaching and loading an executable is 10 s
# (its fixed part; the image itself streams in well under a second over the host links), and a
# compile of the models of the catalogue takes about 700 s. A checkpoint of a whole IPU's 900 MB
# of In-Processor Memory streams out (and back) over the same links in a fraction of a second, well
# inside the 30 s warning a victim gets (scheduler/services/batch/checkpoints.py).
WARNING_S = 30.0
LOAD_S = 10.0
COMPILE_S = 700.0
CHECKPOINT_IO_S = 0.1


@dataclass(frozen=True, slots=True)
class PreemptionCost:
    """What one preemption costs, in the victim's seconds.

    The victim is warned and keeps its IPUs for ``warning_s`` (the job it makes room for waits that
    long): it checkpoints at the warning (``write_s``) and what it runs after is lost. On its next
    start it loads its executable (``load_s``), or compiles first when that start is on a machine
    type its executable was not built for (``compile_s``), and reads its checkpoint back."""

    warning_s: float = WARNING_S
    write_s: float = CHECKPOINT_IO_S
    load_s: float = LOAD_S
    compile_s: float = COMPILE_S

    def scaled(self, factor: float) -> PreemptionCost:
        """The same costs on a clock ``factor`` times slower (cluster seconds to wall seconds)."""
        return PreemptionCost(
            self.warning_s / factor, self.write_s / factor, self.load_s / factor, self.compile_s / factor
        )

    def restart_s(self, *, same_type: bool = True) -> float:
        """Run time a resumed attempt spends before it does new work."""
        return self.load_s + self.write_s + (0.0 if same_type else self.compile_s)

    def victim_s(self) -> float:
        """Run time the victim loses or repeats: the warning window, then the restart."""
        return self.warning_s + self.restart_s()


NO_COST = PreemptionCost(warning_s=0.0, write_s=0.0, load_s=0.0, compile_s=0.0)


def resumed_runtime_s(predicted_s: float, kept_s: float, restart_s: float = 0.0) -> float:
    """What a job that resumes from a checkpoint is predicted still to run: its prediction less the
    run time its checkpoint kept, never under a second (it still starts and ends), plus ``restart_s``
    before it does new work. A requeued job ranks, is reserved for and is estimated on this, not on
    its whole prediction (the live snapshot and the simulator both call it)."""
    return max(1.0, predicted_s - kept_s) + restart_s


def worth_preempting(
    job: QueuedJob,
    victim: RunningJob,
    now: float,
    *,
    cost: PreemptionCost,
    min_run_s: float,
    max_preemptions: int | None,
    gain: float,
) -> bool:
    """Whether stopping ``victim`` for ``job`` pays: the victim has run ``min_run_s`` since its last
    start and was preempted fewer than ``max_preemptions`` times, and its predicted remaining
    IPU-seconds are more than ``gain`` times the job's predicted IPU-seconds plus the stop's cost
    (under SRPT a swap of two jobs lowers the sum of their completion times by the difference of
    their remaining work; the cost is the time both lose to it)."""
    if now - victim.started_at < min_run_s:
        return False
    if max_preemptions is not None and victim.preemptions >= max_preemptions:
        return False
    remaining = max(0.0, victim.expected_end - now) * victim.size
    needed = job.size * job.predicted_runtime_s
    paid = victim.size * cost.victim_s() + job.size * cost.warning_s
    return remaining > gain * needed + paid


def guard(
    job: QueuedJob,
    now: float,
    *,
    cost: PreemptionCost,
    min_run_s: float,
    max_preemptions: int | None,
    gain: float,
) -> Callable[[RunningJob], bool]:
    """`worth_preempting` for one waiting ``job`` at ``now``, as one test per victim: what depends
    only on the job is worked out once (a pass asks it of every running job of a lower class; on the
    whole Philly trace millions of times). The same answers, to the bit."""
    bound = max_preemptions
    wanted = gain * (job.size * job.predicted_runtime_s)
    victim_s = cost.victim_s()
    warning = job.size * cost.warning_s

    def worth(victim: RunningJob) -> bool:
        if now - victim.started_at < min_run_s:
            return False
        if bound is not None and victim.preemptions >= bound:
            return False
        left = victim.expected_end - now
        return (left if left > 0.0 else 0.0) * victim.size > wanted + (victim.size * victim_s + warning)

    return worth


def may_preempt(job: QueuedJob, victim: RunningJob, *, by_priority: bool) -> bool:
    """Whether ``victim`` may be stopped to make room for ``job``."""
    if victim.reserved or victim.session or victim.never_preempt:
        return False
    if victim.preemptible and not job.preemptible:
        return True
    return by_priority and victim.priority < job.priority


def choose_victims(
    job: QueuedJob,
    running: Collection[RunningJob],
    allocator: Allocator,
    *,
    by_priority: bool = True,
    now: float | None = None,
    allowed: Callable[[RunningJob], bool] | None = None,
) -> tuple[list[RunningJob], Placement] | None:
    """The running jobs to stop and where ``job`` would then go, or None if stopping cannot help.
    ``by_priority``: the operator's switch is on (lower classes may be stopped too); ``now`` ranks
    victims by the work they would lose (without it, by how recently they started); ``allowed``, a
    policy's guard, rules victims out (`worth_preempting`)."""

    def loss(r: RunningJob) -> float:
        return 0.0 if now is None else r.at_risk(now) * r.size

    # Stopping every victim frees at most their IPUs: when even that is too few, no search (and no
    # clone of the allocator) is needed. Asked first of the cheap test, then of the policy's guard.
    free = allocator.free_ipus(job.machine_type)
    # `may_preempt`, inlined: a pass asks it of every running job.
    rank, yields = job.priority, not job.preemptible
    # The class test first: it rules out most running jobs (the same set as in any order).
    if by_priority:
        eligible = [
            r
            for r in running
            if (r.priority < rank or (yields and r.preemptible))
            and not (r.reserved or r.session or r.never_preempt)
        ]
    else:
        eligible = [
            r
            for r in running
            if yields and r.preemptible and not (r.reserved or r.session or r.never_preempt)
        ]
    if free + sum(r.size for r in eligible) < job.size:
        return None
    if allowed is not None:
        eligible = [r for r in eligible if allowed(r)]
        if free + sum(r.size for r in eligible) < job.size:
            return None
    if not eligible:
        return None
    # Not even all of them together make room for a partition of the size (the usual answer): no
    # ranking, no clone, no release one by one. Freeing fewer of them could not do better.
    if allocator.largest_free_after([r.partition for r in eligible], job.machine_type) < job.size:
        return None
    candidates = sorted(
        eligible, key=lambda r: (not r.preemptible, r.priority, loss(r), r.size, -r.started_at, r.id)
    )
    twin = allocator.clone()
    released: list[RunningJob] = []
    for victim in candidates:
        try:
            twin.release(victim.partition)
        except KeyError:
            continue
        released.append(victim)
        # No partition of the size can form yet (cheaper to ask than `find`, which would say None).
        if twin.largest_free(job.machine_type) < job.size:
            continue
        found = twin.find(job.size, machine_type=job.machine_type)
        if found is None:
            continue
        needed = set(found.ipu_ids)
        victims = [r for r in released if needed.intersection(allocator.partition(r.partition).ipu_ids)]
        return victims, found
    return None
