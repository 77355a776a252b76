"""`ipucloud up`, the README's first command, as a user runs it: in a fresh directory, no settings.

It must print where it is and where the key is (the key itself once), run a job to its end, stop
every process it started on Ctrl-C, and carry on with the same state when started again.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx
import pytest
from pytest_httpserver import HTTPServer

from tests.support.cloud import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLI = str(Path(sys.executable).parent / "ipucloud")
JOB = {"name": "first", "workload": {"model": "mcmc", "task": "infer", "steps": 1}, "ipus": 1}
# The README's curl example.
README_JOB = {
    "name": "bert-base-pretrain",
    "workload": {"model": "bert-base", "seq_len": 128, "steps": 200},
    "ipus": 4,
}


class Up:
    """One `ipucloud up` in its own session, as a terminal's foreground job would be."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [CLI, "up"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.seen: list[tuple[str, str]] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, name: str, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put((name, line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for _, line in self.seen):
            left = deadline - time.monotonic()
            ended = not any(reader.is_alive() for reader in self.readers) and self.lines.empty()
            assert left > 0 and not ended, f"no {text!r} from ipucloud up: {self.seen}"
            try:
                self.seen.append(self.lines.get(timeout=min(left, 0.5)))
            except queue.Empty:
                pass

    def drain(self) -> None:
        """After the process ended: everything it wrote, read."""
        for reader in self.readers:
            reader.join(10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())

    def output(self, stream: str) -> list[str]:
        return [line for name, line in self.seen if name == stream]

    def ctrl_c(self, timeout: float) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)


