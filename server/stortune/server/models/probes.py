"""API views of probes."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stortune.schemas.analysis.probe import ProbeResult
from stortune.server.db.tables import Probe
from stortune.server.models.common import API_VERSION


class ProbeRequest(BaseModel):
    """What a caller may ask: consent and a device name. Nothing else reaches fio."""

    model_config = ConfigDict(extra="forbid")

    consent: bool = Field(default=False, description="Must be true: a probe loads the host's disks")
    device: str | None = Field(default=None, max_length=128,
                               description="A block device of the host (md126, sdb, dm-3); none: every disk")


class ProbeView(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["Probe"] = "Probe"
    id: str
    host: str
    device: str | None
    state: str
    message: str
    requestedBy: str
    createdAt: datetime
    finishedAt: datetime | None
    result: ProbeResult | None = None

    @classmethod
    def from_row(cls, row: Probe, *, with_result: bool = True) -> ProbeView:
        result = None
        if with_result and row.result is not None:
            try:
                result = ProbeResult.model_validate(row.result)
            except ValidationError:
                result = None  # an older agent's result that no longer validates: shown without it
        return cls(id=row.id, host=row.host, device=row.device, state=row.state, message=row.message,
                   requestedBy=row.requested_by, createdAt=row.created_at, finishedAt=row.finished_at,
                   result=result)


class ProbeList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["ProbeList"] = "ProbeList"
    items: list[ProbeView]
