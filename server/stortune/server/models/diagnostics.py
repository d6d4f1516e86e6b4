"""API views of the redaction mapping (admins only)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from stortune.server.db.tables import Redaction
from stortune.server.models.common import API_VERSION


class RedactionView(BaseModel):
    token: str
    kind: str
    value: str
    host: str
    createdAt: datetime

    @classmethod
    def from_row(cls, row: Redaction) -> RedactionView:
        return cls(token=row.token, kind=row.kind, value=row.value, host=row.host, createdAt=row.created_at)


class RedactionList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["RedactionList"] = "RedactionList"
    items: list[RedactionView]
