"""`gc-info` and `gc-monitor` in Graphcore's formats, from the V-IPU endpoint.

Installed as commands of their own (pyproject's [project.scripts], `gc_info_main`, `gc_monitor_main`)
and as `ipucloud gc-info` and `ipucloud gc-monitor` (ipucloud/cli/gctools.py). Inside an attempt they
show its partition and GCD (`IPUOF_VIPU_API_PARTITION_ID`, `IPUOF_VIPU_API_GCD_ID`, marked `[active]`)
with the attempt's own key; elsewhere every partition the key may see. The endpoint and key are found
as `ipucloud vipu` finds them (ipucloud/vipu_client.py).

Each answers within `--timeout` seconds (2 by default) or fails with a line saying why: nothing
listening at the address, no answer in time, an unknown partition, a key refused.

Formats (docs/cli.md, "gc-info and gc-monitor" has examples):

- `gc-info --list-devices`: `Graphcore device listing:`, a `Partition: <id> (gcd:<n>) [active]` line,
  then `-+- Id: [<id>], target: [Fabric], IPU-M host: [<machine>], IPU#: [<index>]` for each single
  IPU and `-+- Id: [<id>], target: [Multi IPU]` with ` |--- Id: [<ipu id>], DNC Id: [<k>], ...` for
  each multi-IPU group (pairs, fours, ... up to the whole GCD), numbered as vipu/ipuof.py does.
- `gc-monitor`: the `+---+` boxed table of the partition (`|  gc-monitor   |  Partition: ... has N
  IPUs  |`, then one row per IPU: IPU-M, Serial, IPU-M SW, Server version, ICU FW, Type, ID, IPU#,
  Routing), then its attached processes (PID, Command, Time, User, ID, GCD, Job, Progress), or `No
  attached processes in partition <id>`. An emulated IPU has no serial number or firmware: those
  cells say `n/a`; a process's PID is its attempt's id and its Command its job's name.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ipucloud.exit_codes import Exit
from ipucloud.vipu_client import VipuClient, VipuConfigError, VipuError, VipuUnreachable, resolve
from vipu import ipuof
from vipu.machine_types import MachineType

SERVER_VERSION = "0.1.0"
T = TypeVar("T")
DEFAULT_TIMEOUT_S = 2.0


class ToolError(Exception):
    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.code = code


_EXIT = {401: Exit.AUTH, 403: Exit.AUTH, 404: Exit.NOT_FOUND, 409: Exit.CONFLICT, 422: Exit.USAGE}


def fetch(
    tool: str,
    *,
    api_host: str | None,
    api_port: int | None,
    api_access_key: str | None,
    config: Path | None,
    partition: str | None,
    all_partitions: bool,
    timeout: float,
) -> tuple[list[dict[str, Any]], str | None, int | None]:
    """The partitions to show (with their GCDs and processes), the active one and its GCD."""
    env = os.environ
    # The partition the attempt is attached to is the active one; --partition only chooses what to show.
    active = env.get("IPUOF_VIPU_API_PARTITION_ID") or None
    shown = partition or active
    gcd: int | None = None
    if active is not None and env.get("IPUOF_VIPU_API_GCD_ID", "").isdigit():
        gcd = int(env["IPUOF_VIPU_API_GCD_ID"])
    try:
        conn = resolve(api_host=api_host, api_port=api_port, api_access_key=api_access_key, config=config)
    except VipuConfigError as exc:
        raise ToolError(str(exc), Exit.USAGE)

    def ask() -> list[dict[str, Any]]:
        with VipuClient(conn, timeout=timeout) as client:
            if shown is not None and not all_partitions:
                return [client.call("GetPartitionStatus", {"partition_id": shown})["status"]]
            return list(client.call("ListPartitions")["partitions"])

    try:
        parts = within(timeout, ask, f"the V-IPU endpoint at {conn.host}:{conn.port}")
    except VipuUnreachable as exc:
        raise ToolError(str(exc), Exit.UNAVAILABLE)
    except VipuError as exc:
        cause = f", {exc.reason}" if exc.reason else ""
        raise ToolError(f"{exc.detail} ({exc.code}{cause})", _EXIT.get(exc.status, Exit.UNAVAILABLE))
    return parts, active, gcd


def within(seconds: float, work: Callable[[], T], what: str) -> T:
    """`work()`, or VipuUnreachable once `seconds` have passed, whatever it is waiting on.

    httpx's timeout bounds each step (connecting, each read) on its own; an endpoint that trickles its
    answer, or a host that resolves slowly, could pass them one by one and still keep the user waiting.
    The work runs in a daemon thread, so a process that gives up exits at once."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the caller's thread as it is
            box["error"] = exc

    thread = threading.Thread(target=run, name="gc-tool-request", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise VipuUnreachable(f"{what} did not answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _sections(
    parts: Sequence[dict[str, Any]], active: str | None, gcd: int | None
) -> list[tuple[dict[str, Any], int | None, list[str]]]:
    """(partition, GCD or None for a one-GCD partition, the IPUs shown) for each section to print."""
    out: list[tuple[dict[str, Any], int | None, list[str]]] = []
    for p in parts:
        if p["state"] == "PS_PENDING":
            out.append((p, None, []))
            continue
        is_active = p["id"] == active
        for g in p["gcds"]:
            if is_active and gcd is not None and g["gcd_id"] != gcd:
                continue
            out.append(
                (p, g["gcd_id"] if p["num_gcds"] > 1 or (is_active and gcd is not None) else None, g["ipus"])
            )
    return out


def _heading(p: dict[str, Any], gcd: int | None, active: str | None) -> str:
    text = f"Partition: {p['id']}"
    if gcd is not None:
        text += f" (gcd:{gcd})"
    if p["id"] == active:
        text += " [active]"
    return text


def list_devices(parts: Sequence[dict[str, Any]], active: str | None, gcd: int | None) -> str:
    lines = ["Graphcore device listing:"]
    for p, g, ipus in _sections(parts, active, gcd):
        lines.append(_heading(p, g, active))
        if p["state"] == "PS_PENDING":
            lines.append(f"  (no IPUs yet: {p['reason']})")
            continue
        target = p.get("target") or "Fabric"
        host = "IPU-M host" if target == "Fabric" else "host"

        def where(ipu: str) -> str:
            return f"{host}: [{ipuof.machine_of(ipu)}], IPU#: [{ipuof.ipu_index(ipu)}]"  # noqa: B023

        for d in ipuof.devices(len(ipus)):
            if not d.multi:
                lines.append(f"-+- Id: [{d.id}], target: [{target}], {where(ipus[d.ipus[0]])}")
                continue
            lines.append(f"-+- Id: [{d.id}], target: [Multi IPU]")
            lines.extend(f" |--- Id: [{i}], DNC Id: [{k}], {where(ipus[i])}" for k, i in enumerate(d.ipus))
    if len(lines) == 1:
        lines.append(
            "No partitions: this key has no allocation (create one with `ipucloud vipu create partition`)."
        )
    return "\n".join(lines)


def device_info(parts: Sequence[dict[str, Any]], active: str | None, gcd: int | None, device: int) -> str:
    sections = [s for s in _sections(parts, active, gcd) if s[2]]
    if not sections:
        raise ToolError("no partition with IPUs to show", Exit.NOT_FOUND)
    p, _, ipus = sections[0]
    found = next((d for d in ipuof.devices(len(ipus)) if d.id == device), None)
    if found is None:
        raise ToolError(
            f"no device {device} in partition {p['id']}: its ids are 0 .. {2 * len(ipus) - 2}", Exit.NOT_FOUND
        )
    lines = ["Device Info:", f"  id: {device}"]
    if found.multi:
        lines += ["  target: Multi IPU", f"  number of IPUs: {len(found.ipus)}"]
        lines += [f"  ipu {k}: {ipus[i]}" for k, i in enumerate(found.ipus)]
        return "\n".join(lines)
    ipu = ipus[found.ipus[0]]
    attrs = ipuof.ipu_attributes(ipu, p["machine_type"])
    attrs["partition"] = p["id"]
    for g in p["gcds"]:
        if ipu in g["ipus"]:
            attrs["gcd"] = str(g["gcd_id"])
            for proc in g["processes"]:
                attrs["user name"] = proc["user"] or "another tenant"
                attrs["user executable"] = proc["job_name"] or "-"
                attrs["user process id"] = str(proc["pid"])
    lines += [f"  {k}: {v}" for k, v in sorted(attrs.items())]
    return "\n".join(lines)


# gc-monitor's boxes ----------------------------------------------------------------------------------


def _rule(widths: Sequence[int]) -> str:
    return "+" + "+".join("-" * w for w in widths) + "+"


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "|" + "|".join(c.center(w) for c, w in zip(cells, widths, strict=True)) + "|"


def _fit(columns: Sequence[str], rows: Sequence[Sequence[str]], at_least: int) -> list[int]:
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) + 2 if rows else len(c) + 2 for i, c in enumerate(columns)
    ]
    inner = sum(widths) + len(widths) - 1
    if inner < at_least:
        widths[-1] += at_least - inner
    return widths


