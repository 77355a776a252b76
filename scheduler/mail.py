"""E-mail on the wire: compose a message (plain text and HTML, List-Unsubscribe) and send it over SMTP,
or keep it as an `.eml` file when the cloud has no mail server (`ipucloud up`). No database here: the
outbox and its retries are scheduler/services/tenancy/mail.py's, the sending the notifier's.

Header values never carry a CR or LF: a name or subject that holds one is refused (`HeaderInjection`)
before a message is built, so no name typed into a form can add a `Bcc:` or start the body early.
"""

from __future__ import annotations

import os
import smtplib
import ssl
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid, parseaddr
from pathlib import Path
from urllib.parse import unquote, urlsplit

MAX_EML_LISTED = 500


class HeaderInjection(ValueError):
    """A header value (a name, a subject, an address) holds a line break."""


class MailError(Exception):
    """A message could not be sent; `permanent` when trying again cannot help (a 5xx answer)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def check_header(value: str, field: str) -> str:
    if any(c in value for c in "\r\n\x00") or any(ord(c) < 32 and c != "\t" for c in value):
        raise HeaderInjection(f"{field} must not contain line breaks or control characters.")
    return value


def address(name: str, addr: str) -> Address:
    """`Name <addr>`, refusing a line break in either part."""
    check_header(name, "name")
    check_header(addr, "address")
    local, sep, domain = addr.rpartition("@")
    if not sep or not local or not domain:
        raise HeaderInjection(f"Not an e-mail address: {addr!r}.")
    return Address(display_name=name, username=local, domain=domain)


def parse_from(value: str) -> Address:
    check_header(value, "IPUCLOUD_MAIL_FROM")
    name, addr = parseaddr(value)
    return address(name, addr)


@dataclass(frozen=True)
class Outgoing:
    """A message ready to go: what `compose` needs."""

    to_addr: str
    to_name: str
    subject: str
    text: str
    html: str
    unsubscribe_url: str | None
    message_key: str


def compose(out: Outgoing, *, sender: str, now: datetime | None = None) -> EmailMessage:
    """The MIME message: multipart/alternative with the plain text first and the HTML second, and,
    for notifications a person may turn off, List-Unsubscribe with one-click (RFC 8058)."""
    msg = EmailMessage()
    from_addr = parse_from(sender)
    msg["From"] = from_addr
    msg["To"] = address(out.to_name, out.to_addr)
    msg["Subject"] = check_header(out.subject, "subject")
    msg["Date"] = format_datetime(now or datetime.now(UTC))
    msg["Message-ID"] = make_msgid(idstring=_idstring(out.message_key), domain=from_addr.domain or None)
    msg["Auto-Submitted"] = "auto-generated"
    if out.unsubscribe_url:
        check_header(out.unsubscribe_url, "unsubscribe link")
        msg["List-Unsubscribe"] = f"<{out.unsubscribe_url}>"
        msg["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    msg.set_content(out.text)
    msg.add_alternative(out.html, subtype="html")
    return msg


def _idstring(key: str) -> str:
    return "".join(c if c.isalnum() or c in ".-_" else "." for c in key)[:64]


# ------------------------------------------------------------------------------------------- transports


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int
    security: str  # tls | starttls | plain
    username: str | None
    password: str | None


def parse_smtp_url(url: str) -> SmtpTarget:
    """`smtps://` (TLS from the first byte, port 465), `smtp+starttls://` (STARTTLS, required, 587) or
    `smtp://` (plain, 25); user and password, URL-encoded, before the host."""
    parts = urlsplit(url)
    schemes = {"smtps": ("tls", 465), "smtp+starttls": ("starttls", 587), "smtp": ("plain", 25)}
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError("IPUCLOUD_SMTP_URL must be smtps://, smtp+starttls:// or smtp://host[:port]")
    security, default_port = schemes[parts.scheme]
    return SmtpTarget(
        host=parts.hostname,
        port=parts.port or default_port,
        security=security,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


def send_smtp(msg: EmailMessage, *, url: str, timeout_s: float, ca_file: Path | None = None) -> None:
    """Hand the message to the SMTP server; raises MailError (permanent for a 5xx answer)."""
    target = parse_smtp_url(url)
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    client: smtplib.SMTP
    try:
        if target.security == "tls":
            client = smtplib.SMTP_SSL(target.host, target.port, timeout=timeout_s, context=context)
        else:
            client = smtplib.SMTP(target.host, target.port, timeout=timeout_s)
        with client:
            client.ehlo()
            if target.security == "starttls":
                client.starttls(context=context)
                client.ehlo()
            if target.username:
                client.login(target.username, target.password or "")
            refused = client.send_message(msg)
            if refused:
                raise MailError(f"the server refused {sorted(refused)}", permanent=True)
    except smtplib.SMTPResponseException as exc:
        raise MailError(f"SMTP {exc.smtp_code}: {_text(exc.smtp_error)}", permanent=exc.smtp_code >= 500)
    except smtplib.SMTPRecipientsRefused as exc:
        raise MailError(f"recipients refused: {sorted(exc.recipients)}", permanent=True)
    except (TimeoutError, smtplib.SMTPException, OSError, ssl.SSLError) as exc:
        raise MailError(f"{type(exc).__name__}: {exc}")


def _text(raw: bytes | str) -> str:
    return (raw.decode(errors="replace") if isinstance(raw, bytes) else raw)[:300]


def write_eml(msg: EmailMessage, directory: Path, name: str) -> Path:
    """Keep the message as `<directory>/<name>.eml`, written whole or not at all (the admin page may be
    reading the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.eml"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(msg.as_bytes())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def deliver(
    msg: EmailMessage,
    *,
    smtp_url: str | None,
    mail_dir: Path,
    name: str,
    timeout_s: float,
    ca_file: Path | None = None,
) -> str:
    """Send over SMTP when a server is configured, else keep as an `.eml` file; returns where it went."""
    if smtp_url:
        send_smtp(msg, url=smtp_url, timeout_s=timeout_s, ca_file=ca_file)
        return "smtp"
    try:
        return str(write_eml(msg, mail_dir, name))
    except OSError as exc:
        raise MailError(f"could not keep the message: {exc}")


