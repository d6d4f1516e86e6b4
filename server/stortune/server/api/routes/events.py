"""/api/v1/events: what happened, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from stortune.schemas.profile import NAME_PATTERN
from stortune.server.api.deps import SessionDep
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.models.events import EventList, EventView
from stortune.server.services import events, hosts

router = APIRouter(prefix="/events", tags=["events"])

Reader = Annotated[Principal, Authorized(Permission.READ_EVENTS)]


@router.get("")
def list_events(
    who: Reader,
    session: SessionDep,
    host: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    profile: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventList:
    """A support token sees the events of the hosts its selector matches, and no others."""
    visible = hosts.select_names(session, who.hosts) if who.hosts is not None else None
    if visible is not None and host is not None and host not in visible:
        return EventList(items=[])  # as for a host that does not exist
    rows = events.list_events(session, host=host, profile=profile, limit=limit, hosts=visible)
    return EventList(items=[EventView.from_row(r) for r in rows])
