"""Allocator figures: decision time at 65,536 IPUs, and the capacity each placement policy strands.

    .venv/bin/python benchmarks/allocator.py [--ops N] [--pods N] [--seed S] [--trace PATH]

Request sizes come from the Philly trace (``--trace``; by default ``benchmarks/data/philly.csv.gz``).
The stranding replay takes durations from it too. Each job's ``num_gpus`` is rounded up to a power
of two, as IPU users size partitions.

1. Speed. Fill a fleet of ``--pods`` POD64s to 75%, then run ``--ops`` random operations that keep it
   60-90% occupied: allocate a trace-sized partition, or release a random live one. Every allocate is
   preceded by a ``find`` of the same size and every operation by a ``largest_free``; each call is
   timed on its own. ``clone`` is timed on the final state.
2. Stranding. One request sequence is replayed through every policy side by side: Poisson arrivals
   offering ``--load`` times the fleet's capacity, with trace sizes and durations. A request that does
   not fit is refused and dropped. Before each arrival we record the free IPUs stranded for that
   request's size, and their share of all free IPUs (``Allocator.fragmentation``). A refusal counts as
   "refused with room" when enough free, healthy IPUs of the right type existed in total. The first
   quarter of the sequence is warm-up. The mixed run alternates m2000 and bow POD64s and pins 30% of
   requests to bow and 10% to m2000.

   The default policy runs twice: without hints, and told each request's expected end
   (``allocate(..., expected_end=, now=)``). The expected end is what the scheduler would predict:
   the true duration times a log-normal error ``exp(N(0, sigma))``, with sigma the scheduler
   simulator's stated prediction error (``--prediction-error``, default
   ``scheduler.simulator.estimates.DEFAULT_PREDICTION_ERROR`` = 0.3). The baselines ignore hints.
   The speed run times the hinted default too, with expected ends drawn from the trace's durations.
   ``--where`` also reports where the free IPUs sit (in machines partly in use, in lone free
   machines, in runs of free machines) when 4+ IPU requests arrive.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scheduler.simulator.estimates import DEFAULT_PREDICTION_ERROR  # noqa: E402
from scheduler.simulator.trace import open_trace  # noqa: E402
from vipu._bitmaps import FULL_POD, circular_runs, free_machines  # noqa: E402
from vipu.allocator import Allocator, Placement  # noqa: E402
from vipu.placement_policies import available_policies  # noqa: E402
from vipu.topology import (  # noqa: E402
    IPUS_PER_MACHINE,
    IPUS_PER_POD,
    MACHINES_PER_POD,
    Fleet,
    MachineType,
    parse_ipu_id,
)

HINTED = "default, end hint"  # the label of the default policy told each request's expected end


@dataclass(frozen=True)
class Variant:
    label: str
    policy: str
    hinted: bool


def variants(policies: list[str], hints: bool) -> list[Variant]:
    out = [Variant(policy, policy, False) for policy in policies]
    if hints and "default" in policies:
        out.insert(policies.index("default") + 1, Variant(HINTED, "default", True))
    return out


def default_trace() -> Path:
    """The Philly trace the repository carries (benchmarks/data/philly-README.md says what it is)."""
    return REPO / "benchmarks" / "data" / "philly.csv.gz"


def load_jobs(trace: Path) -> list[tuple[int, float]]:
    """``(size, duration_s)`` of every trace job, sizes rounded up to powers of two."""
    with open_trace(trace) as handle:
        return [
            (1 << max(int(row["num_gpus"]) - 1, 0).bit_length(), float(row["duration"]))
            for row in csv.DictReader(handle)
        ]


def percentile(sorted_values: list[float], share: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(share * len(sorted_values)))]


@dataclass
class Timings:
    samples: dict[str, list[float]] = field(default_factory=dict)

    def time(self, operation: str, call: Callable[[], object]) -> object:
        started = time.perf_counter_ns()
        result = call()
        self.samples.setdefault(operation, []).append((time.perf_counter_ns() - started) / 1000)
        return result


def speed_run(
    variant: Variant, pods: int, ops: int, jobs: list[tuple[int, float]], seed: int
) -> tuple[Timings, int, float]:
    """Timings per operation, refusals and mean occupancy of one churn run.

    The churn releases a random live partition rather than the one due, so for the hinted variant
    the clock is the operation count and each expected end is a trace duration (in operations)
    from now: what matters for the timing is how many machines with holes the index holds.
    """
    rng = random.Random(seed)
    allocator = Allocator(Fleet.uniform(pods), variant.policy)
    capacity = pods * IPUS_PER_POD
    timings = Timings()
    live: list[tuple[str, int]] = []
    used = 0
    refused = 0
    clock = 0.0

    def allocate(measured: bool) -> None:
        nonlocal used, refused
        size, duration = rng.choice(jobs)
        name = f"p{rng.getrandbits(64):016x}"
        hint = {"expected_end": clock + duration, "now": clock} if variant.hinted else {}
        if not measured:
            placement = allocator.allocate(name, size, **hint)
        else:
            timings.time("find", lambda: allocator.find(size, **hint))
            placement = timings.time("allocate", lambda: allocator.allocate(name, size, **hint))
        if placement is None:
            refused += measured
        else:
            live.append((name, size))
            used += size

    while used < 0.75 * capacity:
        allocate(measured=False)
    occupancy = 0.0
    for _ in range(ops):
        clock += 1.0
        occupancy += used / capacity
        timings.time("largest_free", allocator.largest_free)
        if used < 0.6 * capacity or (used <= 0.9 * capacity and rng.random() < 0.5):
            allocate(measured=True)
        else:
            index = rng.randrange(len(live))
            live[index], live[-1] = live[-1], live[index]
            name, size = live.pop()
            used -= size
            timings.time("release", lambda name=name: allocator.release(name))
    for _ in range(20):
        timings.time("clone", allocator.clone)
    return timings, refused, occupancy / ops


@dataclass
class Request:
    arrival: float
    size: int
    duration: float
    machine_type: MachineType | None
    expected_end: float  # arrival + duration x the prediction error


@dataclass
class StrandResult:
    policy: str
    measured: int = 0
    stranded: float = 0.0  # summed stranded share over measured requests
    stranded_ipus: float = 0.0  # summed stranded IPUs over measured requests
    stranded_multi: float = 0.0  # the stranded share summed over requests of 2+ IPUs
    multi: int = 0
    refused: int = 0
    refused_with_room: int = 0
    occupancy: float = 0.0
    # With --where: free IPUs by where they sit, summed over the arrivals of 4+ IPU requests.
    where: dict[str, float] = field(default_factory=dict)
    where_samples: int = 0


WHERE = ("free", "in machines partly in use", "lone free machines", "runs of 2+ free machines")


def pod_masks(placement: Placement) -> dict[int, int]:
    masks: dict[int, int] = {}
    for ipu in placement.ipu_ids:
        pod, machine, index = parse_ipu_id(ipu)
        masks[pod] = masks.get(pod, 0) | 1 << (machine * IPUS_PER_MACHINE + index)
    return masks


def where_free_ipus_are(busy: list[int]) -> tuple[int, ...]:
    """Free IPUs in all, in machines partly in use, in lone free machines, in runs of 2+ free machines."""
    free = partial = lone = runs = 0
    for mask in busy:
        pod_free = FULL_POD & ~mask
        machines = free_machines(pod_free)
        free += pod_free.bit_count()
        partial += pod_free.bit_count() - IPUS_PER_MACHINE * machines.bit_count()
        for _, length in circular_runs(machines, MACHINES_PER_POD):
            if length == 1:
                lone += IPUS_PER_MACHINE
            else:
                runs += IPUS_PER_MACHINE * length
    return free, partial, lone, runs


def request_sequence(
    jobs: list[tuple[int, float]],
    pods: int,
    count: int,
    load: float,
    seed: int,
    pinned: dict[MachineType, float],
    prediction_error: float = DEFAULT_PREDICTION_ERROR,
) -> list[Request]:
    """Poisson arrivals whose offered IPU-seconds are ``load`` times the fleet's capacity."""
    rng = random.Random(seed)
    # A stream of its own, so the arrivals, sizes and durations do not depend on the error's sigma.
    errors = random.Random(seed + 1)
    mean_ipu_seconds = sum(size * duration for size, duration in jobs) / len(jobs)
    rate = load * pods * IPUS_PER_POD / mean_ipu_seconds
    clock = 0.0
    sequence = []
    for _ in range(count):
        clock += rng.expovariate(rate)
        size, duration = rng.choice(jobs)
        draw = rng.random()
        machine_type = None
        for kind, share in pinned.items():
            if draw < share:
                machine_type = kind
                break
            draw -= share
        predicted = duration * math.exp(errors.gauss(0.0, prediction_error))
        sequence.append(Request(clock, size, duration, machine_type, clock + predicted))
    return sequence


