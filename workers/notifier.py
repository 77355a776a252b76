"""The notifier: `ipucloud notifier`, a Celery worker that delivers webhooks and e-mail.

Its pump thread reads the database, never the broker, for what is to be done: it fans new events out
into deliveries, claims the deliveries that are due for a lease, and publishes one message per claim
on the `ipucloud.notify` queue; the threads of the Celery pool send them (`deliver`) and write each
outcome. The database holds every delivery's state, so a broker or a notifier that restarts loses
nothing: a claim whose message was lost, or whose worker died, lapses and is claimed and published
again (at least once). The pump also writes the swept events (grant thresholds, trials ending) and
prunes what is older than 30 days. Replicas may run side by side: claims are guarded updates.

E-mail goes the same way: the pump turns new events into messages for the members who want them
(scheduler/services/tenancy/mail.py), claims the messages due and publishes one `send_mail` per
claim; the task sends it over SMTP, or keeps it as an `.eml` file when no server is configured, and
records the outcome.

It has its own Celery app and serves only its own queue, so it never takes a host agent's dispatch.

`ipucloud up` runs it inside its worker process instead (`ipucloud worker --with-notifier`, `Embedded`),
to save a Python process: the same pump hands each claim to a pool of `notifier_concurrency` threads
of its own rather than to the broker. What a delivery does, its retries, its lease and the per-webhook
limit are the database's and the same code's either way; a claim whose process dies lapses as above.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import signals

from scheduler import mail as mail_wire
from scheduler import runtime, webhook_http
from scheduler.broker import make_celery
from scheduler.models import utcnow
from scheduler.runtime import Runtime
from scheduler.services.tenancy import deliveries, mail, notifications, thresholds
from scheduler.settings import Settings, get_settings

log = logging.getLogger("ipucloud.notifier")

QUEUE = "ipucloud.notify"
TASK_NAME = "ipucloud.deliver_webhook"
MAIL_TASK = "ipucloud.send_mail"
SWEEP_EVERY_S = 5.0
# How long one task goes on sending a webhook's next deliveries before it lets the pump share the
# threads out again.
CHAIN_S = 5.0
PRUNE_EVERY_S = 600.0

app = make_celery()
app.conf.task_default_queue = QUEUE


def claim_lease_s(settings: Settings) -> float:
    # Long enough for a try to end (its timeout) and its outcome to be written, short enough that a
    # lost message is sent again soon.
    return 2 * settings.webhook_timeout_s + 1


def mail_lease_s(settings: Settings) -> float:
    return 2 * settings.smtp_timeout_s + 1


class Pump(threading.Thread):
    """Fan-out, claims and publication, every `notifier_poll_s` (see the module's docstring)."""

    def __init__(self, rt: Runtime, publish: Callable[[str, int], None] | None = None) -> None:
        """`publish(task name, id)`: hands a claim on (by default, a message on the notifier's queue)."""
        super().__init__(name="notifier-pump", daemon=True)
        self.rt = rt
        self.stop_event = threading.Event()
        self.publish = publish or _send

    def run(self) -> None:
        settings = self.rt.settings
        next_sweep = next_prune = 0.0
        while not self.stop_event.is_set():
            try:
                busy = self.pass_once(
                    sweep=time.monotonic() >= next_sweep, prune=time.monotonic() >= next_prune
                )
            except Exception:
                # A database or broker that is away: the next pass tries again; nothing was lost.
                log.exception("notifier pass failed")
                busy = False
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + SWEEP_EVERY_S
            if now >= next_prune:
                next_prune = now + PRUNE_EVERY_S
            if not busy:
                self.stop_event.wait(settings.notifier_poll_s)

    def pass_once(self, *, sweep: bool = False, prune: bool = False) -> bool:
        """One pass; True if there was more to do than one batch."""
        settings = self.rt.settings
        db = self.rt.db
        if sweep:
            with db.write() as s:
                thresholds.sweep(session=s, now=self.rt.clock.wall_now(), clock=self.rt.clock)
        if prune:
            with db.write() as s:
                notifications.prune(session=s, now=utcnow())
                mail.prune(session=s, now=utcnow())
        with db.write() as s:
            fanned = deliveries.fan_out(session=s)
        with db.write() as s:
            mailed = mail.fan_out(session=s, secret=settings.secret(), link_base=settings.link_base)
        with db.write() as s:
            letters = mail.claim_due(session=s, now=utcnow(), lease_s=mail_lease_s(settings))
        for message_id in letters:
            self.publish(MAIL_TASK, message_id)
        with db.write() as s:
            claimed = deliveries.claim_due(
                session=s,
                now=utcnow(),
                lease_s=claim_lease_s(settings),
                per_webhook=settings.notifier_per_webhook,
            )
        for delivery_id in claimed:
            self.publish(TASK_NAME, delivery_id)
        return fanned >= 500 or len(claimed) >= 200 or mailed >= mail.FAN_OUT_BATCH or len(letters) >= 100


def _send(task: str, claim: int) -> None:
    app.send_task(task, args=[claim], queue=QUEUE)


_rng = random.Random()
# This process's pump, started once the worker consumes (a worker process runs one notifier).
_pump: list[Pump] = []


def _ours(sender: Any) -> bool:
    # Celery's signals are process-wide: act only for this app's worker.
    return getattr(sender, "app", None) is app


@signals.worker_init.connect
def _start(sender: Any = None, **_: Any) -> None:
    if _ours(sender):
        runtime.install(runtime.Runtime.from_settings(get_settings()))


@signals.worker_ready.connect
def _start_pump(sender: Any = None, **_: Any) -> None:
    if not _ours(sender):
        return
    pump = Pump(runtime.current())
    _pump.append(pump)
    pump.start()
    log.info("notifier ready: delivering webhooks from the events outbox")


@signals.worker_shutting_down.connect
def _stop(**_: Any) -> None:
    while _pump:
        pump = _pump.pop()
        pump.stop_event.set()
        pump.join(timeout=5)


# Celery calls its tasks as plain functions with no application object of ours, so its entry points
# alone read the process's runtime (`runtime.current()`); the embedded pool has it and passes it.
@app.task(name=TASK_NAME, ignore_result=True)
def deliver(delivery_id: int) -> str:
    return deliver_with(runtime.current(), delivery_id)


@app.task(name=MAIL_TASK, ignore_result=True)
def send_mail(message_id: int) -> str:
    return send_mail_with(runtime.current(), message_id)


def deliver_with(rt: Runtime, delivery_id: int) -> str:
    """Send one claimed delivery and write what the receiver did; then, for up to `CHAIN_S`, the
    webhook's next due delivery in the same thread (claimed in the same transaction), so a busy
    webhook's queue drains at the pace of its receiver rather than of the pump's passes."""
    settings, clock = rt.settings, rt.clock
    until = time.monotonic() + CHAIN_S
    now = utcnow()
    with rt.db.read() as s:
        out = deliveries.outgoing(session=s, delivery_id=delivery_id, now=now, public_url=settings.public_url)
    status = "nothing to send"
    while out is not None:
        outcome = webhook_http.send(
            url=out.url,
            msg_id=out.msg_id,
            body=out.body,
            secrets=out.secrets,
            timeout_s=settings.webhook_timeout_s,
            max_bytes=settings.webhook_max_response_bytes,
            allow_private=settings.webhook_allow_private,
            timestamp=now,
        )
        sent, out = out, None
        with rt.db.write() as s:
            now = utcnow()
            result = deliveries.record_outcome(
                session=s,
                delivery_id=sent.delivery_id,
                outcome=outcome,
                now=now,
                clock=clock,
                disable_after_s=settings.webhook_disable_after_s,
                rng=_rng,
            )
            if result is not None and not result["disabled"] and time.monotonic() < until:
                following = deliveries.claim_next(
                    session=s, webhook_id=sent.webhook_id, now=now, lease_s=claim_lease_s(settings)
                )
                if following is not None:
                    out = deliveries.outgoing(
                        session=s, delivery_id=following, now=now, public_url=settings.public_url
                    )
        if result is not None and result["disabled"]:
            log.warning("webhook %s disabled: %s", sent.webhook_id, outcome.error)
        status = result["status"] if result else "settled elsewhere"
    return status


def send_mail_with(rt: Runtime, message_id: int) -> str:
    """Send one claimed message (SMTP, or an `.eml` file without a server) and record what happened.
    Sent twice only if this worker dies between the server's acceptance and the record (at least once)."""
    settings = rt.settings
    with rt.db.read() as s:
        found = mail.outgoing(session=s, message_id=message_id)
    if found is None:
        return "nothing to send"
    out, name = found
    smtp_url = settings.smtp_url.get_secret_value() if settings.smtp_url else None
    try:
        msg = mail_wire.compose(out, sender=settings.mail_from)
        mail_wire.deliver(
            msg,
            smtp_url=smtp_url,
            mail_dir=settings.mail_dir,
            name=name,
            timeout_s=settings.smtp_timeout_s,
            ca_file=settings.smtp_ca_file,
        )
    except (mail_wire.MailError, mail_wire.HeaderInjection) as exc:
        permanent = isinstance(exc, mail_wire.HeaderInjection) or bool(getattr(exc, "permanent", False))
        with rt.db.write() as s:
            status = mail.record_failure(
                session=s,
                message_id=message_id,
                error=str(exc),
                permanent=permanent,
                now=rt.clock.wall_now(),
                clock=rt.clock,
                rng=_rng,
            )
        log.warning("mail %s not sent (%s): %s", message_id, status, exc)
        return status or "settled elsewhere"
    with rt.db.write() as s:
        mail.record_sent(session=s, message_id=message_id, now=utcnow())
    return "sent"


class Embedded:
    """The notifier inside another process's worker (`run_inside`): the pump, and a pool of
    `concurrency` threads that runs each claim as the Celery pool would have (`deliver`, `send_mail`)."""

    def __init__(self, rt: Runtime, concurrency: int) -> None:
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="notifier")
        self.pump = Pump(rt, publish=self.submit)
        self.tasks: dict[str, Callable[[int], str]] = {
            TASK_NAME: lambda claim: deliver_with(rt, claim),
            MAIL_TASK: lambda claim: send_mail_with(rt, claim),
        }

    def submit(self, task: str, claim: int) -> None:
        if self.pump.stop_event.is_set():
            return  # stopping: the claim lapses and is claimed again
        self.pool.submit(self._run, task, claim)

    def _run(self, task: str, claim: int) -> None:
        try:
            self.tasks[task](claim)
        except Exception:
            # As a Celery task that raised: logged; its claim lapses and is claimed again.
            log.exception("%s(%s) failed", task, claim)

    def start(self) -> None:
        self.pump.start()

    def stop(self) -> None:
        """No new claims; those not started yet are dropped (their leases lapse, to be claimed
        again by the next notifier); those running finish (`join`)."""
        self.pump.stop_event.set()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def join(self) -> None:
        self.pump.join(timeout=5)
        self.pool.shutdown(wait=True)


def run_inside(host: Any) -> None:
    """Deliver from the worker of the Celery app `host` too, from when it is ready until it stops."""
    running: list[Embedded] = []

    def _begin(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is host:
            rt = runtime.current()
            embedded = Embedded(rt, rt.settings.notifier_concurrency)
            running.append(embedded)
            embedded.start()
            log.info("notifier ready (in this worker): delivering webhooks from the events outbox")

    def _stopping(**_: Any) -> None:
        for embedded in running:
            embedded.stop()

    def _stopped(**_: Any) -> None:
        while running:
            embedded = running.pop()
            embedded.stop()
            embedded.join()

    # Kept by the signals (weak=False): these closures have no other owner.
    signals.worker_ready.connect(_begin, weak=False)
    signals.worker_shutting_down.connect(_stopping, weak=False)
    signals.worker_shutdown.connect(_stopped, weak=False)
