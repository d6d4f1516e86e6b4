"""API tokens as the API creates and lists them; the secret appears once, in TokenCreated."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from stortune.server.api.label_selector import parse_text
from stortune.server.auth import SCOPED_ROLES, Role
from stortune.server.db.tables import ApiToken
from stortune.server.models.common import API_VERSION, RequestModel

_DURATION = re.compile(r"^\s*(\d{1,7})\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_LIFETIME = timedelta(days=3650)


def parse_duration(text: str) -> timedelta:
    """'72h', '30m', '7d', '2w', '3600s' or '3600' (seconds) -> timedelta."""
    m = _DURATION.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration like 72h, 30m, 7d, 2w or 3600s")
    lifetime = timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])
    if not timedelta(0) < lifetime <= MAX_LIFETIME:
        raise ValueError(f"{text!r}: a token lives more than 0 seconds and at most 3650 days")
    return lifetime


TokenName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\x00-\x1f\x7f]+$",
                                 description="Who or what holds it, e.g. alice, ci-deploy, vendor-1234")]


class TokenCreate(RequestModel):
    role: Role
    name: TokenName | None = Field(default=None, description="Default: the role")
    description: str = Field(default="", max_length=1024, pattern=r"^[^\x00-\x08\x0b-\x1f\x7f]*$")
    # Validated even when absent (validate_default): whether they are needed depends on the role.
    hostSelector: str | None = Field(
        default=None, max_length=4096, validate_default=True,
        description="support tokens only, required there: the hosts it may see, in labelSelector "
                    "syntax (role=streamer,rack in (a1,a2))")
    expiresIn: str | None = Field(
        default=None, max_length=32, validate_default=True,
        description="e.g. 72h, 30m, 7d; required for support tokens; default: never")

    @field_validator("hostSelector")
    @classmethod
    def _selector(cls, v: str | None, info: ValidationInfo) -> str | None:
        role = info.data.get("role")
        if v is None:
            if role in SCOPED_ROLES:
                raise ValueError(f"a {role} token must name the hosts it may see, e.g. role=streamer")
            return None
        if role is not None and role not in SCOPED_ROLES:
            raise ValueError(f"only {', '.join(sorted(SCOPED_ROLES))} tokens are limited to hosts; "
                             f"a {role} token sees what its role allows")
        parse_text(v)
        return v.strip()

    @field_validator("expiresIn")
    @classmethod
    def _duration(cls, v: str | None, info: ValidationInfo) -> str | None:
        role = info.data.get("role")
        if v is None:
            if role in SCOPED_ROLES:
                raise ValueError(f"a {role} token must expire, e.g. 72h")
            return None
        parse_duration(v)
        return v.strip()

    def lifetime(self) -> timedelta | None:
        return parse_duration(self.expiresIn) if self.expiresIn is not None else None


class TokenView(BaseModel):
    """A token without its secret."""

    id: str
    name: str
    description: str = ""
    role: Role
    hostSelector: str | None = None
    createdAt: datetime
    createdBy: str
    expiresAt: datetime | None = None
    lastUsedAt: datetime | None = Field(default=None, description="Updated about once a minute")
    revokedAt: datetime | None = None
    revokedBy: str | None = None

    @classmethod
    def from_row(cls, row: ApiToken) -> TokenView:
        return cls(id=row.id, name=row.name, description=row.description, role=Role(row.role),
                   hostSelector=row.host_selector, createdAt=row.created_at, createdBy=row.created_by,
                   expiresAt=row.expires_at, lastUsedAt=row.last_used_at, revokedAt=row.revoked_at,
                   revokedBy=row.revoked_by)


class TokenCreated(TokenView):
    token: str = Field(description="The bearer secret. Shown this once: only its hash is stored.")


class TokenList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["ApiTokenList"] = "ApiTokenList"
    items: list[TokenView]
