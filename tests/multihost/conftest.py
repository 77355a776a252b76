"""A cloud spread over four test hosts (network namespaces on this machine):

    db   PostgreSQL 15 (our own initdb'd instance) and redis-server, on the host's address
    ctl  `ipucloud migrate`, `ipucloud bootstrap`, `ipucloud api`, `ipucloud scheduler`
    w1   `ipucloud worker --queues pod0000,ipucloud`  (the worker beside POD64 0)
    w2   `ipucloud worker --queues pod0001,ipucloud`  (the worker beside POD64 1)

Every component is the real command, configured by environment only, reaching the others over
the virtual network. The test process watches through Unix sockets (PostgreSQL's and Redis's sockets
are files, which namespaces do not hide) and talks HTTP to the API from inside `ctl`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine

from tests.support import netns
from tests.support.cloud import FAST
from tests.support.services import unavailable

PG_BIN = Path("/usr/lib/postgresql/15/bin")

# The run's pace: jobs last seconds of wall time, and a dead host's work is noticed in seconds.
MULTIHOST_ENV = {
    **FAST,
    "IPUCLOUD_TIME_SCALE": "100",
    "IPUCLOUD_LEASE_S": "4",
    "IPUCLOUD_ROUTING_TTL_S": "3",
    "IPUCLOUD_RATE_LIMIT": "100000/minute",
    "IPUCLOUD_LOG_LEVEL": "INFO",
}


def _wait(what: str, check: Callable[[], bool], timeout: float, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except AssertionError:
            raise
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s\n{logs()}")


@dataclass
class MultiHostCloud:
    net: netns.Network
    workdir: Path
    pg_dir: Path
    env: dict[str, str]
    admin_key: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _engine: Engine | None = None

    @property
    def db_host(self) -> netns.Host:
        return self.net.hosts["db"]

    @property
    def ctl(self) -> netns.Host:
        return self.net.hosts["ctl"]

    @property
    def api_url(self) -> str:
        return f"http://{self.ctl.ip}:8000"

    @property
    def redis_socket(self) -> Path:
        return self.pg_dir / "redis.sock"

    def engine(self) -> Engine:
        """The test's own view of the database, over PostgreSQL's Unix socket."""
        if self._engine is None:
            self._engine = create_engine(
                f"postgresql+psycopg://postgres@/ipucloud?host={self.pg_dir}", pool_size=2
            )
        return self._engine

    def redis(self) -> Any:
        import redis

        return redis.Redis(unix_socket_path=str(self.redis_socket), socket_timeout=5)

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def logs(self, lines: int = 40) -> str:
        out = []
        for name in sorted(self.procs):
            text = self.log(name).read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(out)

    def ipucloud(self, host: netns.Host, name: str, *args: str) -> subprocess.Popen[bytes]:
        proc = host.popen(
            [sys.executable, "-m", "ipucloud", *args], log=self.log(name), env={**os.environ, **self.env}
        )
        self.procs[name] = proc
        return proc

    def run_ipucloud(self, host: netns.Host, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(
            host.argv(sys.executable, "-m", "ipucloud", *args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, f"ipucloud {' '.join(args)} exited {out.returncode}:\n{out.stderr}"
        return out.stdout + out.stderr

    def request(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> httpx.Response:
        """An HTTP request to the API, sent from inside the ctl host."""
        headers = {"Authorization": f"Bearer {key or self.admin_key}"}
        return self.ctl.call(
            httpx.request, method, f"{self.api_url}{path}", headers=headers, timeout=30, **kwargs
        )

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 60) -> None:
        def alive_and(check: Callable[[], bool]) -> bool:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise AssertionError(f"{', '.join(dead)} exited while waiting for {what}\n{self.logs()}")
            return check()

        _wait(what, lambda: alive_and(check), timeout, self.logs)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        components = [p for n, p in self.procs.items() if n not in ("postgres", "redis")]
        for proc in components:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in components:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        # Fast shutdown: smart shutdown (SIGTERM) would wait for clients that may be cut off.
        pg = self.procs.get("postgres")
        if pg is not None and pg.poll() is None:
            pg.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                pg.wait(10)


def _start_services(cloud: MultiHostCloud) -> None:
    db = cloud.db_host
    pg = pwd.getpwnam("postgres")
    os.chown(cloud.pg_dir, pg.pw_uid, pg.pw_gid)
    data = cloud.pg_dir / "data"
    init = subprocess.run(
        ["runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust",
         "-U", "postgres", "-E", "UTF8", "--no-sync"],
        capture_output=True, text=True, timeout=120, cwd=cloud.pg_dir,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    with open(data / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {cloud.net.subnet}.0/24 trust\n")
    settings = {
        "listen_addresses": db.ip,
        "port": "5432",
        "unix_socket_directories": str(cloud.pg_dir),
        "max_connections": "200",
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        # A client cut off mid-transaction holds its row locks (the tenant's, the attempt's) until
        # the server gives up on it: without this, for TCP's two hours. Healthy workers' heartbeats
        # wait on those locks, so it must be well under the lease (deploy/README.md explains).
        "idle_in_transaction_session_timeout": "1s",
        "tcp_keepalives_idle": "5",
        "tcp_keepalives_interval": "2",
        "tcp_keepalives_count": "3",
    }
    args = [a for k, v in settings.items() for a in ("-c", f"{k}={v}")]
    cloud.procs["postgres"] = db.popen(
        [str(PG_BIN / "postgres"), "-D", str(data), *args], log=cloud.log("postgres"), user="postgres"
    )
    cloud.procs["redis"] = db.popen(
        ["redis-server", "--bind", db.ip, "--port", "6379", "--unixsocket", str(cloud.redis_socket),
         "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", str(cloud.pg_dir),
         "--maxmemory-policy", "noeviction", "--tcp-keepalive", "5", "--protected-mode", "no"],
        log=cloud.log("redis"),
    )  # fmt: skip
    cloud.wait(
        "PostgreSQL accepting connections",
        lambda: (
            subprocess.run(
                [str(PG_BIN / "pg_isready"), "-q", "-U", "postgres", "-h", str(cloud.pg_dir)], check=False
            ).returncode
            == 0
        ),
        timeout=30,
    )
    made = subprocess.run(
        [str(PG_BIN / "createdb"), "-h", str(cloud.pg_dir), "-U", "postgres", "ipucloud"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    cloud.wait("Redis answering", lambda: bool(cloud.redis().ping()), timeout=30)


@pytest.fixture
def multihost(tmp_path: Path) -> Iterator[MultiHostCloud]:
    reason = netns.unavailable_reason()
    if reason is not None:
        unavailable(f"multi-host test: {reason}")
    for tool in ("redis-server", "runuser"):
        if shutil.which(tool) is None:
            unavailable(f"multi-host test: {tool} is not installed")
    if not (PG_BIN / "initdb").exists():
        unavailable(f"multi-host test: PostgreSQL 15 is not installed in {PG_BIN}")
    net = netns.Network.create()
    # The data directory must be reachable by the postgres user, which pytest's 0700 tmp is not.
    pg_dir = Path(tempfile.mkdtemp(prefix=f"{net.prefix}-"))
    cloud = MultiHostCloud(net=net, workdir=tmp_path, pg_dir=pg_dir, env={})
    try:
        for role in ("db", "ctl", "w1", "w2"):
            net.add_host(role)
        db = net.hosts["db"]
        cloud.env = {
            **MULTIHOST_ENV,
            "IPUCLOUD_MODE": "production",
            "IPUCLOUD_DATABASE_URL": f"postgresql://postgres@{db.ip}:5432/ipucloud",
            "IPUCLOUD_REDIS_URL": f"redis://{db.ip}:6379/0",
            "IPUCLOUD_SECRET_KEY": secrets.token_urlsafe(32),
            "IPUCLOUD_DATA_DIR": str(tmp_path / "data"),
            # Not /dev/shm (the shipped default): a killed worker's attempt files go with the test's tmp.
            "IPUCLOUD_RUNTIME_DIR": str(tmp_path / "run"),
        }
        _start_services(cloud)
        yield cloud
    finally:
        cloud.close()
        net.close()
        shutil.rmtree(pg_dir, ignore_errors=True)
        left = [ns for ns in net.namespaces() if (netns.NETNS_DIR / ns).exists()]
        assert not left, f"namespaces left behind: {left}"
