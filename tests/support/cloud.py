"""A cloud in real processes for end-to-end and fault tests: API, scheduler replicas, workers.

Each component is `python -m ipucloud <component>` in its own process group, configured only by
environment, exactly as in production. Tests talk to it over HTTP.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

FAST = {
    "IPUCLOUD_TIME_SCALE": "2000",
    "IPUCLOUD_HEARTBEAT_S": "0.2",
    "IPUCLOUD_LEASE_S": "3",
    "IPUCLOUD_SCHEDULER_TICK_S": "0.2",
    "IPUCLOUD_LEADER_LEASE_S": "2",
    "IPUCLOUD_OUTBOX_RETRY_S": "3",
    "IPUCLOUD_WORKER_GRACE_S": "2",
    "IPUCLOUD_METER_INTERVAL_S": "0.5",
    "IPUCLOUD_AGENT_SYNC_S": "1",
    "IPUCLOUD_STARTUP_WAIT_S": "20",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int, group: bool = True) -> None:
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def children(self) -> list[int]:
        """PIDs of the process's direct children (e.g. Celery's pool processes)."""
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self, timeout: float = 15, *, term: bool = True) -> None:
        """SIGTERM (unless `term` is False: already sent), wait up to `timeout`, then SIGKILL."""
        if self.popen is None:
            return
        if self.alive():
            if term:
                self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.signal(signal.SIGKILL)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


@dataclass
class RunningCloud:
    env: dict[str, str]
    workdir: Path
    admin_key: str
    port: int
    procs: dict[str, Proc] = field(default_factory=dict)
    database: Any = None  # the cloud's database, when a fixture shares the cloud (`shared_cloud`)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # Processes ---------------------------------------------------------------------------------------

    def spawn(
        self,
        name: str,
        *args: str,
        component: str | None = None,
        extra_env: dict[str, str] | None = None,
        argv_prefix: list[str] | None = None,
    ) -> Proc:
        env = {**os.environ, **self.env, **(extra_env or {})}
        argv = [*(argv_prefix or []), sys.executable, "-m", "ipucloud", component or name, *args]
        proc = Proc(name, argv, env, self.workdir / f"{name}.log").start()
        self.procs[name] = proc
        return proc

    def start_api(self) -> Proc:
        return self.spawn("api", "--port", str(self.port), "--host", "127.0.0.1")

    def start_scheduler(self, name: str = "scheduler") -> Proc:
        return self.spawn(name, component="scheduler")

    def start_worker(
        self,
        name: str = "worker",
        concurrency: int = 16,
        extra_env: dict[str, str] | None = None,
        argv_prefix: list[str] | None = None,
    ) -> Proc:
        return self.spawn(
            name,
            "--concurrency",
            str(concurrency),
            "--hostname",
            f"{name}@%h",
            component="worker",
            extra_env=extra_env,
            argv_prefix=argv_prefix,
        )

    def stop_all(self) -> None:
        """SIGTERM every process at once, then wait for each: their graceful shutdowns overlap."""
        order = [self.procs[n] for n in ("api", *[n for n in self.procs if n != "api"]) if n in self.procs]
        for proc in order:
            if proc.alive():
                proc.signal(signal.SIGTERM)
        for proc in order:
            proc.stop(term=False)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            for p in self.procs.values():
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited during start-up:\n{p.tail()}")
            time.sleep(0.1)
        raise RuntimeError(
            "the cloud did not become ready:\n" + "\n".join(p.tail() for p in self.procs.values())
        )

    @classmethod
    @contextmanager
    def start(
        cls,
        env: dict[str, str],
        workdir: Path,
        *,
        admin_key: str,
        workers: int = 1,
        extra_env: dict[str, str] | None = None,
    ) -> Iterator[RunningCloud]:
        cloud = cls(
            env={**env, **FAST, **(extra_env or {})}, workdir=workdir, admin_key=admin_key, port=free_port()
        )
        try:
            cloud.start_scheduler()
            for i in range(workers):
                cloud.start_worker(f"worker{i + 1}" if workers > 1 else "worker")
            cloud.start_api()
            cloud.wait_ready()
            yield cloud
        finally:
            cloud.stop_all()

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{p.tail(60)}" for n, p in self.procs.items())

    # HTTP --------------------------------------------------------------------------------------------

    def http(self, key: str | None = None, timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def admin(self) -> httpx.Client:
        return self.http(self.admin_key)

    def create_tenant(
        self, name: str, quota_ipu_hours: float = 1000, plan: str = "standard"
    ) -> tuple[str, str]:
        with self.admin() as c:
            r = c.post(
                "/api/v1/admin/tenants", json={"name": name, "plan": plan, "quota_ipu_hours": quota_ipu_hours}
            )
            r.raise_for_status()
            body = r.json()
            return body["id"], body["api_key"]

    def wait_jobs(
        self,
        key: str,
        ids: list[str],
        timeout: float = 120,
        states: tuple[str, ...] = ("succeeded", "failed", "cancelled"),
    ) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        last: dict[str, dict[str, Any]] = {}
        with self.http(key) as c:
            pending = set(ids)
            while pending and time.monotonic() < deadline:
                for jid in list(pending):
                    r = c.get(f"/api/v1/jobs/{jid}")
                    r.raise_for_status()
                    last[jid] = r.json()
                    if last[jid]["state"] in states:
                        pending.discard(jid)
                if pending:
                    time.sleep(0.2)
        if pending:
            raise AssertionError(
                f"{len(pending)} jobs did not reach {states} in {timeout} s: "
                + ", ".join(f"{j}={last.get(j, {}).get('state')}" for j in sorted(pending))
                + "\n"
                + self.logs()
            )
        return last


@contextmanager
def start_shared(
    database_url: str,
    redis_url: str,
    secret_key: str,
    tmp_path_factory: Any,
    extra_env: dict[str, str] | None = None,
    pods: int = 2,
) -> Iterator[RunningCloud]:
    """The cloud of tests/conftest.py's `shared_cloud`, with `extra_env` (e.g. a time scale) added to its
    processes' settings and a fleet of `pods` POD64s: the body of a class-scoped fixture
    (`tmp_path_factory` is pytest's). The test process's runtime is installed for as long as the cloud
    runs, for `database` (the cloud's, for reading)."""
    import pytest

    from scheduler import runtime as runtime_module
    from scheduler.settings import Settings
    from tests.support import services

    workdir = tmp_path_factory.mktemp("cloud")
    values = {
        "IPUCLOUD_MODE": "production",
        "IPUCLOUD_DATABASE_URL": database_url,
        "IPUCLOUD_REDIS_URL": redis_url,
        "IPUCLOUD_SECRET_KEY": secret_key,
        "IPUCLOUD_DATA_DIR": str(workdir / "data"),
        # Not /dev/shm (the shipped default): what a test leaves goes with its temporary directory.
        "IPUCLOUD_RUNTIME_DIR": str(workdir / "run"),
        "IPUCLOUD_RATE_LIMIT": "100000/minute",
        "IPUCLOUD_LOG_LEVEL": "WARNING",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in values.items():
            mp.setenv(k, v)
        services.reset_caches()
        rt = runtime_module.Runtime.from_settings(Settings(), idle_tx_timeout_s=60.0)
        runtime_module.install(rt)
        try:
            services.truncate_all(rt.db)
            seeded = services.seed(rt.db, pods=pods)
            with RunningCloud.start(
                values, workdir, admin_key=seeded.admin_key, extra_env=extra_env
            ) as running:
                running.database = rt.db
                yield running
        finally:
            runtime_module.close_current()
            rt.close()
            services.reset_caches()