MONITOR_COLUMNS = ("IPU-M", "Serial", "IPU-M SW", "Server version", "ICU FW", "Type", "ID", "IPU#", "Routing")
PROCESS_COLUMNS = ("PID", "Command", "Time", "User", "ID", "GCD", "Job", "Progress")
_LABEL = "gc-monitor"


def clock(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _progress(proc: dict[str, Any]) -> str:
    p = proc.get("progress")
    if not p:
        return proc["state"]
    if p["phase"] != "run":
        return f"{p['phase']} ({p['percent']:.1f}%)"
    return f"{p['percent']:.1f}% step {p['step']}/{p['steps']}"


def monitor(parts: Sequence[dict[str, Any]], active: str | None, gcd: int | None) -> str:
    out: list[str] = []
    for p, g, ipus in _sections(parts, active, gcd):
        board = ipuof.BOARD_TYPES.get(MachineType(p["machine_type"]), "-") if p.get("machine_type") else "-"
        na = ipuof.NOT_APPLICABLE
        rows = [
            [
                ipuof.machine_of(ipu),
                na,
                na,
                SERVER_VERSION,
                na,
                board,
                str(n),
                str(ipuof.ipu_index(ipu)),
                "DNC",
            ]
            for n, ipu in enumerate(ipus)
        ]
        reconf = " reconfigurable" if p.get("reconfigurable") else ""
        title = f"{_heading(p, g, active)} has {len(ipus) or p['size']}{reconf} IPUs"
        if p["state"] != "PS_ACTIVE":
            title += f" ({p['state']}: {p['reason']})"
        label_w = len(_LABEL) + 5
        widths = _fit(MONITOR_COLUMNS, rows, label_w + 1 + len(title) + 4)
        inner = sum(widths) + len(widths) - 1
        out.append(_rule([label_w, inner - label_w - 1]))
        out.append(_line([_LABEL, title], [label_w, inner - label_w - 1]))
        out.append(_rule(widths))
        out.append(_line(MONITOR_COLUMNS, widths))
        out.append(_rule(widths))
        machine = None
        for r in rows:
            if machine is not None and r[0] != machine:
                out.append(_rule(widths))
            machine = r[0]
            out.append(_line(r, widths))
        if rows:
            out.append(_rule(widths))
        procs = [x for grp in p["gcds"] for x in grp["processes"] if g is None or grp["gcd_id"] == g]
        n = len(ipus)
        whole = ipuof.device_for(n, 0, n) if n else 0
        prow = [
            [str(x["pid"]), x["job_name"] or "-", clock(x["elapsed_s"]), x["user"] or "another tenant",
             str(whole), str(x["gcd"]), x["job_id"] or "-", _progress(x)]
            for x in procs
        ]  # fmt: skip
        caption = (
            f"Attached processes in partition {p['id']}"
            if prow
            else f"No attached processes in partition {p['id']}"
        )
        pw = _fit(PROCESS_COLUMNS, prow, len(caption) + 4)
        pinner = sum(pw) + len(pw) - 1
        out.append(_rule([pinner]))
        out.append(_line([caption], [pinner]))
        out.append(_rule([pinner] if not prow else pw))
        if prow:
            out.append(_line(PROCESS_COLUMNS, pw))
            out.append(_rule(pw))
            out.extend(_line(r, pw) for r in prow)
            out.append(_rule(pw))
    if not out:
        out.append(
            "No partitions: this key has no allocation (create one with `ipucloud vipu create partition`)."
        )
    return "\n".join(out)


# Commands ----------------------------------------------------------------------------------------------


def run(tool: str, render: Any, **kw: Any) -> int:
    """Fetch, render, print; on failure one line on stderr saying why and after how long. Returns the
    exit code."""
    started = time.monotonic()
    try:
        parts, active, gcd = fetch(tool, **kw)
        print(render(parts, active, gcd))
    except ToolError as exc:
        print(f"{tool}: {exc} (after {time.monotonic() - started:.1f} s)", file=sys.stderr)
        return int(exc.code)
    return 0


def gc_info_render(*, list_devices_flag: bool, device_info_flag: bool, device: int, ipu_count: bool) -> Any:
    def render(parts: list[dict[str, Any]], active: str | None, gcd: int | None) -> str:
        if ipu_count:
            return str(sum(len(ipus) for _, _, ipus in _sections(parts, active, gcd)))
        if device_info_flag:
            return device_info(parts, active, gcd, device)
        return list_devices(parts, active, gcd)

    return render


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--partition", help="This partition (default: IPUOF_VIPU_API_PARTITION_ID).")
    ap.add_argument("--all-partitions", action="store_true", help="Every partition the key may see.")
    ap.add_argument("--api-host", help="The V-IPU endpoint's host.")
    ap.add_argument("--api-port", type=int, help="The V-IPU endpoint's port (8090).")
    ap.add_argument("--api-access-key", help="An ipucloud API key or an attempt's key.")
    ap.add_argument("--config", type=Path, help="A vipu-cli.hcl to read the above from.")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="Seconds to wait (default 2).")
    return ap


