"""The test-host helpers do what the multi-host and fault tests rely on: hosts reach each other,
a cut link and a blocked pair go silent, and closing leaves no namespace or process. About 3 s."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from tests.support import netns
from tests.support.services import unavailable

pytestmark = pytest.mark.netns


def _reaches(host: netns.Host, ip: str, port: int = 7000) -> bool:
    def connect() -> bool:
        try:
            socket.create_connection((ip, port), timeout=0.5).close()
            return True
        except OSError:
            return False

    return host.call(connect)


def _reaches_soon(host: netns.Host, ip: str, within_s: float = 5.0) -> bool:
    """A link that just came back, or a neighbour entry just replaced, may cost a first SYN (its
    retransmission is 1 s away, past one probe's timeout), so a positive check waits a little."""
    deadline = time.monotonic() + within_s
    while not _reaches(host, ip):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_hosts_talk_and_faults_silence_them(tmp_path: object) -> None:
    reason = netns.unavailable_reason()
    if reason is not None:
        unavailable(reason)
    net = netns.Network.create()
    try:
        a, b, c = (net.add_host(r) for r in ("a", "b", "c"))
        assert len({a.ip, b.ip, c.ip}) == 3 and a.ip.startswith(net.subnet + ".")
        listener = a.popen(
            [
                sys.executable,
                "-c",
                f"import socket,time\ns=socket.create_server(('{a.ip}',7000))\ntime.sleep(120)",
            ],
            log=tmp_path / "listener.log",  # type: ignore[operator]
        )
        assert _reaches_soon(b, a.ip, within_s=10) and _reaches_soon(c, a.ip)

        net.cut(a)
        assert not _reaches(b, a.ip) and not _reaches(c, a.ip)
        net.restore(a)
        assert _reaches_soon(b, a.ip) and _reaches_soon(c, a.ip)

        net.block(a, b)
        assert not _reaches(b, a.ip)
        assert _reaches_soon(c, a.ip), "blocking a and b must not silence c"
        net.unblock(a, b)
        assert _reaches_soon(b, a.ip)
    finally:
        net.close()
    assert listener.poll() is not None, "the host's processes die with it"
    assert not [ns for ns in net.namespaces() if (netns.NETNS_DIR / ns).exists()]
