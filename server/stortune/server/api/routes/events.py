"""/api/v1/events: what happened, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from stortune.server.api.deps import SessionDep
from stortune.server.models.common import NAME_PATTERN
from stortune.server.models.events import EventList, EventView
from stortune.server.services import events

router = APIRouter(prefix="/events", tags=["events"])


@router.get("")
def list_events(
    session: SessionDep,
    host: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    profile: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=253)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> EventList:
    rows = events.list_events(session, host=host, profile=profile, limit=limit)
    return EventList(items=[EventView.from_row(r) for r in rows])
