"""The error body of every failed request, after the Kubernetes Status object."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from stortune.server.models.common import API_VERSION


class StatusCause(BaseModel):
    field: str = Field(description="Path inside the document, e.g. spec.rules[0].settings.read_ahead_kb")
    message: str
    reason: str = "FieldValueInvalid"


class StatusDetails(BaseModel):
    name: str | None = None
    kind: str | None = None
    causes: list[StatusCause] = Field(default_factory=list)


class Status(BaseModel):
    apiVersion: str = API_VERSION
    kind: Literal["Status"] = "Status"
    status: Literal["Failure"] = "Failure"
    message: str
    reason: str
    code: int
    details: StatusDetails = Field(default_factory=StatusDetails)
