"""Mail over TLS to a real SMTP server in process (aiosmtpd) with a certificate made here (openssl): STARTTLS
required by the server (`smtp+starttls://`) and TLS from the first byte (`smtps://`) deliver when
`IPUCLOUD_SMTP_CA_FILE` names the CA that signed the server's certificate, and are refused, nothing
sent, when the certificate is not trusted (the system's CAs, or another CA), names another host, or the
server offers no STARTTLS at all."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from scheduler import mail as mail_wire
from scheduler.notify_models import MailMessage
from scheduler.services.tenancy import mail
from tests.support import services
from tests.support.smtp import send_due_mail, smtp_server
from tests.tenancy.conftest import World


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that signed nothing here
    cert: Path  # 127.0.0.1 and localhost, signed by `ca`
    key: Path
    elsewhere_cert: Path  # mail.example.org only, signed by `ca`
    elsewhere_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip


def _leaf(d: Path, name: str, ca: str, san: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip
    (d / f"{name}.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test's certificates")
    _ca(tmp_path, "test-ca")
    _ca(tmp_path, "other-ca")
    _leaf(tmp_path, "smtp", "test-ca", "IP:127.0.0.1,DNS:localhost")
    _leaf(tmp_path, "elsewhere", "test-ca", "DNS:mail.example.org")
    return Pki(
        ca=tmp_path / "test-ca.pem",
        other_ca=tmp_path / "other-ca.pem",
        cert=tmp_path / "smtp.pem",
        key=tmp_path / "smtp.key",
        elsewhere_cert=tmp_path / "elsewhere.pem",
        elsewhere_key=tmp_path / "elsewhere.key",
    )


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def message() -> EmailMessage:
    return mail_wire.compose(
        mail_wire.Outgoing("ada@example.org", "Ada", "over TLS", "text", "<p>html</p>", None, "k"),
        sender="cloud@example.net",
    )


def send(url: str, ca_file: Path | None) -> None:
    mail_wire.send_smtp(message(), url=url, timeout_s=10, ca_file=ca_file)


def test_starttls_and_implicit_tls_deliver_with_the_configured_ca_only(pki: Pki) -> None:
    context = server_context(pki.cert, pki.key)
    with smtp_server(tls_context=context, require_starttls=True) as box:
        url = f"smtp+starttls://127.0.0.1:{box.port}"
        # The server's certificate is signed by no CA the system trusts, nor by another CA.
        for ca_file in (None, pki.other_ca):
            with pytest.raises(mail_wire.MailError, match="CERTIFICATE_VERIFY_FAILED"):
                send(url, ca_file)
        # A plain client is refused by this server: it requires STARTTLS before MAIL.
        with pytest.raises(mail_wire.MailError, match="530"):
            send(f"smtp://127.0.0.1:{box.port}", None)
        assert box.received == []
        send(url, pki.ca)
        (got,) = box.wait_for(1)
        assert got.tls is not None and got.tls.startswith("TLSv1.")
        assert got.rcpt_tos == ["ada@example.org"] and got.message["Subject"] == "over TLS"

    with smtp_server(ssl_context=context) as box:
        url = f"smtps://127.0.0.1:{box.port}"
        for ca_file in (None, pki.other_ca):
            with pytest.raises(mail_wire.MailError, match="CERTIFICATE_VERIFY_FAILED"):
                send(url, ca_file)
        assert box.received == []
        send(url, pki.ca)
        (got,) = box.wait_for(1)
        assert got.tls is not None and got.tls.startswith("TLSv1.")


def test_a_certificate_for_another_host_and_a_server_without_starttls_are_refused(pki: Pki) -> None:
    elsewhere = server_context(pki.elsewhere_cert, pki.elsewhere_key)
    with smtp_server(tls_context=elsewhere, require_starttls=True) as box:
        with pytest.raises(mail_wire.MailError, match=r"(?i)hostname|IP address mismatch"):
            send(f"smtp+starttls://127.0.0.1:{box.port}", pki.ca)
        assert box.received == []
    # A server that offers no STARTTLS: `smtp+starttls://` never falls back to the clear.
    with smtp_server() as box:
        with pytest.raises(mail_wire.MailError, match=r"(?i)starttls"):
            send(f"smtp+starttls://127.0.0.1:{box.port}", pki.ca)
        assert box.received == []


def test_the_notifier_sends_over_starttls_with_the_ca_file_setting(
    pki: Pki, world: World, db: Any, runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with smtp_server(tls_context=server_context(pki.cert, pki.key), require_starttls=True) as box:
        monkeypatch.setenv("IPUCLOUD_SMTP_URL", f"smtp+starttls://127.0.0.1:{box.port}")
        monkeypatch.setenv("IPUCLOUD_SMTP_TIMEOUT_S", "5")
        monkeypatch.delenv("IPUCLOUD_SMTP_CA_FILE", raising=False)
        services.reload_settings(runtime)
        with db.write() as s:
            mail.enqueue(
                s,
                key="tls",
                kind="test",
                to_addr="ada@example.org",
                to_name="Ada",
                body=mail.Body("over STARTTLS", ["hello"]),
                link_base="http://x",
            )
        # Without the CA the certificate is not trusted: a failure the notifier tries again later.
        assert send_due_mail(db) == ["pending"]
        with db.write() as s:
            row = s.execute(select(MailMessage).where(MailMessage.key == "tls")).scalar_one()
            assert "CERTIFICATE_VERIFY_FAILED" in (row.last_error or "")
            row.next_attempt_at = row.created_at
        assert box.received == []
        monkeypatch.setenv("IPUCLOUD_SMTP_CA_FILE", str(pki.ca))
        services.reload_settings(runtime)
        assert send_due_mail(db) == ["sent"]
        (got,) = box.wait_for(1)
        assert got.tls is not None and got.message["Subject"] == "over STARTTLS"
