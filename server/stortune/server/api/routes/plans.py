"""/api/v1/plans: what hosts would do after a set of profile changes made at once."""

from __future__ import annotations

from fastapi import APIRouter

from stortune.server.api.bodies import OffLoopBodyRoute
from stortune.server.api.deps import SessionDep, SettingsDep
from stortune.server.api.openapi import TOO_MANY
from stortune.server.api.routes.profiles import DryRunQuota, Writer
from stortune.server.models.profiles import HostPlan, PlanRequest, PlanResult
from stortune.server.services import profiles

router = APIRouter(route_class=OffLoopBodyRoute, prefix="/plans", tags=["profiles"])


@router.post("", responses=TOO_MANY)
def plan_profiles(
    *, who: Writer, quota: DryRunQuota, body: PlanRequest, session: SessionDep, settings: SettingsDep,
) -> PlanResult:
    """A dry run of several documents at once: ``profiles`` as they would be created or replaced,
    ``delete`` as they would be deleted. Profiles that change together are planned with each
    other's new versions (one removing a setting that another now sets is no restoration), which
    per-document dry runs cannot show. Stores nothing; needs the right to write profiles."""
    quota.spend()
    plans = profiles.preview_set(session, body.profiles, body.delete,
                                 ram_share=settings.stripe_cache_ram_share)
    return PlanResult(plans={host: HostPlan.of(plan) for host, plan in plans.items()})
