"""A real SMTP server in process (aiosmtpd) that keeps what it receives, and the notifier's mail path
run in process: fan-out, claims and the `send_mail` task, as `ipucloud notifier` runs them."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    tls: str | None = None  # the TLS version the message came over; None: in the clear

    @property
    def text(self) -> str:
        part = self.message.get_body(preferencelist=("plain",))
        return part.get_content() if part is not None else ""

    @property
    def html(self) -> str:
        part = self.message.get_body(preferencelist=("html",))
        return part.get_content() if part is not None else ""


@dataclass
class Inbox:
    received: list[Received] = field(default_factory=list)
    port: int = 0
    refuse: set[str] = field(default_factory=set)  # recipients answered 550

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 No such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = message_from_bytes(envelope.content, policy=policy.default)
        assert isinstance(msg, EmailMessage)
        ssl_object = server.transport.get_extra_info("ssl_object") if server.transport else None
        tls = ssl_object.version() if ssl_object is not None else None
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), msg, tls))
        return "250 Message accepted for delivery"

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.received) >= count, f"{len(self.received)} of {count} messages arrived"
        return self.received

    def to(self, address: str) -> list[Received]:
        return [r for r in self.received if address in r.rcpt_tos]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def smtp_server(**tls: Any) -> Iterator[Inbox]:
    """`tls`: aiosmtpd's `tls_context` and `require_starttls` (STARTTLS), or `ssl_context` (TLS from the
    first byte)."""
    inbox = Inbox(port=free_port())
    controller = Controller(inbox, hostname="127.0.0.1", port=inbox.port, **tls)
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()


def send_due_mail(db: Any) -> list[str]:
    """What the notifier's pump and its `send_mail` tasks do, in this process: fan new events out into
    messages, claim the due ones and send each. Returns each message's outcome."""
    from scheduler.models import utcnow
    from scheduler.services.tenancy import mail
    from scheduler.settings import get_settings
    from workers.notifier import send_mail

    settings = get_settings()
    with db.write() as s:
        while mail.fan_out(session=s, secret=settings.secret(), link_base=settings.link_base):
            pass
    with db.write() as s:
        ids = mail.claim_due(session=s, now=utcnow(), lease_s=60)
    return [send_mail(message_id) for message_id in ids]
