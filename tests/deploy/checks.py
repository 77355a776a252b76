"""What the deployment tests hold every deploy file to: its commands are real `ipucloud` commands with
real flags (parsed by the CLI itself), and its settings are real Settings fields."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SERVER_COMMANDS = {"api", "scheduler", "worker", "migrate", "bootstrap"}


def setting_names() -> set[str]:
    """Every environment variable the code reads: IPUCLOUD_ + a Settings field."""
    from scheduler.settings import Settings

    return {f"IPUCLOUD_{name.upper()}" for name in Settings.model_fields}


def required_in_production() -> set[str]:
    """The variables without which a production component refuses to start (ipucloud/preflight.py),
    found by asking the start-up checks with each one left out."""
    from ipucloud.preflight import static_problems
    from scheduler.settings import Settings

    full = {
        "database_url": "postgresql://x@db/ipucloud",
        "redis_url": "redis://r:6379/0",
        "secret_key": "k" * 40,
    }
    required = set()
    for field in full:
        # An explicit None, so that a variable in this process's environment cannot fill the gap.
        given: dict[str, str | None] = {**full, field: None}
        if static_problems(Settings(mode="production", data_dir="/nonexistent", **given)):
            required.add(f"IPUCLOUD_{field.upper()}")
    return required


def check_ipucloud_command(args: Sequence[str]) -> str:
    """Parse `ipucloud <args>` with the real CLI; returns the command name or fails naming the error."""
    import typer.main

    from ipucloud.cli import app

    cli = typer.main.get_command(app)
    ctx = cli.make_context("ipucloud", list(args), resilient_parsing=True)
    try:
        name, command, rest = cli.resolve_command(ctx, list(args))
        assert command is not None and name is not None, f"`ipucloud {' '.join(args)}`: no such command"
        command.make_context(name, list(rest), parent=ctx)
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"`ipucloud {' '.join(args)}` is not a valid command line: {exc}") from exc
    return name


_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


class MissingVariable(ValueError):
    pass


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = env.get(name)
        unset_or_empty = value is None or (op is not None and op.startswith(":") and value == "")
        if op in ("-", ":-"):
            return arg if unset_or_empty else str(value)
        if op in ("?", ":?"):
            if unset_or_empty:
                raise MissingVariable(f"{name}: {arg}")
            return str(value)
        return "" if value is None else str(value)

    return _VAR.sub(sub, text)


def referenced_variables(text: str) -> set[str]:
    return {m.group(1) or m.group(4) for m in _VAR.finditer(text) if m.group(0) != "$$"}


def read_env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values