def _connection(ns: argparse.Namespace) -> dict[str, Any]:
    return {
        "api_host": ns.api_host,
        "api_port": ns.api_port,
        "api_access_key": ns.api_access_key,
        "config": ns.config,
        "partition": ns.partition,
        "all_partitions": ns.all_partitions,
        "timeout": ns.timeout,
    }


# The installed `gc-info` and `gc-monitor` parse their flags with argparse rather than Typer: they must
# answer within 2 s, Python's start-up included, and the CLI's framework alone takes a good part of that
# on a loaded host. `ipucloud gc-info` and `ipucloud gc-monitor` (ipucloud/cli/gctools.py) take the same
# flags through Typer.


def gc_info_main(argv: Sequence[str] | None = None) -> None:
    ap = _parser("gc-info", "Graphcore's gc-info: the devices of your partition (single IPUs, then groups).")
    ap.add_argument("-l", "--list-devices", action="store_true", help="List the devices (the default).")
    ap.add_argument("-i", "--device-info", action="store_true", help="The attributes of the device -d.")
    ap.add_argument("-d", "--device-id", type=int, default=0, help="The device for --device-info.")
    ap.add_argument("--ipu-count", action="store_true", help="How many IPUs there are.")
    ns = ap.parse_args(argv)
    render = gc_info_render(
        list_devices_flag=ns.list_devices,
        device_info_flag=ns.device_info,
        device=ns.device_id,
        ipu_count=ns.ipu_count,
    )
    sys.exit(run("gc-info", render, **_connection(ns)))


def gc_monitor_main(argv: Sequence[str] | None = None) -> None:
    ap = _parser("gc-monitor", "Graphcore's gc-monitor: your partition's IPUs and the processes attached.")
    ns = ap.parse_args(argv)
    sys.exit(run("gc-monitor", monitor, **_connection(ns)))
