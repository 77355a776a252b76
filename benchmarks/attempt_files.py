"""What an attempt's files cost its host agent: written when it is taken, removed when it ends.

The agent writes each attempt's IPUoF configuration and `vipu-cli.hcl` (workers/ipuof.py) on its one
loop thread, between taking a batch of attempts and starting them, so their cost adds to every short
job's. This times `write_attempt_files` and `remove_attempt_files` as the agent calls them, per
attempt, in the runtime directory the agent uses by default (`/dev/shm` where the host has it) and in
a directory on the disk of this checkout (where the files went before, under the data directory).
Wall and CPU microseconds per attempt, median of `--reps` rounds of `--attempts` attempts each.

    .venv/bin/python benchmarks/attempt_files.py [--attempts 500] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.settings import Settings  # noqa: E402
from workers import ipuof  # noqa: E402


def _round(settings: Settings, attempts: int, first: int) -> tuple[float, float, float, float]:
    """(write wall, write CPU, remove wall, remove CPU) in microseconds per attempt."""
    ids = range(first, first + attempts)
    w0, c0 = time.perf_counter(), time.process_time()
    for i in ids:
        ipuof.write_attempt_files(
            settings,
            attempt_id=i,
            epoch=1,
            tenant_id="bench",
            partition=f"p{i}",
            gcd_ipus=["pod0000-m00-i0"],
            gcds=1,
            gcd=0,
            machine_type="m2000",
        )
    w1, c1 = time.perf_counter(), time.process_time()
    for i in ids:
        ipuof.remove_attempt_files(settings, i)
    w2, c2 = time.perf_counter(), time.process_time()
    per = 1e6 / attempts
    return (w1 - w0) * per, (c1 - c0) * per, (w2 - w1) * per, (c2 - c1) * per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=500)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=ROOT, prefix=".bench-attempt-files-") as tmp:
        data_dir = Path(tmp)
        ways = {
            "runtime dir (default)": Settings(data_dir=data_dir, secret_key="bench-" + "x" * 40),
            "data dir on disk": Settings(
                data_dir=data_dir, runtime_dir=data_dir / "attempts", secret_key="bench-" + "x" * 40
            ),
        }
        where = {name: ipuof.runtime_root(s) for name, s in ways.items()}
        rounds: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in ways}
        for rep in range(args.reps):  # the ways alternate, so a change in the machine's load hits both
            for name, settings in ways.items():
                rounds[name].append(_round(settings, args.attempts, rep * args.attempts))
        for settings in ways.values():
            ipuof.release_runtime_root(settings)
    print(f"# attempt files, {args.attempts} attempts x {args.reps} rounds, median microseconds per attempt")
    print(
        "# reproduce: .venv/bin/python benchmarks/attempt_files.py"
        f" --attempts {args.attempts} --reps {args.reps}"
    )
    for name, rs in rounds.items():
        med = [statistics.median(r[k] for r in rs) for k in range(4)]
        print(
            f"{name:22s} write {med[0]:7.0f} wall {med[1]:7.0f} CPU"
            f"   remove {med[2]:6.0f} wall {med[3]:6.0f} CPU   ({where[name]})"
        )


if __name__ == "__main__":
    main()