def strand_run(variant: Variant, fleet: Fleet, requests: list[Request], where: bool = False) -> StrandResult:
    allocator = Allocator(fleet, variant.policy)
    result = StrandResult(variant.label)
    departures: list[tuple[float, str]] = []
    warm_up = len(requests) // 4
    busy = [0] * fleet.pods  # kept from the placements, only for --where
    footprints: dict[str, dict[int, int]] = {}
    for index, request in enumerate(requests):
        while departures and departures[0][0] <= request.arrival:
            name = heapq.heappop(departures)[1]
            allocator.release(name)
            for pod, mask in footprints.pop(name, {}).items():
                busy[pod] &= ~mask
        measured = index >= warm_up
        if measured and where and request.size >= IPUS_PER_MACHINE:
            result.where_samples += 1
            for label, ipus in zip(WHERE, where_free_ipus_are(busy), strict=True):
                result.where[label] = result.where.get(label, 0.0) + ipus
        if measured:
            report = allocator.fragmentation(request.size, request.machine_type)
            result.measured += 1
            result.stranded += report.stranded_share
            result.stranded_ipus += report.stranded_ipus
            if request.size > 1:
                result.multi += 1
                result.stranded_multi += report.stranded_share
            result.occupancy += 1 - allocator.free_ipus() / fleet.ipus
        name = f"j{index}"
        hint = {"expected_end": request.expected_end, "now": request.arrival} if variant.hinted else {}
        placement = allocator.allocate(name, request.size, machine_type=request.machine_type, **hint)
        if placement is None:
            if measured:
                result.refused += 1
                result.refused_with_room += allocator.free_ipus(request.machine_type) >= request.size
        else:
            heapq.heappush(departures, (request.arrival + request.duration, name))
            if where:
                footprints[name] = pod_masks(placement)
                for pod, mask in footprints[name].items():
                    busy[pod] |= mask
    return result


