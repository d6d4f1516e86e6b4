"""The dashboard's session as the API shows it: who signed in, until when, and the CSRF token."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from stortune.server.auth import ROLE_PERMISSIONS, Principal
from stortune.server.models.common import API_VERSION


class SessionToken(BaseModel):
    """The token the session stands for (never its secret)."""

    id: str
    name: str
    role: str
    hostSelector: dict[str, Any] | None = Field(default=None,
                                                description="Support tokens: the hosts they see")


class SessionView(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["Session"] = "Session"
    token: SessionToken
    cookie: bool = Field(description="Authenticated by the session cookie (false: by a bearer header)")
    expiresAt: datetime | None = Field(
        default=None, description="When the session (or, without one, the token) stops being accepted")
    csrfToken: str | None = Field(
        default=None, description="Send it as X-CSRF-Token on every call but GET/HEAD/OPTIONS made with "
        "the cookie; only in answers to calls made with the cookie or that made it")
    permissions: list[str] = Field(
        description="What the token's role may do (the dashboard shows only the buttons it may press)")

    @classmethod
    def of(cls, principal: Principal, *, cookie: bool, csrf: str | None) -> SessionView:
        hosts = principal.hosts
        selector = hosts.model_dump(mode="json", exclude_defaults=True) if hosts is not None else None
        return cls(token=SessionToken(id=principal.token_id, name=principal.name, role=principal.role.value,
                                      hostSelector=selector),
                   cookie=cookie, expiresAt=principal.expires_at, csrfToken=csrf,
                   permissions=sorted(p.value for p in ROLE_PERMISSIONS[principal.role]))
