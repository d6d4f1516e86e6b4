"""Dashboard sessions: a cookie secret exchanged for a bearer token, looked up with its token.

A session stands for the token that signed in; it never outlives it. Its row keeps the
SHA-256 of the cookie's secret (as ``api_tokens`` keeps the token's) and the token's id,
so every look-up reads the token again: revoking or expiring a token ends its sessions
without touching them. The CSRF token of a session is derived from the cookie's secret,
so it needs no column and cannot be learnt from the database.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from stortune.server.auth import Principal, secret_hash
from stortune.server.db.tables import ApiToken, UiSession
from stortune.server.services.tokens import Refusal, principal_of

#: Cookie secrets are marked like token secrets, so log redaction and scanners know them.
SESSION_PREFIX = "sts_"
_SECRET_BYTES = 32
_CSRF_CONTEXT = b"stortune csrf v1:"


def new_secret() -> str:
    return SESSION_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def csrf_token(secret: str) -> str:
    """The session's CSRF token: a page that can read it is a page of this origin."""
    return hashlib.sha256(_CSRF_CONTEXT + secret.encode("utf-8", "surrogatepass")).hexdigest()


def csrf_matches(secret: str, offered: str | None) -> bool:
    return offered is not None and hmac.compare_digest(csrf_token(secret), offered)


def start(session: Session, principal: Principal, *, now: datetime, ttl: timedelta,
          replacing: str | None = None) -> tuple[str, datetime]:
    """A new session for ``principal`` -> (cookie secret, expiry). Always a new secret, never
    the one the browser brought (``replacing``, which ends): no session fixation."""
    expires = now + ttl
    if principal.expires_at is not None:
        expires = min(expires, principal.expires_at)
    secret = new_secret()
    # Housekeeping on the rare write: rows past their expiry are of no use to anyone.
    session.execute(delete(UiSession).where(UiSession.expires_at <= now))
    if replacing is not None:
        session.execute(delete(UiSession).where(UiSession.id == secret_hash(replacing)))
    session.add(UiSession(id=secret_hash(secret), token_id=principal.token_id, created_at=now,
                          expires_at=expires))
    session.commit()
    return secret, expires


def end(session: Session, digest: str) -> bool:
    """Sign out: the row goes; -> whether there was one."""
    gone = session.scalars(delete(UiSession).where(UiSession.id == digest).returning(UiSession.id)).all()
    session.commit()
    return bool(gone)


def find(session: Session, digest: str, now: datetime) -> Principal | Refusal:
    """The principal of the session with this secret hash: its token's, expiring at the
    earlier of the two; or why it is refused."""
    row = session.execute(select(UiSession.expires_at, ApiToken)
                          .join(ApiToken, ApiToken.id == UiSession.token_id)
                          .where(UiSession.id == digest)).first()
    if row is None:
        session.rollback()
        return Refusal.UNKNOWN
    expires, token = row
    principal, revoked = principal_of(token), token.revoked_at
    session.rollback()  # read before this: a rollback expires what the rows hold
    if revoked is not None:
        return Refusal.REVOKED
    if principal.expires_at is not None and principal.expires_at < expires:
        expires = principal.expires_at
    if expires <= now:
        return Refusal.EXPIRED
    return replace(principal, expires_at=expires)