def print_strand_table(title: str, results: list[StrandResult]) -> None:
    print(title)
    print(
        "| policy | avg stranded share | avg stranded share, 2+ IPU requests | avg stranded IPUs | "
        "refused | refused with room | mean occupancy |"
    )
    print("|---|---|---|---|---|---|---|")
    for result in results:
        measured = max(result.measured, 1)
        print(
            f"| {result.policy} | {result.stranded / measured:.4f} | "
            f"{result.stranded_multi / max(result.multi, 1):.4f} | {result.stranded_ipus / measured:.2f} | "
            f"{result.refused / measured:.2%} | {result.refused_with_room / measured:.2%} | "
            f"{result.occupancy / measured:.1%} |"
        )
    by_name = {result.policy: result for result in results}
    baseline = by_name.get("first-fit")
    for label in ("default", HINTED):
        if baseline is None or label not in by_name or not baseline.stranded or not baseline.stranded_ipus:
            continue
        share = by_name[label].stranded / baseline.stranded
        ipus = by_name[label].stranded_ipus / baseline.stranded_ipus
        print(f"{label}: {share:.3f}x first-fit's stranded share, {ipus:.3f}x its stranded IPUs")
    print()
    if any(result.where_samples for result in results):
        print("where the free IPUs are, averaged over the arrivals of 4+ IPU requests")
        print("| policy | " + " | ".join(WHERE) + " |")
        print("|---|" + "---|" * len(WHERE))
        for result in results:
            samples = max(result.where_samples, 1)
            print(
                f"| {result.policy} | "
                + " | ".join(f"{result.where.get(label, 0.0) / samples:.1f}" for label in WHERE)
                + " |"
            )
        print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=100_000, help="measured operations of the speed run")
    parser.add_argument("--pods", type=int, default=1024, help="POD64s of the speed run (1024 = 65,536 IPUs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", type=Path, default=default_trace())
    parser.add_argument(
        "--policy",
        action="append",
        choices=available_policies(),
        help="a policy to run; repeat for several (default: all)",
    )
    parser.add_argument(
        "--frag-pods",
        type=int,
        nargs="*",
        default=[32],
        help="fleet sizes of the stranding replay; give none to skip it",
    )
    parser.add_argument("--frag-requests", type=int, default=80_000, help="requests per stranding replay")
    parser.add_argument("--load", type=float, default=1.0, help="offered load of the stranding replay")
    parser.add_argument("--no-mixed", action="store_true", help="skip the mixed-type stranding replay")
    parser.add_argument(
        "--prediction-error",
        type=float,
        default=DEFAULT_PREDICTION_ERROR,
        help="sigma of the log-normal error of the expected ends given as hints",
    )
    parser.add_argument("--no-hints", action="store_true", help="skip the default policy with end hints")
    parser.add_argument(
        "--where",
        action="store_true",
        help="also report where the free IPUs are (slower: scans the fleet per request)",
    )
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args(argv)
    policies = args.policy or list(available_policies())
    runs = variants(policies, not args.no_hints)
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join([".venv/bin/python", "benchmarks/allocator.py", *given])

    jobs = load_jobs(args.trace)
    print(f"trace: {args.trace} ({len(jobs)} jobs, sizes rounded up to powers of two)")
    print(f"reproduce: {command}\n")

    if not args.skip_speed:
        print(
            f"decision time at {args.pods} POD64s = {args.pods * IPUS_PER_POD} IPUs, {args.ops} "
            "operations, fleet kept 60-90% occupied, microseconds per call (CPython, garbage collector on)"
        )
        print("| policy | operation | calls | p50 | p99 | max |")
        print("|---|---|---|---|---|---|")
        for variant in runs:
            timings, refused, occupancy = speed_run(variant, args.pods, args.ops, jobs, args.seed)
            for operation in ("allocate", "release", "find", "largest_free", "clone"):
                values = sorted(timings.samples.get(operation, [0.0]))
                print(
                    f"| {variant.label} | {operation} | {len(values)} | {percentile(values, 0.5):.1f} | "
                    f"{percentile(values, 0.99):.1f} | {values[-1]:.1f} |"
                )
            print(f"| {variant.label} | (refused {refused}, mean occupancy {occupancy:.1%}) | | | | |")
        print()

    for pods in args.frag_pods:
        scenarios: list[tuple[str, Fleet, dict[MachineType, float]]] = [
            (f"{pods} m2000 POD64s", Fleet.uniform(pods), {})
        ]
        if not args.no_mixed:
            alternating = Fleet([(MachineType.M2000, MachineType.BOW)[pod % 2] for pod in range(pods)])
            scenarios.append(
                (
                    f"{pods} POD64s alternating m2000/bow, 30% of requests pinned to bow and 10% to m2000",
                    alternating,
                    {MachineType.BOW: 0.3, MachineType.M2000: 0.1},
                )
            )
        for label, fleet, pinned in scenarios:
            requests = request_sequence(
                jobs, pods, args.frag_requests, args.load, args.seed, pinned, args.prediction_error
            )
            results = [strand_run(variant, fleet, requests, args.where) for variant in runs]
            print_strand_table(
                f"stranding: {label} = {fleet.ipus} IPUs, {len(requests)} requests at offered load "
                f"{args.load:g} (first quarter is warm-up; hints' prediction error sigma "
                f"{args.prediction_error:g})",
                results,
            )


if __name__ == "__main__":
    main()
