"""Where the test suite's time goes: each test's setup, call and teardown, summed by file.

Record while the suite (or a part of it) runs, as bin/test runs it, then summarise:

    IPUCLOUD_SUITE_TIMES=/tmp/times.tsv .venv/bin/pytest -p benchmarks.suite_times -p no:cacheprovider \\
        -n 3 --dist loadgroup --no-loadscope-reorder -m "not needs_services and not serial"
    .venv/bin/python benchmarks/suite_times.py /tmp/times.tsv [--top N]

As a pytest plugin (`-p benchmarks.suite_times`) it appends one line per phase of each test to the
file `IPUCLOUD_SUITE_TIMES` names, as each ends: a run cut short still leaves what it measured. Under
pytest-xdist only the controller writes (with the worker's name). As a script it prints the files
by their summed time, the slowest single phases, and each worker's busy time and span. The machine
is shared: compare figures measured back to back, with the load average (`uptime`) beside them.

`--write-durations tests/durations.json` also writes each test's seconds (setup, call and teardown
summed) for the tests that took a second or more: tests/conftest.py queues the work longest first by
that file, so refresh it from a whole pass-1 run when tests are added or get much slower or faster.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

MIN_RECORDED_S = 1.0


def pytest_runtest_logreport(report: Any) -> None:
    path = os.environ.get("IPUCLOUD_SUITE_TIMES")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "-"
    with open(path, "a") as out:
        out.write(
            f"{time.time():.1f}\t{report.when}\t{report.duration:.2f}\t{report.outcome}\t{worker}\t{report.nodeid}\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("times", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--write-durations", type=Path, metavar="JSON")
    args = parser.parse_args()
    rows = [line.split("\t") for line in args.times.read_text().splitlines() if line.count("\t") == 5]
    by_file: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    busy: dict[str, float] = defaultdict(float)
    span: dict[str, list[float]] = defaultdict(list)
    for at, _when, secs, _outcome, worker, nodeid in rows:
        name = nodeid.split("::", 1)[0]
        by_file[name] += float(secs)
        tests[name].add(nodeid)
        busy[worker] += float(secs)
        span[worker].append(float(at))
    print(f"{'seconds':>8} {'tests':>5}  file")
    for name, secs in sorted(by_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{secs:8.1f} {len(tests[name]):5d}  {name}")
    print(f"\n{'seconds':>8} phase     test")
    for _at, when, secs, outcome, _worker, nodeid in sorted(rows, key=lambda r: -float(r[2]))[: args.top]:
        print(f"{float(secs):8.1f} {when:9} {nodeid}{'' if outcome == 'passed' else '  (' + outcome + ')'}")
    print(f"\n{'busy s':>8} {'span s':>8}  worker")
    for worker in sorted(busy):
        print(f"{busy[worker]:8.1f} {max(span[worker]) - min(span[worker]):8.1f}  {worker}")
    print(f"\nsum of all phases: {sum(by_file.values()):.0f} s over {len({r[5] for r in rows})} tests")
    if args.write_durations:
        per_test: dict[str, float] = defaultdict(float)
        for _at, _when, secs, _outcome, _worker, nodeid in rows:
            # Without the `@group` xdist's loadgroup adds to a grouped test's id: conftest reads them before.
            if nodeid.rfind("@") > nodeid.rfind("]"):
                nodeid = nodeid[: nodeid.rfind("@")]
            per_test[nodeid] += float(secs)
        # Only what is worth ordering: conftest estimates the rest from their marks (below a second).
        kept = {n: round(s, 1) for n, s in sorted(per_test.items()) if s >= MIN_RECORDED_S}
        args.write_durations.write_text(json.dumps(kept, indent=1) + "\n")
        print(f"\n{len(kept)} tests of {MIN_RECORDED_S:.0f} s or more written to {args.write_durations}")
    print(
        f"reproduce: .venv/bin/python benchmarks/suite_times.py {args.times}"
        "  (recorded as the docstring of benchmarks/suite_times.py says)"
    )


if __name__ == "__main__":
    main()
