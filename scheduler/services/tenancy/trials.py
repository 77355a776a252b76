"""Free-trial applications: anyone may apply; an admin approves (a tenant is born) or rejects.

An application is open to the internet, so everything here assumes hostile input that the API has
already bounded in size: categories are checked, e-mail addresses compared case-insensitively, and
one address holds at most one pending application (a partial unique index makes that hold even for
two submissions racing each other) and gets at most one approved trial.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.errors import Conflict, InvalidRequest, NotFound
from scheduler.ids import new_id
from scheduler.models import Plan, TrialApplication, utcnow
from scheduler.services.tenancy import claims, mail, notifications, tenants
from scheduler.services.tenancy.tenants import TRIAL_PLAN_BY_CATEGORY, CreatedTenant

CATEGORIES = tuple(TRIAL_PLAN_BY_CATEGORY)
STATUSES = ("pending", "approved", "rejected")
MAX_REASON = 1000


# Only ASCII blanks are trimmed: the API's patterns already refuse leading and trailing ones, so what
# it accepts is never trimmed to nothing here.
_BLANKS = " \t\r\n"


def _normalise_email(email: str) -> str:
    return email.strip(_BLANKS).lower()


def submit_application(
    *,
    session: Session,
    name: str,
    email: str,
    organisation: str,
    category: str,
    intended_use: str,
) -> TrialApplication:
    """Record a pending application. 409 if the address has one pending or already had a trial."""
    if category not in CATEGORIES:
        raise InvalidRequest(f"category must be one of {list(CATEGORIES)}.", field="category")
    email = _normalise_email(email)
    name, organisation, intended_use = (v.strip(_BLANKS) for v in (name, organisation, intended_use))
    if not name or not organisation or not intended_use:
        raise InvalidRequest("name, organisation and intended_use must not be blank.")
    previous = session.execute(
        select(TrialApplication.status).where(
            TrialApplication.email == email, TrialApplication.status.in_(("pending", "approved"))
        )
    ).scalars()
    states = set(previous)
    if "pending" in states:
        raise Conflict("An application from this address is already waiting for review.")
    if "approved" in states:
        raise Conflict("This address already had a free trial; contact us to extend it.")
    application = TrialApplication(
        id=new_id("app"),
        name=name,
        email=email,
        organisation=organisation,
        category=category,
        intended_use=intended_use,
        status="pending",
        created_at=utcnow(),
    )
    session.add(application)
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        # The partial unique index: another submission from this address committed first.
        raise Conflict("An application from this address is already waiting for review.")
    return application


def list_applications(
    *, session: Session, status: str | None, after: str | None, limit: int
) -> list[TrialApplication]:
    """Applications in order of arrival (a review queue); `after` is the last id of the previous page."""
    if status is not None and status not in STATUSES:
        raise InvalidRequest(f"status must be one of {list(STATUSES)}.", field="status")
    stmt = select(TrialApplication).order_by(TrialApplication.id).limit(limit)
    if status is not None:
        stmt = stmt.where(TrialApplication.status == status)
    if after is not None:
        stmt = stmt.where(TrialApplication.id > after)
    return list(session.execute(stmt).scalars())


def get_application(*, session: Session, application_id: str) -> TrialApplication:
    application = session.get(TrialApplication, application_id)
    if application is None:
        raise NotFound(f"No trial application {application_id}.")
    return application


def _lock_pending(session: Session, application_id: str, verb: str) -> TrialApplication:
    # FOR UPDATE: two admins deciding at once are serialised, and the second sees the first's decision.
    application = session.execute(
        select(TrialApplication)
        .where(TrialApplication.id == application_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if application is None:
        raise NotFound(f"No trial application {application_id}.")
    if application.status != "pending":
        raise Conflict(
            f"Application {application_id} was already {application.status}; it cannot be {verb}.",
            current_status=application.status,
        )
    return application


def approve(
    *,
    session: Session,
    secret: bytes,
    application_id: str,
    plan: str | None = None,
    decided_by: str | None = None,
    link_base: str | None = None,
    hand_over_key: bool = False,
) -> tuple[TrialApplication, CreatedTenant]:
    """Create the applicant's tenant on its category's trial plan (or `plan`), owned by the applicant.

    By default no key is minted here: with `link_base` (where the dashboard is reached) the applicant
    is mailed, in this transaction, a single-use claim link that mints the tenant's first key, shows
    it once and signs them in, so only the applicant ever sees it. (Without `link_base` the tenant has
    no key until an admin makes one.)

    With `hand_over_key` (mail cannot reach the applicant) the first key is minted now and returned
    in the CreatedTenant, shown once to the admin, who hands it over; then no claim link exists, so
    no second key can appear unseen, and the applicant's mail says the key comes from the admin.
    """
    application = _lock_pending(session, application_id, "approved")
    plan_name = plan or TRIAL_PLAN_BY_CATEGORY[application.category]
    if session.get(Plan, plan_name) is None:
        raise InvalidRequest(
            f"No plan named {plan_name!r}; GET /api/v1/admin/plans lists them.", field="plan"
        )
    wanted = application.name if application.category == "individual" else application.organisation
    created = tenants.create_tenant(
        session=session,
        secret=secret,
        name=tenants.unique_tenant_name(session=session, wanted=wanted),
        plan=plan_name,
        owner_email=application.email,
        owner_name=application.name,
        category=application.category,
        organisation=application.organisation,
        with_key=hand_over_key,
    )
    application.status = "approved"
    application.tenant_id = created.tenant.id
    application.plan = plan_name
    application.decided_at = utcnow()
    application.decided_by = decided_by
    notifications.emit(
        session,
        tenant_id=created.tenant.id,
        type_="trial.approved",
        key=application.id,
        data={
            "tenant_id": created.tenant.id,
            "plan": plan_name,
            "expires_at": created.tenant.expires_at.isoformat() if created.tenant.expires_at else None,
            "url": "/api/v1/usage",
        },
    )
    session.flush()
    if link_base is not None:
        expires = created.tenant.expires_at
        granted = (
            f"your trial is approved: the tenant {created.tenant.name} on the {plan_name} plan, with "
            f"{created.tenant.quota_ipu_ms / 3_600_000:g} IPU-hours"
            + (f", until {expires:%Y-%m-%d %H:%M} UTC." if expires else ".")
        )
        if hand_over_key:
            paragraphs = [
                f"Hello {application.name},",
                granted,
                "Your API key was given to the administrator who approved your trial, who will hand it "
                "over to you directly; this message carries no key and no link to one.",
            ]
            link = None
        else:
            token = claims.create(
                session=session,
                application_id=application.id,
                tenant_id=created.tenant.id,
                member_id=created.owner_id,
            )
            paragraphs = [
                f"Hello {application.name},",
                granted,
                "The link below shows your API key once and signs you in to the dashboard. "
                f"It works once, within {int(claims.CLAIM_TTL.total_seconds() // 3600)} hours; "
                "keep the key somewhere safe.",
            ]
            link = ("Get your API key", f"{link_base}/claim/{token}")
        mail.enqueue(
            session,
            key=f"claim:{application.id}",
            kind="trial.approved",
            to_addr=application.email,
            to_name=application.name,
            body=mail.Body("Your ipucloud trial is approved", paragraphs, link),
            link_base=link_base,
            tenant_id=created.tenant.id,
            sensitive=not hand_over_key,
        )
    return application, created


def reject(
    *,
    session: Session,
    application_id: str,
    reason: str,
    decided_by: str | None = None,
    link_base: str | None = None,
) -> TrialApplication:
    """Reject with a reason the applicant is told: mailed, in this transaction, when `link_base` is given."""
    reason = reason.strip(_BLANKS)
    if not reason:
        raise InvalidRequest("A rejection needs a reason.", field="reason")
    if len(reason) > MAX_REASON:
        raise InvalidRequest(f"The reason is longer than {MAX_REASON} characters.", field="reason")
    application = _lock_pending(session, application_id, "rejected")
    application.status = "rejected"
    application.reason = reason
    application.decided_at = utcnow()
    application.decided_by = decided_by
    session.flush()
    if link_base is not None:
        mail.enqueue(
            session,
            key=f"rejected:{application.id}",
            kind="trial.rejected",
            to_addr=application.email,
            to_name=application.name,
            body=mail.Body(
                "Your ipucloud trial application",
                [
                    f"Hello {application.name},",
                    "thank you for applying for a free trial. We cannot offer you one at this time.",
                    f"The reason: {reason}",
                ],
            ),
            link_base=link_base,
        )
    return application
