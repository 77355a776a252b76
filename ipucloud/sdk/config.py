"""Where a client finds its URL and key: arguments, then environment, then the config file.

The file (`ipucloud login` writes it) is `$IPUCLOUD_CONFIG`, else
`$XDG_CONFIG_HOME/ipucloud/config.json`, else `~/.config/ipucloud/config.json`. It holds a key,
so it is created with mode 0600 inside a 0700 directory and never widened afterwards.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ipucloud.sdk.errors import ConfigurationError

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "IPUCLOUD_URL"
KEY_ENV = "IPUCLOUD_API_KEY"
CONFIG_ENV = "IPUCLOUD_CONFIG"


@dataclass(frozen=True)
class Credentials:
    url: str
    key: str | None
    source: str  # where the key came from: argument, environment, config file or none


def config_path() -> Path:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ipucloud" / "config.json"


def load_config(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigurationError(f"Cannot read {path}: {exc}")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{path} is not valid JSON ({exc}); run `ipucloud login` again.")
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path} should hold a JSON object; run `ipucloud login` again.")
    return {k: str(v) for k, v in data.items() if isinstance(v, str)}


def save_config(url: str, key: str, path: Path | None = None) -> Path:
    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (json.dumps({"url": url, "api_key": key}, indent=2) + "\n").encode())
    finally:
        os.close(fd)
    # O_CREAT's mode only applies to a new file; an older, wider file is narrowed here.
    os.chmod(path, 0o600)
    return path


def remove_config(path: Path | None = None) -> bool:
    path = path or config_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def resolve(url: str | None = None, key: str | None = None) -> Credentials:
    """Arguments win over the environment, which wins over the config file."""
    file = load_config() if url is None or key is None else {}
    chosen_url = url or os.environ.get(URL_ENV) or file.get("url") or DEFAULT_URL
    if key:
        return Credentials(_clean_url(chosen_url), key, "argument")
    if os.environ.get(KEY_ENV):
        return Credentials(_clean_url(chosen_url), os.environ[KEY_ENV], "environment")
    if file.get("api_key"):
        return Credentials(_clean_url(chosen_url), file["api_key"], "config file")
    return Credentials(_clean_url(chosen_url), None, "none")


def _clean_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"The URL must start with http:// or https://, got {url!r}.")
    return url
