"""The audit log: one row per audited call, never the secret or the Authorization header."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.server.auth import Principal, redact
from stortune.server.db.tables import AuditRecord

_PATH_MAX = 2048


@dataclass(frozen=True)
class Call:
    """What the access layer knows about a call once its answer starts."""

    principal: Principal
    method: str
    path: str  # with the query string
    resource: str
    code: int
    client: str


def record(session: Session, call: Call, now: datetime) -> None:
    """Append one row in its own transaction.

    Its single INSERT is the transaction's first statement, so it waits for
    SQLite's write lock under the busy timeout like every other write, and it
    does not bump resourceVersion: the log is not an API object.
    """
    who = call.principal
    session.add(AuditRecord(
        at=now, token_id=who.token_id, token_name=who.name, role=who.role.value,
        method=call.method[:16], path=redact(call.path)[:_PATH_MAX],
        resource=redact(call.resource)[:_PATH_MAX], code=call.code, client=call.client[:64],
    ))
    session.commit()


def list_records(
    session: Session, *, token: str | None = None, method: str | None = None,
    resource: str | None = None, since: datetime | None = None, limit: int = 100,
) -> Sequence[AuditRecord]:
    """Newest first. ``resource`` matches itself and what lies below it (profiles matches
    profiles/x)."""
    stmt = select(AuditRecord)
    if token is not None:
        stmt = stmt.where(AuditRecord.token_id == token)
    if method is not None:
        stmt = stmt.where(AuditRecord.method == method.upper())
    if resource is not None:
        stmt = stmt.where((AuditRecord.resource == resource)
                          | AuditRecord.resource.startswith(resource.rstrip("/") + "/", autoescape=True))
    if since is not None:
        stmt = stmt.where(AuditRecord.at >= since)
    return session.scalars(stmt.order_by(AuditRecord.at.desc(), AuditRecord.id.desc()).limit(limit)).all()
