"""/api/v1/fleet/summary: how many hosts stand how, for dashboards and alert triage.

    GET /api/v1/fleet/summary?labelSelector=role=db&condition=Ready=False

Counts of each condition's status over the hosts the filters select (and the caller may
see: a support token counts its hosts only), from the fleet's in-memory index: one
counter read while nothing changed, never a read of every host's status.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from stortune.server.api import label_selector
from stortune.server.api.rendered import respond
from stortune.server.api.routes.hosts import ConditionQuery, Reader, Selector
from stortune.server.models.meta import ListMeta, format_resource_version
from stortune.server.services import host_pages
from stortune.server.services.fleet_state import FleetState
from stortune.server.services.hosts import APPLIED, DRIFTED, REACHABLE, READY
from stortune.server.services.versions import current_resource_version

router = APIRouter(prefix="/fleet", tags=["hosts"])

#: The conditions the reconciler sets on every host, counted in this order.
COUNTED = (READY, REACHABLE, APPLIED, DRIFTED)


class FleetSummary(BaseModel):
    apiVersion: Literal["stortune/v1"] = "stortune/v1"
    kind: Literal["FleetSummary"] = "FleetSummary"
    metadata: ListMeta
    hosts: int = Field(description="Hosts the filters select")
    conditions: dict[str, dict[str, int]] = Field(
        description="Condition type -> status (True, False, Unknown) -> hosts; a host without the"
                    " condition yet counts as Unknown")
    appliedGenerations: dict[str, dict[str, int]] = Field(
        description="Profile -> generation -> hosts whose agent last applied that generation (with"
                    " ?condition=Ready=True: the hosts a rollout has reached)")


@router.get("/summary", response_model=FleetSummary)
async def fleet_summary(who: Reader, request: Request, selector: Selector = None,
                        conditions: ConditionQuery = None) -> Response:
    """How many hosts the filters select, and how many have each status of each condition."""
    parsed = label_selector.parse(selector)
    wanted = host_pages.parse_conditions(conditions)

    def render(session: Session) -> bytes:
        version = current_resource_version(session)
        fleet: FleetState = request.app.state.fleet
        fleet.refresh()
        records, everyone = fleet.snapshot()
        names = host_pages.matching(records, everyone, selector=parsed, conditions=wanted,
                                    visible=who.may_see_host)
        summary = FleetSummary(metadata=ListMeta(resourceVersion=format_resource_version(version)),
                               hosts=len(names),
                               conditions=host_pages.count_conditions(records, names, COUNTED),
                               appliedGenerations=host_pages.count_applied(records, names))
        return summary.model_dump_json(by_alias=True).encode()

    scope = who.hosts.model_dump_json() if who.hosts is not None else ""
    return await respond(request, ("fleet-summary", selector or "", scope, wanted), render)
