"""One scheduling pass: admission, ordering, start what fits, reserve for the first job that does not,
backfill around it, optionally preempt for it. Pure over a `Snapshot`: the live loop and the
simulator both call `decide` and then make its starts real (database rows, or simulated events).

The pass allocates every start on ``snapshot.allocator``, so the caller's allocator already holds the
new partitions when `decide` returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scheduler.policy.admission import Admission
from scheduler.policy.config import PolicyConfig, get_policy
from scheduler.policy.las import CLASS_SPAN, plan_of, predicted_class
from scheduler.policy.machine_choice import Chooser
from scheduler.policy.model import (
    Decision,
    QueuedJob,
    Reservation,
    Snapshot,
    TenantState,
    Wait,
    _Group,
)
from scheduler.policy.ordering import Order
from scheduler.policy.planners import CountPlanner, Start, TopologyPlanner
from scheduler.policy.preemption import PreemptionCost, choose_victims, guard
from scheduler.policy.running import RunningJob
from scheduler.policy.timetable import expected_end


def partition_name_for(job_id: str) -> str:
    """The partition a job runs in is named after it (names are unique among live partitions)."""
    return "p_" + job_id.split("_", 1)[-1]


def decide(
    snapshot: Snapshot,
    policy: PolicyConfig | str = "default",
    *,
    explain: bool = True,
    name_for: Callable[[str], str] = partition_name_for,
) -> Decision:
    """Decide what starts now. With ``explain`` every queued job that does not start gets a `Wait`;
    without it (the simulator) the pass stops as soon as nothing more can start."""
    return _Pass(snapshot, get_policy(policy) if isinstance(policy, str) else policy, explain, name_for).run()


class _Pass:
    def __init__(
        self, snapshot: Snapshot, config: PolicyConfig, explain: bool, name_for: Callable[[str], str]
    ) -> None:
        self.s = snapshot
        self.config = config
        self.explain = explain
        self.name_for = name_for
        self.decision = Decision()
        # Preemptible work may be preempted for any job that is not, with or without the switch
        # (asked only when the policy does not preempt anyway: a scan of every running job).
        self._preemptible_running: bool | None = None
        self.planner: TopologyPlanner | CountPlanner = (
            TopologyPlanner(
                snapshot.allocator,
                snapshot.running,
                snapshot.now,
                snapshot.timetable,
                hints=config.runtime_hints,
            )
            if config.planner == "topology"
            else CountPlanner(snapshot.allocator, snapshot.running, snapshot.now)
        )
        self.admission = Admission(snapshot.tenants, snapshot.now)
        self.types = tuple(kind.value for kind in snapshot.allocator.fleet.machine_types)
        # Jobs that may run on several machine types are settled on one before they are placed.
        self.chooser = Chooser(
            self.planner,
            snapshot.now,
            config.machine_choice,
            timed=isinstance(self.planner, TopologyPlanner),
            hopeless=self._hopeless,
            room=(
                (lambda kind, size: snapshot.allocator.largest_free(kind) >= size)
                if isinstance(self.planner, TopologyPlanner)
                else None
            ),
            load=self._load_by_type,
        )
        # Smallest size that cannot start now, per machine type (None: any type). Free space only
        # shrinks during a pass, and a partition of 2N always contains one of N, so every larger
        # size of that type cannot start either.
        self.dead: dict[str | None, int] = {}
        # The same for backfilling past the reserved start (placing off the reserved IPUs).
        self.held: dict[str | None, int] = {}
        self.head: QueuedJob | None = None
        self.reservation: Reservation | None = None
        self.busy = {name: list(rp.holders) for name, rp in snapshot.reserved.items()}
        # Without explanations and reserved partitions, the pass may stop once nothing can start.
        self.can_stop = not explain and not snapshot.reserved
        self.stop = False

    # The pass ------------------------------------------------------------------------------------

    def run(self) -> Decision:
        alloc = self.s.allocator
        for job in self.s.arrivals:
            if job.partition is None:
                alloc.observe_request(job.size, machine_type=job.machine_type)
        order = Order(
            self.s.queue,
            self.s.tenants,
            self.config.ordering,
            self._prune if self.can_stop else None,
            now=self.s.now,
            aging_s=self.config.aging_s,
        )
        backfill = self.config.backfill
        admit = self.admission.check if any(_restricts(t) for t in self.s.tenants.values()) else None
        # Preemptible work never goes first in line while non-preemptible work waits: started ahead of
        # it, it would be preempted for it at once (and, requeued ahead of it again, for ever). It is
        # looked at once a non-preemptible job leads (then it backfills), or when none can.
        queue = self.s.queue
        yielding = 0 < getattr(queue, "preemptible", 0) < len(queue)
        deferred: list[QueuedJob] = []
        for job in order:
            refusal = None if admit is None else admit(job)
            if refusal is not None:
                self._wait(job, refusal)
            elif job.partition is not None:
                self._reserved_partition(job, order)
            elif self.head is None and yielding and job.preemptible:
                deferred.append(job)
            else:
                self._place(job, order, backfill)
            if self.stop:
                break
        for job in deferred:
            if self.stop:
                self._wait(job, Wait("behind", "preemptible: waits for non-preemptible work to start first"))
                continue
            self._place(job, order, backfill)
        if self.head is not None and self.explain and self.head.id not in self.decision.waits:
            self._explain_head()
        self.decision.reservation = self.reservation
        return self.decision

    def _place(self, job: QueuedJob, order: Order, backfill: bool) -> None:
        if self.head is None:
            self._first_in_line(self.chooser.settle(job), order)
        elif backfill:
            self._backfill(job, order)
        else:
            self._wait(job, Wait("behind", f"strict order: waits for {self.head.id}", (self.head.id,)))
            self.stop = self.can_stop

    def _first_in_line(self, job: QueuedJob, order: Order) -> None:
        if self.can_stop and self.planner.free(None) == 0:
            self.stop = True  # nothing is free: the first job in line cannot start, nor any other
        elif job.size < self._bound(self.dead, job):
            started = self.planner.start(job, self.name_for(job.id))
            if started.placement is not None:
                self._started(job, started, order)
                return
            self._failed(job, started)
        self.head = job
        stats = self.decision.stats
        stats.head_size = job.size
        stats.head_machine_type = job.machine_type
        stats.head_refused_with_room = self.s.allocator.free_ipus(job.machine_type) >= job.size
        if self.config.preemption or (not job.preemptible and self._any_preemptible_running()):
            self._preempt_for(job)

    def _any_preemptible_running(self) -> bool:
        if self._preemptible_running is None:
            self._preemptible_running = any(r.preemptible for r in self.s.running)
        return self._preemptible_running

    def _backfill(self, job: QueuedJob, order: Order) -> None:
        head = self.head
        assert head is not None
        stats = self.decision.stats
        stats.examined += 1
        if stats.examined > self.config.max_backfill_tests:
            # Like Slurm's bf_max_job_test: a pass looks this deep behind the first job, no deeper.
            if self.explain:
                self._wait(
                    job, Wait("behind", f"not examined this pass: in line behind {head.id}", (head.id,))
                )
            self.stop = self.can_stop
            return
        if job.machine_type is None and job.options:
            if all(self._hopeless(o.machine_type, o.size) for o in job.options):
                # No type has room for it this pass: it waits, whichever type it would have taken.
                if self.explain:
                    self._wait(job, self._no_room(job, head))
                return
            job = self.chooser.settle(job, first=False)
        size = job.size
        if size >= (
            self.dead.get(None, math.inf) if job.machine_type is None else self._bound(self.dead, job)
        ):
            if self.explain:
                self._wait(job, self._no_room(job, head))
            return
        reservation = self.reservation or self._reserve()
        ends_first = not reservation.timed or self.s.now + job.predicted_runtime_s <= reservation.start
        if not ends_first and size >= self._bound(self.held, job):
            if self.explain:
                self._wait(job, self._held_back(job, reservation))
            return
        started = self.planner.backfill(job, self.name_for(job.id), reservation)
        if started.placement is not None:
            stats.backfilled += 1
            self._started(job, started, order)
            return
        self._failed(job, started)
        if started.failure == "held":
            self._wait(job, self._held_back(job, reservation))
        else:
            self._wait(job, self._no_room(job, head))

    # Outcomes -------------------------------------------------------------------------------------

    def _started(self, job: QueuedJob, started: Start, order: Order) -> None:
        assert started.placement is not None
        self.decision.starts.append((job, started.placement))
        self.admission.started(job)
        order.charge(job)
        if self.can_stop and self.planner.free(None) == 0:
            self.stop = True

    def _failed(self, job: QueuedJob, started: Start) -> None:
        kind = job.machine_type
        if started.failure == "held":
            self.held[kind] = min(self.held.get(kind, job.size), job.size)
            self._check_exhausted()
            return
        self.dead[kind] = min(self.dead.get(kind, job.size), job.size)
        if kind is not None and all(t in self.dead for t in self.types):
            # Every type has failed some size: from the largest of those up, nothing starts anywhere.
            bound = max(self.dead[t] for t in self.types)
            self.dead[None] = min(self.dead.get(None, bound), bound)
            if bound == 1:
                self.stop = self.can_stop
        if kind is None and job.size == 1:
            self.stop = self.can_stop  # not one IPU can start: nothing can
        if started.failure == "launch":
            # Counted once per size and pass: later jobs of that size are not sent to V-IPU again.
            self.decision.stats.launch_failures += 1
        self._check_exhausted()

    def _check_exhausted(self) -> None:
        """Stop the pass once no queued job of any priority class could start (see `_prune`)."""
        if self.can_stop and self.head is not None:
            self.stop = all(self._prune(klass) for klass in self.s.queue.classes().values())

    def _wait(self, job: QueuedJob, wait: Wait) -> None:
        if self.explain:
            self.decision.waits[job.id] = wait

    def _reserved_partition(self, job: QueuedJob, order: Order) -> None:
        name = job.partition
        assert name is not None
        partition = self.s.reserved.get(name)
        if partition is None or (partition.tenant_id is not None and partition.tenant_id != job.tenant_id):
            self._wait(job, Wait("partition-missing", f"no reserved partition {name} for this tenant"))
            return
        if not partition.healthy:
            why = f"reserved partition {name} has a machine that is failed or draining"
            self._wait(job, Wait("partition-unhealthy", why))
            return
        holders = self.busy.setdefault(name, [])
        if len(holders) >= partition.gcds:
            why = f"reserved partition {name} runs {', '.join(holders)}"
            self._wait(job, Wait("partition-busy", why, tuple(holders)))
            return
        holders.append(job.id)
        self.decision.starts.append((job, name))
        self.admission.started(job)
        order.charge(job)

    def _preempt_for(self, job: QueuedJob) -> None:
        config, now = self.config, self.s.now
        allowed = None
        if config.preempt_gain is not None:
            job_plan = plan_of(job.priority)
            # A job lifted to the top class by starvation (scheduler.policy.las.starved_after) is owed
            # its turn, not a gain: any job of a lower class may make room for it, however short its
            # run so far or its time left (the bound on preemptions per job stays). With the guards,
            # a wide job starved behind small ones waited as long as they kept coming: some small
            # job in the IPUs it needed was always too new or too near its end to stop, and the next
            # one backfilled there, as it would end before the wide job's reservation.
            starved = job.priority == job_plan * CLASS_SPAN and (
                predicted_class(job.size * job.predicted_runtime_s) < 0
            )
            bound = config.preempt_max
            worth = (
                (lambda victim: bound is None or victim.preemptions < bound)
                if starved
                # The guards are cluster seconds; live, the pass's clock is the wall clock (scaled).
                else guard(
                    job,
                    now,
                    cost=PreemptionCost(warning_s=config.preempt_warning_s).scaled(config.clock_scale),
                    min_run_s=config.preempt_min_run_s / config.clock_scale,
                    max_preemptions=bound,
                    gain=config.preempt_gain,
                )
            )

            def allowed(victim: RunningJob) -> bool:
                # A lower plan's work yields to a higher plan's as before (an admin's ranking); the
                # guards are for preemption by service class within one plan priority.
                # plan_of, inlined: asked of every candidate victim, pass after pass.
                return victim.preemptible or round(victim.priority / CLASS_SPAN) < job_plan or worth(victim)

        chosen = choose_victims(
            job, self.s.running, self.s.allocator, by_priority=config.preemption, now=now, allowed=allowed
        )
        if chosen is None:
            return
        victims, placement = chosen
        self.decision.preempt = victims
        # Hold the IPUs it will get, so nothing backfilled now takes them before the victims stop.
        self.reservation = Reservation(job.id, job.size, self.s.now, frozenset(placement.ipu_ids))
        names = ", ".join(v.id for v in victims)
        self._wait(
            job,
            Wait(
                "preempting",
                f"stopping {'preemptible' if all(v.preemptible for v in victims) else 'lower-priority'} "
                f"{names} to make room for {job.size} IPUs",
                tuple(v.id for v in victims),
                self.s.now,
            ),
        )

    # Questions ---------------------------------------------------------------------------------------

    def _reserve(self) -> Reservation:
        if self.reservation is None:
            assert self.head is not None
            if not self.config.reserve:
                # Work-conserving: nothing is held for the first job in line, so whatever fits starts.
                self.reservation = Reservation(self.head.id, self.head.size, math.inf)
                return self.reservation
            self.reservation = self.planner.reserve(self.head)
            self._check_exhausted()
        return self.reservation

    def _prune(self, group: _Group) -> bool:
        """Whether none of a group's jobs can start in this pass (only asked when the pass need not
        explain the jobs it passes over): each is too big for any free space, or, behind the first
        job in line, each is too big to stay off its reserved IPUs and too long to end before them."""
        dead = self.dead.get(None)
        if not dead and self.reservation is None:
            return False
        smallest = 1 << group.level
        if dead is not None and smallest >= dead:
            return True
        reservation = self.reservation
        if reservation is None or not self.config.backfill:
            return False
        return smallest >= self.held.get(None, math.inf) and (
            self.s.now + group.shortest_runtime() > reservation.start
        )

    def _load_by_type(self) -> dict[str, tuple[float, int]]:
        """Per machine type: IPU-seconds its running jobs are still predicted to run, and its IPUs."""
        alloc = self.s.allocator
        fleet = alloc.fleet
        load = {
            kind.value: [0.0, sum(fleet.layout_of(pod).ipus for pod in fleet.pods_of_type(kind))]
            for kind in fleet.machine_types
        }
        held = alloc.partitions()
        for job in self.s.running:
            placement = held.get(job.partition)
            if placement is not None and not job.reserved:
                left = max(0.0, expected_end(job, self.s.now) - self.s.now)
                load[placement.machine_type.value][0] += job.size * left
        return {kind: (work, int(ipus)) for kind, (work, ipus) in load.items()}

    def _hopeless(self, machine_type: str, size: int) -> bool:
        """Whether this pass already found that ``size`` IPUs of ``machine_type`` cannot start."""
        return size >= min(self.dead.get(None, math.inf), self.dead.get(machine_type, math.inf))

    @staticmethod
    def _bound(limits: dict[str | None, int], job: QueuedJob) -> float:
        """Sizes at or above this cannot start for ``job``'s machine type (an untyped failure bounds
        every type: the untyped request could have used any of them)."""
        untyped = limits.get(None, math.inf)
        if job.machine_type is None:
            return untyped
        return min(untyped, limits.get(job.machine_type, math.inf))

    # Explanations --------------------------------------------------------------------------------------

    def _explain_head(self) -> None:
        head = self.head
        assert head is not None
        reservation = self._reserve()
        free = self.s.allocator.free_ipus(head.machine_type)
        if not reservation.timed:
            self._wait(
                head,
                Wait(
                    "no-room",
                    f"first in line, but no partition of {head.size} IPUs can form even when every "
                    "running job has ended (machines are down or draining)",
                ),
            )
            return
        if free >= head.size:
            detail = (
                f"first in line: {free} IPUs are free but no {head.size} of them form a partition; "
                f"{head.size} IPUs are reserved for it"
            )
        else:
            detail = f"first in line: {head.size} IPUs are reserved for it"
        self._wait(head, Wait("reserved", detail, (), reservation.start))

    def _no_room(self, job: QueuedJob, head: QueuedJob) -> Wait:
        return Wait("no-room", f"no free partition of {job.size} IPUs; in line behind {head.id}", (head.id,))

    def _held_back(self, job: QueuedJob, reservation: Reservation) -> Wait:
        if self.explain and self.head is not None and not self.planner.fits_now(job):
            return self._no_room(job, self.head)
        return Wait(
            "behind",
            f"it would fit now, but would delay {reservation.job_id}, which has {reservation.size} IPUs "
            "reserved",
            (reservation.job_id,),
        )


def _restricts(tenant: TenantState) -> bool:
    """Whether admission can refuse any of this tenant's jobs (else the pass skips asking)."""
    return not (
        tenant.active
        and tenant.expires_at is None
        and tenant.quota_left_ipu_ms is None
        and tenant.max_concurrent_jobs is None
        and tenant.max_queued_jobs is None
        and tenant.max_partition_size is None
    )
