"""One signed webhook request: the receiver's address checked, the body signed to the Standard Webhooks
specification, the answer read within a time and size limit.

Shared by the notifier (`workers/notifier.py`, every delivery) and the API (`POST /webhooks/{id}/test`,
which answers with what the receiver said), so both refuse the same addresses and sign the same way.

Addresses are checked twice: when a URL is given (`check_url`, a 422 naming the field) and again at
every connection (`send`), against the addresses the name resolves to then; the request then goes to
the address that was checked (the name kept in `Host` and TLS's SNI), so a name that resolves to a
public address for the check and a private one for the connection (DNS rebinding) reaches nothing.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import httpx
from standardwebhooks import Webhook as Signer

MAX_URL_LENGTH = 2000
EXCERPT_CHARS = 500
USER_AGENT = "ipucloud-webhooks/1"

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(ValueError):
    """The URL may not be used: its message says why, for the caller's 422."""


def refusal(ip: IpAddress) -> str | None:
    """Why a webhook may not reach `ip`, or None when it may (a public unicast address)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return refusal(ip.ipv4_mapped)
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_private or ip.is_reserved or ip.is_unspecified or ip.is_multicast or not ip.is_global:
        return "a private or reserved address"
    return None


def check_url(url: str, *, allow_private: bool, resolve: bool = True) -> str:
    """The URL if a webhook may be sent to it; Refused otherwise (not http(s), too long, no host,
    or a host that resolves to a loopback, private or link-local address)."""
    if len(url) > MAX_URL_LENGTH:
        raise Refused(f"The URL is longer than {MAX_URL_LENGTH} characters.")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise Refused("The URL must be http:// or https://.")
    if not parts.hostname:
        raise Refused("The URL has no host.")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise Refused("The URL's port is not a number from 1 to 65535.")
    if resolve:
        addresses(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), allow_private)
    return url


def addresses(host: str, port: int, allow_private: bool) -> list[IpAddress]:
    """What `host` resolves to now, every address checked; Refused if any may not be reached."""
    try:
        found = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise Refused(f"The host {host!r} does not resolve ({exc}).")
        found = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    if not found:
        raise Refused(f"The host {host!r} does not resolve.")
    if not allow_private:
        for ip in found:
            why = refusal(ip)
            if why is not None:
                # Every address, not only the first: a client may connect to any of them.
                raise Refused(f"The host {host!r} resolves to {why} ({ip}); webhooks reach public addresses.")
    return found


def sign(secrets: list[str], msg_id: str, timestamp: datetime, body: bytes) -> str:
    """The `webhook-signature` header: one `v1,...` signature per secret, space separated, so a
    receiver holding either secret of a rotation verifies."""
    return " ".join(Signer(secret).sign(msg_id, timestamp, body) for secret in secrets)


def headers(secrets: list[str], msg_id: str, timestamp: datetime, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": sign(secrets, msg_id, timestamp, body),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        # The size limit counts the bytes on the wire: a compressed answer could be far larger unpacked.
        "accept-encoding": "identity",
    }


_local = threading.local()
_ssl_lock = threading.Lock()
_ssl: list[ssl.SSLContext] = []
CLIENTS_PER_THREAD = 64


def _client(host: str, timeout_s: float) -> httpx.Client:
    """This thread's client for `host`, kept so its connections are reused. One per host name, not
    per address: requests go to an address, and a pooled TLS connection made for one name (its SNI, its
    certificate) must never carry another's. Making a client costs tens of milliseconds of CPU (its
    TLS context), more than most deliveries take, so the TLS context is made once per process."""
    clients: dict[tuple[str, float], httpx.Client] = getattr(_local, "clients", None) or {}
    _local.clients = clients
    found = clients.get((host, timeout_s))
    if found is not None:
        return found
    with _ssl_lock:
        if not _ssl:
            _ssl.append(httpx.create_ssl_context())
    if len(clients) >= CLIENTS_PER_THREAD:
        for old in clients.values():
            old.close()
        clients.clear()
    made = clients[(host, timeout_s)] = httpx.Client(
        timeout=httpx.Timeout(timeout_s), follow_redirects=False, trust_env=False, verify=_ssl[0]
    )
    return made


@dataclass(frozen=True)
class Outcome:
    """What one request got: the receiver's status (None: no answer), how long it took, the start of
    its body, why it failed (None when it answered 2xx) and the `Retry-After` it asked for."""

    status: int | None
    latency_ms: int
    excerpt: str
    error: str | None
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def retry_after(value: str | None, now: datetime) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # `str.isdigit` alone takes `²`, which `float` refuses
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def send(
    *,
    url: str,
    msg_id: str,
    body: bytes,
    secrets: list[str],
    timeout_s: float,
    max_bytes: int,
    allow_private: bool,
    timestamp: datetime | None = None,
) -> Outcome:
    """POST one signed body to `url`. Never raises for anything the receiver or the network does:
    every failure is an Outcome with its `error`."""
    started = time.monotonic()

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        check_url(url, allow_private=allow_private, resolve=False)
        ip = addresses(host, port, allow_private)[0]
    except Refused as exc:
        return Outcome(None, took(), "", f"refused: {exc}")
    now = timestamp or datetime.now(UTC)
    sent_headers = headers(secrets, msg_id, now, body)
    default_port = port == (443 if parts.scheme == "https" else 80)
    sent_headers["host"] = host if default_port else f"{host}:{port}"
    target = httpx.URL(url).copy_with(host=str(ip))
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    deadline = started + timeout_s
    try:
        client = _client(host, timeout_s)
        with client.stream("POST", target, content=body, headers=sent_headers, extensions=extensions) as r:
            read = bytearray()
            error: str | None = None
            for chunk in r.iter_raw():
                read += chunk
                if len(read) > max_bytes:
                    error = f"the answer is larger than {max_bytes} bytes"
                    break
                if time.monotonic() > deadline:
                    error = f"the answer took longer than {timeout_s:g} s"
                    break
            excerpt = bytes(read[: EXCERPT_CHARS * 4]).decode("utf-8", "replace")[:EXCERPT_CHARS]
            if error is None and not 200 <= r.status_code < 300:
                error = (
                    f"answered {r.status_code}; redirects are not followed"
                    if 300 <= r.status_code < 400
                    else f"answered {r.status_code}"
                )
            return Outcome(
                r.status_code, took(), excerpt, error, retry_after(r.headers.get("retry-after"), now)
            )
    except httpx.TimeoutException:
        return Outcome(None, took(), "", f"no answer within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return Outcome(None, took(), "", f"{type(exc).__name__}: {str(exc)[:300]}")
