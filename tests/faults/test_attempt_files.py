"""Where a host agent keeps each attempt's files (workers/ipuof.py): in memory by default, private to
this user and data directory, never through a directory or link someone else planted, and gone with
the attempt."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scheduler.models import JobEvent
from scheduler.settings import Settings, get_settings, reset_settings_cache
from tests.faults.checker import check_cloud
from tests.faults.harness import leader_loop, place, submit
from tests.faults.test_agent import FakeClock, make_agent, run_for, take
from tests.faults.test_agent import tenant as tenant  # the fixture
from workers import ipuof

SECRET = "attempt-files-test-" + "x" * 32


@pytest.fixture(autouse=True)
def fresh_roots() -> Iterator[None]:
    ipuof._runtime_root.cache_clear()
    yield
    ipuof._runtime_root.cache_clear()


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm: world-writable and sticky, as the real one is."""
    d = tmp_path / "shm"
    d.mkdir()
    os.chmod(d, 0o1777)
    monkeypatch.setattr(ipuof, "SHM", d)
    return d


def write(settings: Settings, attempt_id: int) -> Path:
    return ipuof.write_attempt_files(
        settings,
        attempt_id=attempt_id,
        epoch=1,
        tenant_id="t",
        partition="p",
        gcd_ipus=["pod0000-m00-i0"],
        gcds=1,
        gcd=0,
        machine_type="m2000",
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_attempts_files_are_in_the_runtime_dir_while_it_runs_and_gone_after(
    db: Any, tenant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "runtime"
    monkeypatch.setenv("IPUCLOUD_RUNTIME_DIR", str(runtime))
    reset_settings_cache()
    job_id = submit(db, tenant, steps=20)
    attempt = place(db, leader_loop(db), job_id)
    clock = FakeClock()
    agent = make_agent(db, clock)
    take(agent, [attempt.id])
    directory = runtime / str(attempt.id)
    assert mode(runtime) == 0o700 and mode(directory) == 0o700
    assert {p.name: mode(p) for p in directory.iterdir()} == {"ipuof.conf": 0o600, "vipu-cli.hcl": 0o600}
    assert not (get_settings().data_dir / "attempts").exists(), "nothing on the data directory's disk"
    run_for(agent, clock, 1.0)
    with db.read() as s:
        env = s.execute(
            select(JobEvent.data).where(JobEvent.message.like("attached to partition%"))
        ).scalar_one()["env"]
    assert env["IPUOF_CONFIG_PATH"] == str(directory / "ipuof.conf")
    run_for(agent, clock, 60)
    assert check_cloud(db, [job_id]).states == {"succeeded": 1}
    assert not directory.exists(), "the directory (and the key in it) goes when the attempt ends"
    ipuof.release_runtime_root(get_settings())
    assert runtime.is_dir() and not any(runtime.iterdir()), "a configured directory is the operator's"


def test_by_default_each_data_dir_has_its_own_private_root_in_memory(tmp_path: Path, shm: Path) -> None:
    a = Settings(data_dir=tmp_path / "a", secret_key=SECRET)
    b = Settings(data_dir=tmp_path / "b", secret_key=SECRET)
    root_a, root_b = ipuof.runtime_root(a), ipuof.runtime_root(b)
    assert root_a.parent == shm and root_b.parent == shm and root_a != root_b
    assert root_a.name.startswith(f"ipucloud-{os.geteuid()}-")
    assert ipuof.runtime_root(Settings(data_dir=tmp_path / "x" / ".." / "a", secret_key=SECRET)) == root_a
    assert mode(root_a) == 0o700

    config = write(a, 7)
    assert config == root_a / "7" / "ipuof.conf" and config.is_file()
    ipuof.release_runtime_root(a)
    assert root_a.exists(), "a root with an attempt's directory in it stays"
    ipuof.remove_attempt_files(a, 7)
    ipuof.release_runtime_root(a)
    assert not root_a.exists(), "a stopped agent leaves nothing in /dev/shm"
    assert write(a, 8).is_file() and mode(root_a) == 0o700, "the next attempt makes the root again"


def test_a_root_planted_by_someone_else_is_never_written_through(tmp_path: Path, shm: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", secret_key=SECRET)
    expected = ipuof.runtime_root(settings)
    ipuof.release_runtime_root(settings)
    ipuof._runtime_root.cache_clear()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    expected.symlink_to(elsewhere)  # as another user could, first, in a shared /dev/shm

    config = write(settings, 3)
    assert config == (tmp_path / "data" / "attempts" / "3" / "ipuof.conf").resolve()
    assert not any(elsewhere.iterdir()), "nothing went through the link"


def test_without_a_usable_dev_shm_the_files_go_under_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ipuof, "SHM", tmp_path / "no-shm-here")
    settings = Settings(data_dir=tmp_path / "data", secret_key=SECRET)
    assert write(settings, 1) == (tmp_path / "data" / "attempts" / "1" / "ipuof.conf").resolve()


def test_a_redelivered_attempt_rewrites_its_files_private(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", runtime_dir=tmp_path / "rt", secret_key=SECRET)
    config = write(settings, 5)
    os.chmod(config, 0o644)
    os.chmod(config.parent, 0o755)
    config.write_text("stale")
    assert write(settings, 5) == config
    assert mode(config) == 0o600 and mode(config.parent) == 0o700 and config.read_text() != "stale"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="this host has no /dev/shm")
def test_the_shipped_default_is_dev_shm_and_a_released_root_leaves_nothing(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", secret_key=SECRET)
    root = ipuof.runtime_root(settings)
    assert root.parent == Path("/dev/shm")
    write(settings, 1)
    ipuof.remove_attempt_files(settings, 1)
    ipuof.release_runtime_root(settings)
    assert not root.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the directory to another user needs root")
def test_a_configured_directory_may_be_shared_and_someone_elses_as_a_kubernetes_volume_is(
    tmp_path: Path,
) -> None:
    """A memory `emptyDir` is root's and mode 0777, and the worker runs as another user: the agent
    writes there all the same, each attempt in a directory of its own that only it can enter."""
    volume = tmp_path / "volume"
    volume.mkdir()
    os.chmod(volume, 0o777)
    os.chown(volume, 12345, 12345)
    settings = Settings(data_dir=tmp_path / "data", runtime_dir=volume, secret_key=SECRET)
    config = write(settings, 9)
    assert config.parent == volume / "9" and mode(config.parent) == 0o700 and mode(config) == 0o600
    assert mode(volume) == 0o777 and os.lstat(volume).st_uid == 12345, "the volume itself is left as it is"
    ipuof.remove_attempt_files(settings, 9)
    ipuof.release_runtime_root(settings)
    assert volume.is_dir()
