"""`ipucloud webhooks ...` and `ipucloud events`: receivers of the tenant's events, signed to the Standard
Webhooks specification (docs/notifications.md).

    ipucloud webhooks create https://ci.example.org/ipucloud --event job.failed --event job.succeeded
    ipucloud webhooks test wh_...                 # a signed webhook.ping: status, latency, body excerpt
    ipucloud webhooks deliveries wh_... --status failed
    ipucloud webhooks redeliver wh_... 42
    ipucloud webhooks rotate-secret wh_... --overlap 3600
    ipucloud events --type job.failed

Owners manage webhooks; members read them.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ipucloud.cli.client_common import (
    EXIT_CODES_HELP,
    JsonOpt,
    KeyOpt,
    UrlOpt,
    connect,
    kv_table,
    print_json,
    show,
    table,
    when,
)
from ipucloud.sdk.models import Webhook

app = typer.Typer(
    help="Webhooks: your events POSTed, signed, to your receivers.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
)

HookArg = Annotated[str, typer.Argument(help="The webhook's id (wh_...).", show_default=False)]
EventsOpt = Annotated[
    list[str] | None,
    typer.Option("--event", help="An event type to send (repeat it); none: every type.", show_default=False),
]


def describe(h: Webhook) -> list[tuple[str, Any]]:
    return [
        ("id", h.id),
        ("url", h.url),
        ("events", ", ".join(h.events) or "all"),
        ("state", "enabled" if h.enabled else f"disabled ({h.disabled_reason})"),
        ("failing since", when(h.failing_since)),
        ("old secret valid until", when(h.previous_secret_until)),
        ("description", h.description or "-"),
        ("created", when(h.created_at)),
    ]


@app.command("list")
def list_(url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """The tenant's webhooks."""
    with connect(url, key, as_json) as client:
        hooks = list(client.iter_webhooks())
    if as_json:
        print_json(hooks)
        return
    rows = [(h.id, h.url, ", ".join(h.events) or "all", "yes" if h.enabled else "no") for h in hooks]
    show(table(None, ["id", "url", "events", "enabled"], rows))


@app.command()
def create(
    target: Annotated[str, typer.Argument(metavar="URL", help="The receiver's http(s) URL.")],
    event: EventsOpt = None,
    description: Annotated[str, typer.Option(help="What it is for.")] = "",
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a webhook (owners). Its signing secret is printed once: store it now."""
    with connect(url, key, as_json) as client:
        h = client.create_webhook(target, events=event or [], description=description)
    if as_json:
        print_json(h)
        return
    show(kv_table([*describe(h), ("secret", h.secret)]))
    show("The secret is shown once: store it where your receiver reads it.")


@app.command("show")
def show_(webhook: HookArg, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """One webhook (never its secret)."""
    with connect(url, key, as_json) as client:
        h = client.get_webhook(webhook)
    print_json(h) if as_json else show(kv_table(describe(h)))


@app.command()
def update(
    webhook: HookArg,
    target: Annotated[str | None, typer.Option("--target", help="A new receiver URL.")] = None,
    event: EventsOpt = None,
    all_events: Annotated[bool, typer.Option("--all-events", help="Send every type.")] = False,
    description: Annotated[str | None, typer.Option(help="A new description.")] = None,
    enable: Annotated[bool | None, typer.Option("--enable/--disable", help="Enable or pause it.")] = None,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a webhook (owners); `--enable` re-enables one that was disabled."""
    events = [] if all_events else event
    with connect(url, key, as_json) as client:
        h = client.change_webhook(webhook, url=target, events=events, description=description, enabled=enable)
    print_json(h) if as_json else show(kv_table(describe(h)))


@app.command()
def delete(webhook: HookArg, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Remove a webhook and its deliveries (owners)."""
    with connect(url, key, as_json) as client:
        h = client.delete_webhook(webhook)
    print_json(h) if as_json else show(f"Removed {h.id} ({h.url}).")


@app.command("rotate-secret")
def rotate_secret(
    webhook: HookArg,
    overlap: Annotated[
        int,
        typer.Option(help="Seconds the old secret keeps signing beside the new one.", min=0, max=7 * 86400),
    ] = 86400,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A new signing secret (owners; printed once); both sign during the overlap."""
    with connect(url, key, as_json) as client:
        h = client.rotate_webhook_secret(webhook, overlap_s=overlap)
    print_json(h) if as_json else show(kv_table([*describe(h), ("secret", h.secret)]))


@app.command()
def test(webhook: HookArg, url: UrlOpt = None, key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Send a signed webhook.ping now and print what the receiver answered (owners)."""
    with connect(url, key, as_json) as client:
        t = client.test_webhook(webhook)
    if as_json:
        print_json(t)
        return
    show(
        kv_table(
            [
                ("ok", "yes" if t.ok else "no"),
                ("status", t.status if t.status is not None else "no answer"),
                ("latency", f"{t.latency_ms} ms"),
                ("error", t.error or "-"),
                ("body", t.body_excerpt or "-"),
            ]
        )
    )
    if not t.ok:
        raise typer.Exit(1)


@app.command()
def deliveries(
    webhook: HookArg,
    status: Annotated[str | None, typer.Option(help="pending, succeeded or failed.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.", min=1, max=10_000)] = 50,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A webhook's deliveries, newest first."""
    with connect(url, key, as_json) as client:
        found = []
        for d in client.iter_deliveries(webhook, status=status):
            found.append(d)
            if len(found) >= limit:
                break
    if as_json:
        print_json(found)
        return
    rows = [
        (
            d.id,
            d.event_type,
            d.status,
            d.attempts,
            d.last_status or "-",
            d.last_error or "-",
            when(d.created_at),
        )
        for d in found
    ]
    show(table(None, ["id", "event", "status", "tries", "last status", "last error", "created"], rows))


@app.command()
def redeliver(
    webhook: HookArg,
    delivery: Annotated[int, typer.Argument(help="The delivery's id.", min=1)],
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a delivery's event again, with the same webhook-id (owners)."""
    with connect(url, key, as_json) as client:
        d = client.redeliver(webhook, delivery)
    print_json(d) if as_json else show(f"Delivery {d.id} queued: {d.event_type} ({d.event_id}).")


def events(
    type_: Annotated[
        list[str] | None, typer.Option("--type", help="Only this type (repeat it).", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.", min=1, max=10_000)] = 50,
    url: UrlOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The tenant's events of the last 30 days, newest first."""
    with connect(url, key, as_json) as client:
        found = []
        for e in client.iter_events(types=type_ or []):
            found.append(e)
            if len(found) >= limit:
                break
    if as_json:
        print_json(found)
        return
    show(table(None, ["at", "type", "id"], [(when(e.created_at), e.type, e.id) for e in found]))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="webhooks")
    root.command()(events)
