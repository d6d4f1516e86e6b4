"""/api/v1/raid-plans: compare RAID levels for a set of disks (stortune.schemas.analysis.raid).

Pure arithmetic over the body: nothing is read or stored, so any authenticated caller may ask.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from stortune.schemas.analysis.raid import RaidPlan, RaidPlanRequest, plan_raid
from stortune.server.api.bodies import OffLoopBodyRoute
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal

router = APIRouter(route_class=OffLoopBodyRoute, prefix="/raid-plans", tags=["analysis"])

Planner = Annotated[Principal, Authorized(Permission.PLAN_STORAGE)]


@router.post("")
def plan_raid_levels(who: Planner, body: RaidPlanRequest) -> RaidPlan:
    """Per level: usable capacity, random IOPS = N x per-disk IOPS / (read share + write share x
    write penalty), sequential MB/s, fault tolerance, rebuild time at md's sync limits, IOPS while
    rebuilding, the disks needed to meet ``requirements`` and warnings. A bad input is a 422
    naming the field (``details.causes``)."""
    # A plain def: the "disks needed" search can take milliseconds, kept off the event loop.
    return plan_raid(body)
