"""API tokens: issue, list, revoke, and find the one a secret belongs to."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import Enum

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from stortune.server.api.label_selector import parse_text
from stortune.server.auth import Principal, Role, new_secret, new_token_id, secret_hash
from stortune.server.db.tables import ApiToken
from stortune.server.errors import NotFound
from stortune.server.models.tokens import TokenCreate
from stortune.server.services.versions import next_resource_version

KIND = "ApiToken"
#: last_used_at is written when it is at least this old: a fleet of agents sharing the
#: bootstrap token costs one write a minute, not one per heartbeat.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def issue(session: Session, request: TokenCreate, *, created_by: str, now: datetime,
          commit: bool = True) -> tuple[ApiToken, str]:
    """Store a new token; returns the row and the secret, which exists nowhere else afterwards.

    ``commit=False`` leaves the row pending in the caller's transaction (the first
    start writes the secret to its file before committing).
    """
    # The counter first, as every write does (services/__init__.py), so writers lock in one order.
    next_resource_version(session)
    secret = new_secret()
    lifetime = request.lifetime()
    row = ApiToken(
        id=new_token_id(), secret_hash=secret_hash(secret), name=request.name or request.role.value,
        description=request.description, role=request.role.value, host_selector=request.hostSelector,
        created_at=now, created_by=created_by, expires_at=now + lifetime if lifetime else None,
        last_used_at=None, revoked_at=None, revoked_by=None,
    )
    session.add(row)
    if commit:
        session.commit()
    return row, secret


def list_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.created_at.desc(), ApiToken.id)).all()


def get(session: Session, token_id: str) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(KIND, token_id)
    return row


def revoke(session: Session, token_id: str, *, by: str, now: datetime) -> ApiToken:
    """Revoke for good; revoking a revoked token changes nothing."""
    next_resource_version(session)
    row = get(session, token_id)
    if row.revoked_at is None:
        row.revoked_at = now
        row.revoked_by = by
        session.commit()
    else:
        session.rollback()
    return row


class Refusal(Enum):
    UNKNOWN = "unknown token"
    REVOKED = "the token was revoked"
    EXPIRED = "the token has expired"


def find(session: Session, digest: str, now: datetime) -> Principal | Refusal:
    """The principal the secret with this hash stands for, or why it is refused; notes the use."""
    row = session.scalars(select(ApiToken).where(ApiToken.secret_hash == digest)).first()
    if row is None:
        session.rollback()
        return Refusal.UNKNOWN
    principal, revoked, last_used = principal_of(row), row.revoked_at, row.last_used_at
    session.rollback()  # end the read before any write (SQLite locks in one order: see db/engine.py)
    if revoked is not None:
        return Refusal.REVOKED
    if principal.expires_at is not None and principal.expires_at <= now:
        return Refusal.EXPIRED
    if last_used is None or last_used <= now - LAST_USED_RESOLUTION:
        session.execute(update(ApiToken).where(ApiToken.id == principal.token_id)
                        .values(last_used_at=now).execution_options(synchronize_session=False))
        session.commit()
    return principal


def principal_of(row: ApiToken) -> Principal:
    return Principal(token_id=row.id, name=row.name, role=Role(row.role),
                     hosts=parse_text(row.host_selector) if row.host_selector else None,
                     expires_at=row.expires_at)


def has_active(session: Session, role: Role, now: datetime) -> bool:
    found = session.scalars(select(ApiToken.id).where(
        ApiToken.role == role.value, ApiToken.revoked_at.is_(None),
        or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now)).limit(1)).first()
    return found is not None
