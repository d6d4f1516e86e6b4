"""/api/v1/audit: who did what, when, from where (admin)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from stortune.server.api.deps import SessionDep
from stortune.server.api.params import DateTime
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.models.audit import AuditList, AuditView
from stortune.server.services import audit

router = APIRouter(prefix="/audit", tags=["audit"])

Auditor = Annotated[Principal, Authorized(Permission.READ_AUDIT)]


@router.get("")
def list_audit(
    *,
    who: Auditor,
    session: SessionDep,
    token: Annotated[str | None, Query(pattern=r"^[0-9a-f]{12}$", description="A token id")] = None,
    method: Annotated[Literal["GET", "POST", "PUT", "PATCH", "DELETE"] | None, Query()] = None,
    resource: Annotated[str | None, Query(max_length=512, pattern=r"^[^\x00]*$",
                                          description="e.g. profiles, or profiles/NAME")] = None,
    since: Annotated[DateTime | None, Query(
        description="RFC 3339 date-time, e.g. 2025-03-01T12:00:00Z (no zone: UTC)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> AuditList:
    """Newest first: every mutating call and every diagnostics download, whatever its outcome."""
    rows = audit.list_records(session, token=token, method=method, resource=resource, since=since,
                              limit=limit)
    return AuditList(items=[AuditView.from_row(r) for r in rows])
