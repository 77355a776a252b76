"""A client of the V-IPU endpoint (`ipucloud vipu-server`) for `ipucloud vipu`, `gc-info` and `gc-monitor`.

Where the endpoint is and which key to send, first found wins:

1. the V-IPU CLI's flags (`--api-host`, `--api-port`, `--api-user-id`, `--api-access-key`);
2. the file given with `--config` (a `vipu-cli.hcl`: `api-host = "..."`, `api-port = 8090`, ...);
3. the V-IPU CLI's variables `VIPU_CLI_API_HOST`, `VIPU_CLI_API_PORT`, `VIPU_CLI_API_USER_ID`,
   `VIPU_CLI_API_ACCESS_KEY`;
4. inside an attempt, the `vipu-cli.hcl` its host agent wrote beside `IPUOF_CONFIG_PATH` (its own
   short-lived key), and `IPUOF_VIPU_API_HOST` / `IPUOF_VIPU_API_PORT`;
5. the cloud's own: `IPUCLOUD_VIPU_API_HOST` / `IPUCLOUD_VIPU_API_PORT` (127.0.0.1:8090), and the key
   of `IPUCLOUD_API_KEY` or `ipucloud login`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
CLI_CONFIG_NAME = "vipu-cli.hcl"


class VipuError(Exception):
    """The endpoint refused a request: its HTTP status, gRPC code, cause (`reason`) and detail."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.code = str(body.get("code") or "UNKNOWN")
        self.reason = body.get("reason")
        self.detail = str(body.get("detail") or body.get("title") or f"HTTP {status}")
        super().__init__(self.detail)


class VipuUnreachable(Exception):
    """Nothing answered at the endpoint's address in time; the message says where and why."""


class VipuConfigError(Exception):
    """A configuration file could not be read."""


def read_cli_config(path: Path) -> dict[str, str]:
    """A `vipu-cli.hcl` as strings by attribute name (`api-host`, `api-port`, ...)."""
    import hcl2

    try:
        parsed = hcl2.loads(path.read_text())
    except OSError as exc:
        raise VipuConfigError(f"cannot read {path}: {exc.strerror or exc}")
    except Exception as exc:  # the parser's own errors: a file that is not HCL
        raise VipuConfigError(f"{path} is not a V-IPU CLI configuration (HCL `name = value` lines): {exc}")
    # python-hcl2 keeps a string's quotes; a number comes back as a number.
    return {k: str(v).strip('"') for k, v in parsed.items() if not k.startswith("__")}


@dataclass(frozen=True)
class Connection:
    host: str
    port: int
    user_id: str | None
    access_key: str | None
    source: str
    """Where the key came from, for messages ("--api-access-key", "/path/vipu-cli.hcl", ...)."""

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}"


def _port(value: str | int | None, where: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        port = int(value)
    except ValueError:
        raise VipuConfigError(f"{where}: the port must be a number, not {value!r}")
    if not 1 <= port <= 65535:
        raise VipuConfigError(f"{where}: the port must be 1 .. 65535, not {port}")
    return port


def resolve(
    *,
    api_host: str | None = None,
    api_port: int | None = None,
    api_user_id: str | None = None,
    api_access_key: str | None = None,
    config: Path | None = None,
) -> Connection:
    layers: list[tuple[str, dict[str, str]]] = [
        (
            "flags",
            {
                k: str(v)
                for k, v in {
                    "api-host": api_host,
                    "api-port": api_port,
                    "api-user-id": api_user_id,
                    "api-access-key": api_access_key,
                }.items()
                if v is not None
            },
        )
    ]
    if config is not None:
        layers.append((str(config), read_cli_config(config)))
    env = os.environ
    layers.append(
        (
            "VIPU_CLI_* variables",
            {
                name: env[var]
                for name, var in (
                    ("api-host", "VIPU_CLI_API_HOST"),
                    ("api-port", "VIPU_CLI_API_PORT"),
                    ("api-user-id", "VIPU_CLI_API_USER_ID"),
                    ("api-access-key", "VIPU_CLI_API_ACCESS_KEY"),
                )
                if env.get(var)
            },
        )
    )
    ipuof_conf = env.get("IPUOF_CONFIG_PATH")
    if ipuof_conf:
        beside = Path(ipuof_conf).parent / CLI_CONFIG_NAME
        if beside.is_file():
            layers.append((str(beside), read_cli_config(beside)))
    layers.append(
        (
            "IPUOF_VIPU_API_* variables",
            {
                name: env[var]
                for name, var in (("api-host", "IPUOF_VIPU_API_HOST"), ("api-port", "IPUOF_VIPU_API_PORT"))
                if env.get(var)
            },
        )
    )

    def first(name: str) -> tuple[str | None, str]:
        for where, values in layers:
            if values.get(name):
                return values[name], where
        return None, ""

    host, _ = first("api-host")
    port_text, port_from = first("api-port")
    user, _ = first("api-user-id")
    key, key_from = first("api-access-key")
    if key is None:
        # Only now: the SDK's models take a while to import, and the tools must answer within 2 s.
        from ipucloud.sdk import config as sdk_config

        saved = sdk_config.resolve()
        key, key_from = saved.key, f"the cloud's API key ({saved.source})"
    return Connection(
        host=host or env.get("IPUCLOUD_VIPU_API_HOST") or DEFAULT_HOST,
        port=_port(port_text, port_from)
        or _port(env.get("IPUCLOUD_VIPU_API_PORT"), "IPUCLOUD_VIPU_API_PORT")
        or DEFAULT_PORT,
        user_id=user,
        access_key=key,
        source=key_from,
    )


class VipuClient:
    """Calls `POST /v1/<Operation>` with a JSON request message; returns the reply message."""

    def __init__(self, conn: Connection, *, timeout: float = 10.0) -> None:
        self.conn = conn
        self.timeout = timeout
        headers = {"Accept": "application/json"}
        if conn.access_key:
            headers["Authorization"] = f"Bearer {conn.access_key}"
        if conn.user_id:
            headers["X-Vipu-User-Id"] = conn.user_id
        self._http = httpx.Client(base_url=conn.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> VipuClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, operation: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        where = f"{self.conn.host}:{self.conn.port}"
        try:
            resp = self._http.post(f"/v1/{operation}", json=body or {})
        except httpx.TimeoutException:
            raise VipuUnreachable(f"the V-IPU endpoint at {where} did not answer within {self.timeout:g} s")
        except httpx.ConnectError as exc:
            raise VipuUnreachable(
                f"nothing answers at {where} ({_cause(exc)}): is `ipucloud vipu-server` running there? "
                "(`ipucloud up` starts it; set --api-host/--api-port or IPUOF_VIPU_API_HOST/PORT)"
            )
        except httpx.HTTPError as exc:
            raise VipuUnreachable(f"the V-IPU endpoint at {where} failed: {_cause(exc)}")
        try:
            data = resp.json()
        except ValueError:
            data = {}
        if resp.status_code >= 400:
            if not isinstance(data, dict):
                data = {}
            data.setdefault("detail", f"HTTP {resp.status_code} from {where}")
            raise VipuError(resp.status_code, data)
        if not isinstance(data, dict):
            raise VipuUnreachable(f"the V-IPU endpoint at {where} answered something that is not a reply")
        return data


def _cause(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.split("] ", 1)[-1]
