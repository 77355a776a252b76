"""`ipucloud up`'s memory at idle: each process it starts, and the total.

Starts `ipucloud up` on the embedded default (SQLite, embedded Redis) in a temporary home and data
directory on free ports, waits until it is ready and has settled (`--settle` seconds), then reads
every process of its tree from /proc: RSS, and PSS from smaps_rollup (RSS counts the pages processes
share, such as the interpreter's, once per process; PSS splits them, so PSS adds up to what the tree
uses). Prints a line per process, the totals, and the command that reproduces it.

    .venv/bin/python benchmarks/idle_memory.py [--settle 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
COMMAND = ".venv/bin/python benchmarks/idle_memory.py"
MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == "Rss":
            rss = int(rest.split()[0]) * 1024
        elif key == "Pss":
            pss = int(rest.split()[0]) * 1024
    return rss, pss


# Extension modules whose presence at idle says a process imported more than it serves with.
HEAVY = ("numpy", "onnx", "pandas", "scipy", "playwright", "google/protobuf", "pydantic_core", "psycopg")


def heavy(pid: int) -> list[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [name for name in HEAVY if f"/{name}/" in maps or f"/{name}." in maps]


def describe(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [a.decode(errors="replace") for a in argv if a]
    if "-m" in words and "ipucloud" in words:
        return "ipucloud " + " ".join(words[words.index("ipucloud") + 1 :])
    if words and "redis-server" in words[0]:
        return "redis-server (embedded)"
    return " ".join(Path(w).name if i == 0 else w for i, w in enumerate(words))[:60]


def measure(settle: float, timeout: float = 120.0) -> list[tuple[int, str, int, int, list[str]]]:
    home = Path(tempfile.mkdtemp(prefix="ipucloud-mem-"))
    port, vipu = free_port(), free_port()
    env = {
        **os.environ,
        "HOME": str(home),
        "IPUCLOUD_DATA_DIR": str(home / "data"),
        "PYTHONUNBUFFERED": "1",
    }
    for key in ("IPUCLOUD_DATABASE_URL", "IPUCLOUD_REDIS_URL", "IPUCLOUD_MODE"):
        env.pop(key, None)
    log = open(home / "up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipucloud", "up", "--port", str(port), "--vipu-port", str(vipu)],
        cwd=home,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ipucloud up exited: {(home / 'up.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("ipucloud up was not ready in time")
            time.sleep(0.5)
        time.sleep(settle)
        rows = []
        for pid in tree(proc.pid):
            try:
                rss, pss = memory(pid)
                rows.append((pid, describe(pid), rss, pss, heavy(pid)))
            except OSError:
                pass
        return rows
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settle", type=float, default=10.0, help="seconds idle after ready before reading")
    args = parser.parse_args()
    load = os.getloadavg()
    rows = measure(args.settle)
    print(f"# ipucloud up at idle, {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {load[0]:.2f}")
    print(f"{'pid':>7}  {'RSS MiB':>8}  {'PSS MiB':>8}  process")
    for pid, name, rss, pss, libs in rows:
        loaded = f"  (loads {', '.join(libs)})" if libs else ""
        print(f"{pid:>7}  {rss / MIB:8.1f}  {pss / MIB:8.1f}  {name}{loaded}")
    print(
        f"{'total':>7}  {sum(r[2] for r in rows) / MIB:8.1f}  {sum(r[3] for r in rows) / MIB:8.1f}"
        f"  {len(rows)} processes"
    )
    print(f"# reproduce: {COMMAND} --settle {args.settle:g}")


if __name__ == "__main__":
    main()
