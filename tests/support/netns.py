"""Test hosts built from Linux network namespaces on this machine, joined by one virtual switch.

Every host is a namespace with one interface, `eth0`, plugged into a bridge that lives in a switch
namespace of its own, so nothing is added to the machine's own interfaces or routes. Addresses are
a /24 in 10.0.0.0/8 that exists only inside these namespaces. Names carry this process's id and a
random tag, so parallel runs never meet, and `sweep_stale()` removes what a killed run left.

    from tests.support import netns

    reason = netns.unavailable_reason()          # None when namespaces can be made here (root)
    with netns.Network.create() as net:          # switch namespace + bridge + a random /24
        db = net.add_host("db")                  # namespace <prefix>-db, db.ip == "10.a.b.2"
        w1 = net.add_host("w1")
        db.popen(["redis-server", "--bind", db.ip], log=path)   # runs inside db's namespace
        w1.argv("python", "-m", "ipucloud", "worker")           # argv prefix for your own Popen
        w1.call(httpx.get, f"http://{db.ip}:8000/healthz")      # Python code inside w1's namespace
        net.cut(w1)        # pull w1's cable: its link goes dark, connections hang silently
        net.restore(w1)
        net.block(w1, db)  # silently drop traffic between these two hosts only
        net.unblock(w1, db)
    # leaving the block kills every process in every namespace and deletes them all

`Network.close()` does the same and may be called more than once; use it from a fixture finalizer.
Reach the hosts only from inside a namespace (`Host.call`, `Host.popen`): from the test process's
own namespace their addresses are not these hosts but somewhere outside this machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

NETNS_DIR = Path("/run/netns")
NAME_ROOT = "ipucloud-t"
_NAME_RE = re.compile(rf"{NAME_ROOT}(\d+)-[0-9a-f]+-")
_CLONE_NEWNET = 0x40000000
# A MAC no interface has: the bridge floods frames for it and every host drops them, which is a
# silent loss, like a firewall's DROP, without needing netfilter in the kernel.
_NOWHERE_MAC = "02:00:5e:00:de:ad"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {out.stderr.strip()}")
    return out


def unavailable_reason() -> str | None:
    """Why test hosts cannot be built here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{NAME_ROOT}{os.getpid()}-{uuid.uuid4().hex[:6]}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespace_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _delete_namespaces(names: list[str], grace_s: float = 5.0) -> None:
    """TERM every process in these namespaces, KILL what outlives `grace_s`, then delete them."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        live = [pid for ns in names for pid in _namespace_pids(ns)]
        if not live:
            break
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while any(_namespace_pids(ns) for ns in names) and time.monotonic() < deadline:
            time.sleep(0.05)
    for ns in names:
        _ip("netns", "del", ns, check=False)


def sweep_stale() -> list[str]:
    """Delete namespaces (and their processes) left by test runs whose process has died."""
    removed = []
    if not NETNS_DIR.is_dir():
        return removed
    for entry in sorted(NETNS_DIR.iterdir()):
        found = _NAME_RE.match(entry.name)
        if found and not _pid_alive(int(found.group(1))):
            removed.append(entry.name)
    _delete_namespaces(removed, grace_s=1.0)
    return removed


def _enter(ns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class Host:
    """One test host: a namespace with `eth0` at `ip` on the network's switch."""

    network: Network
    role: str
    ns: str
    ip: str
    port: str  # the switch-side end of this host's cable
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _executor: ThreadPoolExecutor | None = None

    def argv(self, *cmd: str) -> list[str]:
        """`cmd` run inside this host's namespace (`ip netns exec` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.ns, *cmd]

    def popen(
        self, cmd: list[str], *, log: Path, env: dict[str, str] | None = None, user: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `cmd` in this namespace in its own session, output to `log`; stopped by `close()`.
        With `user`, it runs as that user (setpriv execs, so the pid is still the command's)."""
        as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"] if user else []
        argv = self.argv(*as_user, *cmd)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        return proc

    def run(self, *cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(self.argv(*cmd), capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} on {self.role} exited {out.returncode}: {out.stderr}")
        return out

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a Python callable in this host's namespace (on a thread that entered it): sockets it
        opens are this host's. Keep one host's clients on that host's `call`."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"netns-{self.role}",
                initializer=_enter,
                initargs=(self.ns,),
            )
        return self._executor.submit(fn, *args, **kwargs).result()

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


@dataclass
class Network:
    """A switch namespace with a bridge, and the hosts plugged into it."""

    prefix: str
    subnet: str  # "10.a.b", hosts get .2, .3, ...
    hosts: dict[str, Host] = field(default_factory=dict)
    closed: bool = False

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    @classmethod
    def create(cls, subnet: str | None = None) -> Network:
        sweep_stale()
        prefix = f"{NAME_ROOT}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # The range exists only inside these namespaces; a random one keeps two runs' logs apart.
        net = cls(prefix=prefix, subnet=subnet or f"10.{random.randint(64, 250)}.{random.randint(0, 255)}")
        try:
            _ip("netns", "add", net.switch)
            _ip("-n", net.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", net.switch, "link", "set", "br0", "up")
        except Exception:
            net.close()
            raise
        return net

    def add_host(self, role: str) -> Host:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,9}", role) or role in self.hosts:
            raise ValueError(f"host role {role!r} must be new, lower-case alphanumeric, at most 10 chars")
        ns = f"{self.prefix}-{role}"
        host = Host(self, role, ns, f"{self.subnet}.{len(self.hosts) + 2}", f"p-{role}")
        self.hosts[role] = host
        _ip("netns", "add", ns)
        _ip("-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", self.switch, "link", "set", host.port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return host

    def cut(self, host: Host) -> None:
        """Take the host's link down at the switch: it loses carrier, and every packet to or from it
        is dropped without an error to anyone (connections hang until their own timeouts)."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def block(self, a: Host, b: Host) -> None:
        """Drop traffic between `a` and `b` silently, both ways; both still reach every other host."""
        for src, dst in ((a, b), (b, a)):
            _ip(
                "-n",
                src.ns,
                "neigh",
                "replace",
                dst.ip,
                "lladdr",
                _NOWHERE_MAC,
                "dev",
                "eth0",
                "nud",
                "permanent",
            )

    def unblock(self, a: Host, b: Host) -> None:
        for src, dst in ((a, b), (b, a)):
            _ip("-n", src.ns, "neigh", "del", dst.ip, "dev", "eth0", check=False)

    def close(self) -> None:
        """Kill every process in every namespace of this network and delete the namespaces."""
        if self.closed:
            return
        self.closed = True
        for host in self.hosts.values():
            host._shutdown()
        _delete_namespaces(self.namespaces())
        for host in self.hosts.values():
            for proc in host.procs:
                # A process that left the namespace's view (or never entered it) still dies here.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)

    def namespaces(self) -> list[str]:
        return [self.switch, *(h.ns for h in self.hosts.values())]

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@contextlib.contextmanager
def network(subnet: str | None = None) -> Iterator[Network]:
    with Network.create(subnet) as net:
        yield net
