"""A member's e-mail choices: `GET/PUT /api/v1/notification-settings` (scheduler/services/tenancy/mail.py,
docs/notifications.md). Each key reads and changes its own member's; a key with no member (an admin's)
has none."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import DbDep, Reader, Submitter
from api.schemas.notifications import NotificationSettingsChange, NotificationSettingsOut
from scheduler.services.tenancy import mail

router = APIRouter(prefix="/api/v1", tags=["webhooks"])


@router.get(
    "/notification-settings",
    response_model=NotificationSettingsOut,
    summary="Your e-mail choices",
    description="Which job events, budget thresholds, trial and session news are mailed to the member "
    "this key belongs to.",
)
def get_notification_settings(principal: Reader, db: DbDep) -> NotificationSettingsOut:
    with db.read() as s:
        return NotificationSettingsOut.model_validate(mail.get_settings(session=s, principal=principal))


@router.put(
    "/notification-settings",
    response_model=NotificationSettingsOut,
    summary="Change your e-mail choices",
    description="A field left out keeps its value. Budget thresholds: at most 10, each 1 to 100 (% of the "
    "grant); each fires once per grant and again after an admin changes the grant.",
)
def put_notification_settings(
    body: NotificationSettingsChange, principal: Submitter, db: DbDep
) -> NotificationSettingsOut:
    with db.write() as s:
        view = mail.put_settings(session=s, principal=principal, changes=body.model_dump(exclude_unset=True))
        return NotificationSettingsOut.model_validate(view)
