"""Events as the API lists them, after Kubernetes core/v1 Event."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from stortune.server.db.tables import Event
from stortune.server.models.common import API_VERSION


class InvolvedObject(BaseModel):
    kind: str
    name: str


class EventView(BaseModel):
    id: int
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    host: str | None = None
    profile: str | None = None
    involvedObject: InvolvedObject
    firstTimestamp: datetime
    lastTimestamp: datetime
    count: int

    @classmethod
    def from_row(cls, row: Event) -> EventView:
        return cls(
            id=row.id, type=row.type,
            reason=row.reason, message=row.message, host=row.host, profile=row.profile,
            involvedObject=InvolvedObject(kind=row.involved_kind, name=row.involved_name),
            firstTimestamp=row.first_timestamp, lastTimestamp=row.last_timestamp, count=row.count,
        )


class EventList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["EventList"] = "EventList"
    items: list[EventView]
