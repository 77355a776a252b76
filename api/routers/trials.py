"""Free-trial applications, open to anyone (no key): validated, bounded and rate-limited per address."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.deps import DbDep, trial_rate
from api.schemas import TrialApplicationCreate, TrialReceipt
from scheduler.services.tenancy import trials as trial_service

router = APIRouter(prefix="/api/v1", tags=["trials"])


@router.post(
    "/trials",
    status_code=201,
    response_model=TrialReceipt,
    summary="Apply for a free trial (no key needed; an admin reviews it)",
    dependencies=[Depends(trial_rate)],
)
def apply_for_trial(body: TrialApplicationCreate, db: DbDep) -> TrialReceipt:
    with db.write() as s:
        application = trial_service.submit_application(
            session=s,
            name=body.name,
            email=body.email,
            organisation=body.organisation,
            category=body.category,
            intended_use=body.intended_use,
        )
        return TrialReceipt.of(application)