# --------------------------------------------------------------------------- the .eml files, for the admin


@dataclass(frozen=True)
class KeptMessage:
    name: str
    to: str
    subject: str
    date: str
    size: int


def _valid_name(name: str) -> bool:
    return 0 < len(name) <= 120 and all(c.isalnum() or c in "-_." for c in name) and not name.startswith(".")


def list_kept(mail_dir: Path, *, limit: int = MAX_EML_LISTED) -> list[KeptMessage]:
    """The kept messages, newest first (their names start with the time they were written)."""
    from email import policy
    from email.parser import BytesHeaderParser

    if not mail_dir.is_dir():
        return []
    names = sorted((p.name for p in mail_dir.glob("*.eml")), reverse=True)[:limit]
    found = []
    for name in names:
        path = mail_dir / name
        try:
            with path.open("rb") as fh:
                headers = BytesHeaderParser(policy=policy.default).parse(fh)
            size = path.stat().st_size
        except OSError:
            continue
        found.append(
            KeptMessage(
                name=name.removesuffix(".eml"),
                to=str(headers.get("To", "")),
                subject=str(headers.get("Subject", "")),
                date=str(headers.get("Date", "")),
                size=size,
            )
        )
    return found


def read_kept(mail_dir: Path, name: str) -> EmailMessage | None:
    """A kept message by its name; None for a name that is not one (no path outside the directory)."""
    from email import message_from_bytes, policy

    if not _valid_name(name):
        return None
    path = mail_dir / f"{name}.eml"
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    msg = message_from_bytes(raw, policy=policy.default)
    assert isinstance(msg, EmailMessage)
    return msg
