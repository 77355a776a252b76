"""Webhooks and events: register receivers, rotate their secrets, test them, read their deliveries,
and the tenant's events of the last 30 days (scheduler/services/tenancy/notifications.py,
docs/notifications.md).

Owners manage a tenant's webhooks; members read them. A webhook or event of another tenant is a 404.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response

from api.deps import DbDep, Reader, SettingsDep, Submitter
from api.schemas import CursorParam, IntCursorParam, Page, decode_cursor, decode_int_cursor, encode_cursor
from api.schemas.notifications import (
    DeliveryOut,
    EventOut,
    EventType,
    RotateSecret,
    WebhookChange,
    WebhookCreate,
    WebhookCreated,
    WebhookOut,
    WebhookTest,
)
from scheduler.services.tenancy import notifications, webhooks

router = APIRouter(prefix="/api/v1", tags=["webhooks"])

WebhookId = Annotated[str, Path(min_length=1, max_length=40)]
DeliveryId = Annotated[int, Path(ge=1, le=2**62)]


@router.post(
    "/webhooks",
    status_code=201,
    response_model=WebhookCreated,
    summary="Register a webhook (owners; its secret is shown once)",
    description="Events are POSTed signed to the Standard Webhooks specification (`webhook-id`, "
    "`webhook-timestamp`, `webhook-signature`). A URL that is not http(s), is too long, or resolves to a "
    "loopback, private or link-local address is a 422 naming `url`; past the plan's limit, a 409.",
)
def create_webhook(
    body: WebhookCreate, principal: Submitter, db: DbDep, settings: SettingsDep, response: Response
) -> WebhookCreated:
    with db.write() as s:
        row, secret = webhooks.create_webhook(
            session=s,
            principal=principal,
            url=body.url,
            events=list(body.events),
            description=body.description,
            allow_private=settings.webhook_allow_private,
        )
        out = WebhookCreated.created(row, secret)
    response.headers["Location"] = f"/api/v1/webhooks/{out.id}"
    return out


@router.get("/webhooks", response_model=Page[WebhookOut], summary="The tenant's webhooks")
def list_webhooks(
    principal: Reader,
    db: DbDep,
    cursor: CursorParam = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> Page[WebhookOut]:
    with db.read() as s:
        rows = webhooks.list_webhooks(
            session=s, scope=principal.scope, after=decode_cursor(cursor), limit=limit + 1
        )
        items = [WebhookOut.of(r) for r in rows[:limit]]
    return Page[WebhookOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


@router.get("/webhooks/{webhook_id}", response_model=WebhookOut, summary="A webhook (never its secret)")
def get_webhook(webhook_id: WebhookId, principal: Reader, db: DbDep) -> WebhookOut:
    with db.read() as s:
        return WebhookOut.of(webhooks.get_webhook(session=s, scope=principal.scope, webhook_id=webhook_id))


@router.patch(
    "/webhooks/{webhook_id}",
    response_model=WebhookOut,
    summary="Change a webhook's URL, events, description, or enable or pause it (owners)",
)
def change_webhook(
    webhook_id: WebhookId, body: WebhookChange, principal: Submitter, db: DbDep, settings: SettingsDep
) -> WebhookOut:
    with db.write() as s:
        row = webhooks.update_webhook(
            session=s,
            principal=principal,
            webhook_id=webhook_id,
            changes=body.model_dump(exclude_unset=True),
            allow_private=settings.webhook_allow_private,
        )
        return WebhookOut.of(row)


@router.delete(
    "/webhooks/{webhook_id}",
    response_model=WebhookOut,
    summary="Remove a webhook and its deliveries (owners)",
)
def delete_webhook(webhook_id: WebhookId, principal: Submitter, db: DbDep) -> WebhookOut:
    with db.write() as s:
        return WebhookOut.of(webhooks.delete_webhook(session=s, principal=principal, webhook_id=webhook_id))


@router.post(
    "/webhooks/{webhook_id}/rotate-secret",
    response_model=WebhookCreated,
    summary="Give a webhook a new secret (owners; shown once)",
    description="The old secret keeps signing beside the new one for `overlap_s` (default a day): each "
    "delivery then carries both signatures, so a receiver may switch at its own pace.",
)
def rotate_secret(
    webhook_id: WebhookId, principal: Submitter, db: DbDep, body: RotateSecret | None = None
) -> WebhookCreated:
    overlap = (body or RotateSecret()).overlap_s
    with db.write() as s:
        row, secret = webhooks.rotate_secret(
            session=s, principal=principal, webhook_id=webhook_id, overlap_s=overlap
        )
        return WebhookCreated.created(row, secret)


@router.post(
    "/webhooks/{webhook_id}/test",
    response_model=WebhookTest,
    summary="Send a signed webhook.ping now and say what the receiver answered (owners)",
)
def test_webhook(
    webhook_id: WebhookId, principal: Submitter, db: DbDep, settings: SettingsDep
) -> WebhookTest:
    ping = webhooks.send_ping(db=db, principal=principal, webhook_id=webhook_id, settings=settings)
    outcome, msg_id = ping.outcome, ping.msg_id
    return WebhookTest(
        ok=outcome.ok,
        status=outcome.status,
        latency_ms=outcome.latency_ms,
        body_excerpt=outcome.excerpt,
        error=outcome.error,
        webhook_id_header=msg_id,
    )


@router.get(
    "/webhooks/{webhook_id}/deliveries",
    response_model=Page[DeliveryOut],
    summary="A webhook's deliveries, newest first",
)
def list_deliveries(
    webhook_id: WebhookId,
    principal: Reader,
    db: DbDep,
    cursor: IntCursorParam = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    status: Literal["pending", "succeeded", "failed"] | None = None,
) -> Page[DeliveryOut]:
    with db.read() as s:
        rows = webhooks.list_deliveries(
            session=s,
            scope=principal.scope,
            webhook_id=webhook_id,
            status=status,
            before=decode_int_cursor(cursor),
            limit=limit + 1,
        )
        items = [DeliveryOut.of(r) for r in rows[:limit]]
    return Page[DeliveryOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
    )


@router.post(
    "/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver",
    status_code=202,
    response_model=DeliveryOut,
    summary="Send a delivery's event again (owners), with the same webhook-id",
)
def redeliver(webhook_id: WebhookId, delivery_id: DeliveryId, principal: Submitter, db: DbDep) -> DeliveryOut:
    with db.write() as s:
        row = webhooks.redeliver(
            session=s, principal=principal, webhook_id=webhook_id, delivery_id=delivery_id
        )
        return DeliveryOut.of(row)


@router.get("/events", response_model=Page[EventOut], summary="The tenant's events of the last 30 days")
def list_events(
    principal: Reader,
    db: DbDep,
    cursor: IntCursorParam = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    type: Annotated[list[EventType] | None, Query(max_length=20)] = None,
) -> Page[EventOut]:
    with db.read() as s:
        rows = notifications.list_events(
            session=s,
            scope=principal.scope,
            before=decode_int_cursor(cursor),
            limit=limit + 1,
            types=list(type or ()),
        )
        items = [EventOut.of(r) for r in rows[:limit]]
    return Page[EventOut](
        items=items, next_cursor=encode_cursor(rows[limit - 1].seq) if len(rows) > limit else None
    )