def users_shell(**settings: str) -> dict[str, str]:
    """A user's environment: none of the suite's IPUCLOUD_ settings, only the ones given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPUCLOUD_")}
    env["COLUMNS"] = "1000"  # Rich folds long lines (the key file's path) at the terminal's width
    return env | settings


def processes_of(tmp: Path) -> list[str]:
    """Processes other than this one whose command line or environment names `tmp`."""
    mark = str(tmp).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if mark in cmdline or mark in environ:
            found.append(pid + ": " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_up_in_a_fresh_directory_runs_a_job_stops_cleanly_and_restarts_with_its_state(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    port, vipu_port = free_port(), free_port()
    env = users_shell(
        IPUCLOUD_PORT=str(port), IPUCLOUD_VIPU_API_PORT=str(vipu_port), IPUCLOUD_TIME_SCALE="1000"
    )
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / ".ipucloud"

    first = Up(tmp_path, env)
    try:
        first.wait_for("Press Ctrl-C to stop", timeout=120)
        err = "\n".join(first.output("err"))
        assert "ipucloud is up" in err and url in err, err
        assert f"saved in {data / 'admin.key'}, mode 0600" in err, err
        key = (data / "admin.key").read_text().strip()
        first.wait_for(key, timeout=5)  # stdout and stderr are read apart: either may come first
        assert first.output("out") == [key], "the key is printed once, on standard output"
        assert (data / "admin.key").stat().st_mode & 0o777 == 0o600
        assert data.stat().st_mode & 0o777 == 0o700

        admin = {"Authorization": f"Bearer {key}"}
        made = httpx.post(
            f"{url}/api/v1/admin/tenants", headers=admin, json={"name": "first-user"}, timeout=10
        )
        assert made.status_code == 201, made.text
        tenant = {"Authorization": f"Bearer {made.json()['api_key']}"}
        # `up` runs the notifier and lets webhooks reach this machine: the job's end is delivered.
        httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
        hook = httpx.post(
            f"{url}/api/v1/webhooks",
            headers=tenant,
            json={"url": httpserver.url_for("/hook"), "events": ["job.succeeded"]},
            timeout=10,
        )
        assert hook.status_code == 201, hook.text
        submitted = httpx.post(f"{url}/api/v1/jobs", headers=tenant, json=JOB, timeout=10)
        assert submitted.status_code == 202, submitted.text
        job_url = f"{url}/api/v1/jobs/{submitted.json()['id']}"
        deadline = time.monotonic() + 60
        while (job := httpx.get(job_url, headers=tenant, timeout=10).json())["state"] != "succeeded":
            assert time.monotonic() < deadline and job["state"] in ("queued", "running"), job
            time.sleep(0.2)
        assert job["used_ipu_hours"] > 0
        deadline = time.monotonic() + 30
        while not httpserver.log and time.monotonic() < deadline:
            time.sleep(0.1)
        delivered = httpserver.log[0][0]
        assert delivered.json["type"] == "job.succeeded" and delivered.json["data"]["id"] == job["id"]
        # The demo fleet is the seeds' cloud: two IPU-M2000 POD64s and a Dell DSS 8440 of C2 cards.
        racks = httpx.get(f"{url}/api/v1/admin/fleet/racks", headers=admin, timeout=10).json()["racks"]
        units = [(u["id"], u["machine_type"], u["layout"], u["model"]) for r in racks for u in r["units"]]
        assert units == [
            ("pod0000", "m2000", "pod64", None),
            ("pod0001", "m2000", "pod64", None),
            ("srv0002", "c2", "server", "dss8440"),
        ]
        on_c2 = httpx.post(f"{url}/api/v1/jobs", headers=tenant, json={**JOB, "machine": "c2"}, timeout=10)
        assert on_c2.status_code == 202, on_c2.text
        c2_url = f"{url}/api/v1/jobs/{on_c2.json()['id']}"
        deadline = time.monotonic() + 60
        while (job := httpx.get(c2_url, headers=tenant, timeout=10).json())["state"] != "succeeded":
            assert time.monotonic() < deadline and job["state"] in ("queued", "running"), job
            time.sleep(0.2)
        assert job["machine"] == "c2" and job["partition"]
        assert processes_of(tmp_path), "the children name their data directory"
        # The V-IPU endpoint jobs are pointed at is up too, on the port it said.
        assert f"V-IPU endpoint at 127.0.0.1:{vipu_port}" in err, err
        vipu = httpx.post(
            f"http://127.0.0.1:{vipu_port}/v1/ListPartitions", headers=tenant, json={}, timeout=10
        )
        assert vipu.status_code == 200 and vipu.json() == {"partitions": []}, vipu.text
    finally:
        code = first.ctrl_c(timeout=90)
    assert code == 0
    first.drain()
    assert "ipucloud stopped." in first.output("err")
    assert processes_of(tmp_path) == [], "Ctrl-C leaves no process behind"

    # Again, as the README says to start it: no time scale given, so the demo's.
    again = Up(tmp_path, users_shell(IPUCLOUD_PORT=str(port), IPUCLOUD_VIPU_API_PORT=str(vipu_port)))
    try:
        again.wait_for("Press Ctrl-C to stop", timeout=120)
        err = "\n".join(again.output("err"))
        assert any(f"Admin API key: in {data / 'admin.key'}" in line for line in again.output("err"))
        assert "Time scale: 60 cluster seconds per wall second" in err and "in cluster time" in err, err
        assert (data / "admin.key").read_text().strip() == key
        job = httpx.get(job_url, headers=tenant, timeout=10).json()
        assert job["state"] == "succeeded", "the same directory carries on with the same state"
        # The README's first job (about ten minutes on real IPUs) ends within a minute, and says so.
        first_job = httpx.post(f"{url}/api/v1/jobs", headers=tenant, json=README_JOB, timeout=10).json()
        assert 500 < first_job["predicted_runtime_s"] < 1000, first_job
        started = time.monotonic()
        while (job := httpx.get(f"{url}/api/v1/jobs/{first_job['id']}", headers=tenant, timeout=10).json())[
            "state"
        ] != "succeeded":
            assert time.monotonic() - started < 60 and job["state"] in ("queued", "running"), job
            time.sleep(0.5)
        assert job["progress"]["cluster_s"] > 500, "what users see is cluster time"
    finally:
        assert again.ctrl_c(timeout=90) == 0
    again.drain()
    assert again.output("out") == [], "a key is shown only when it is made"
    assert processes_of(tmp_path) == []


@pytest.mark.parametrize("taken_setting", ["IPUCLOUD_PORT", "IPUCLOUD_VIPU_API_PORT"])
def test_up_says_why_it_cannot_start_and_leaves_nothing_running(tmp_path: Path, taken_setting: str) -> None:
    # The API process serves the V-IPU endpoint too: a taken port of either is the API's to report.
    env = users_shell(IPUCLOUD_PORT=str(free_port()), IPUCLOUD_VIPU_API_PORT=str(free_port()))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env[taken_setting] = str(taken.getsockname()[1])
        up = subprocess.run([CLI, "up"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 1, (up.stdout, up.stderr)
    assert "api exited while starting" in up.stderr and "address already in use" in up.stderr.lower(), (
        up.stderr
    )
    assert processes_of(tmp_path) == []


def test_up_refuses_a_fleet_it_cannot_read(tmp_path: Path) -> None:
    env = users_shell(IPUCLOUD_PORT=str(free_port()), IPUCLOUD_VIPU_API_PORT=str(free_port()))
    done = subprocess.run(
        [CLI, "up", "--fleet", "2xm2000,1xdgx"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "dgx" in done.stderr and "dss8440" in done.stderr
    assert not (tmp_path / ".ipucloud").exists(), "nothing is created for a fleet it cannot read"


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_up_serves_the_vipu_endpoint_from_the_api_process_and_restarts_both_when_it_dies(
    tmp_path: Path,
) -> None:
    port, vipu_port = free_port(), free_port()
    up = Up(tmp_path, users_shell(IPUCLOUD_PORT=str(port), IPUCLOUD_VIPU_API_PORT=str(vipu_port)))
    try:
        up.wait_for("ipucloud is up", 120)
        procs = processes_of(tmp_path)
        assert not [p for p in procs if " vipu-server" in p], procs
        api = [p for p in procs if " -m ipucloud api --with-vipu" in p]
        assert len(api) == 1, procs
        api_pid = int(api[0].split(":")[0])
        api_url, vipu_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{vipu_port}"
        assert ready(api_url) and ready(vipu_url)
        # Each server answers with its own app on its own port.
        assert httpx.get(f"{vipu_url}/", timeout=5).json()["service"] == "ipucloud V-IPU endpoint"
        assert httpx.get(f"{api_url}/openapi.json", timeout=5).json()["info"]["title"] == "ipucloud"

        os.kill(api_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while ready(api_url) or ready(vipu_url):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        while not (ready(api_url) and ready(vipu_url)):
            assert time.monotonic() < deadline, processes_of(tmp_path)
            time.sleep(0.2)
        up.wait_for("api exited", 5)
        assert up.ctrl_c(120) == 0
    finally:
        if up.proc.poll() is None:
            os.killpg(up.proc.pid, signal.SIGKILL)
    up.drain()
    assert processes_of(tmp_path) == []
