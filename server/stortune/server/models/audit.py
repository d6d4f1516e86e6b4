"""The audit log as admins read it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from stortune.server.db.tables import AuditRecord
from stortune.server.models.common import API_VERSION


class AuditView(BaseModel):
    id: int
    time: datetime
    tokenId: str
    tokenName: str
    role: str
    method: str
    path: str = Field(description="With the query string")
    resource: str = Field(description="What the call was about, e.g. profiles/vod-streamer")
    code: int = Field(description="The HTTP status of the answer")
    client: str = Field(description="The peer address (proxy headers are not trusted)")

    @classmethod
    def from_row(cls, row: AuditRecord) -> AuditView:
        return cls(id=row.id, time=row.at, tokenId=row.token_id, tokenName=row.token_name, role=row.role,
                   method=row.method, path=row.path, resource=row.resource, code=row.code,
                   client=row.client)


class AuditList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["AuditRecordList"] = "AuditRecordList"
    items: list[AuditView]
