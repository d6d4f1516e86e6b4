"""Authentication of every /api/ call, before any route runs, and its audit record after.

A middleware rather than a route dependency, so that a caller without a valid
token is refused before the server parses its body or routes its path, and so
that the audit record of a call that fails anywhere (a malformed body
included) still knows who made it. Which role may do what is decided by each
route's declared permission (api/security.py).

Accepted tokens are remembered for ``token_cache_s``: a fleet's heartbeats
share one bootstrap token, and a database read per heartbeat would double
their cost. Expiry is still checked on every call; a revocation through this
server forgets the token at once.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from datetime import datetime, timedelta

import anyio.to_thread
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stortune.server.api import audit
from stortune.server.api.deps import Clock
from stortune.server.api.handlers import error_response
from stortune.server.auth import Principal, redact, secret_hash
from stortune.server.errors import ApiError, Unauthorized, Unavailable
from stortune.server.services import tokens
from stortune.server.services.tokens import Refusal

log = logging.getLogger(__name__)

#: Where the accepted principal waits for the routes (api/security.py).
PRINCIPAL = "stortune.principal"
_MAX_SECRET = 256
_HINT = "send the header 'Authorization: Bearer <token>' (stortune: --token or $STORTUNE_TOKEN)"


def bearer_secret(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized(f"this call needs a token: {_HINT}")
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret or len(secret) > _MAX_SECRET:
        raise Unauthorized(f"the Authorization header is not a bearer token: {_HINT}", invalid_token=True)
    return secret


class Authenticator:
    """Bearer secret -> Principal, with a small cache of accepted tokens."""

    def __init__(self, sessions: sessionmaker[Session], clock: Clock, *, cache_s: float,
                 max_entries: int = 4096) -> None:
        self._sessions = sessions
        self._clock = clock
        self._ttl = timedelta(seconds=cache_s)
        self._max = max_entries
        self._cache: OrderedDict[str, tuple[Principal, datetime]] = OrderedDict()
        self._lock = threading.Lock()

    async def authenticate(self, authorization: str | None) -> Principal:
        digest = secret_hash(bearer_secret(authorization))
        now = self._clock()
        principal = self._cached(digest, now)
        if principal is None:
            found = await anyio.to_thread.run_sync(self._lookup, digest, now)
            if isinstance(found, Refusal):
                raise Unauthorized(f"{found.value}: {_HINT} with a valid token", invalid_token=True)
            principal = found
            self._remember(digest, principal, now)
        if principal.expires_at is not None and principal.expires_at <= now:
            self.forget(principal.token_id)
            raise Unauthorized(f"the token expired at {principal.expires_at.isoformat()}", invalid_token=True)
        return principal

    def forget(self, token_id: str) -> None:
        """Drop a token from the cache (it was revoked)."""
        with self._lock:
            for digest in [d for d, (p, _) in self._cache.items() if p.token_id == token_id]:
                del self._cache[digest]

    def _cached(self, digest: str, now: datetime) -> Principal | None:
        with self._lock:
            entry = self._cache.get(digest)
            if entry is None or not now - entry[1] < self._ttl:
                return None
            return entry[0]

    def _remember(self, digest: str, principal: Principal, now: datetime) -> None:
        if self._ttl <= timedelta(0):
            return
        with self._lock:
            self._cache[digest] = (principal, now)
            self._cache.move_to_end(digest)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)

    def _lookup(self, digest: str, now: datetime) -> Principal | Refusal:
        try:
            with self._sessions() as session:
                return tokens.find(session, digest, now)
        except SQLAlchemyError as exc:
            raise Unavailable(f"cannot check the token: database unavailable ({type(exc).__name__})"
                              ) from None


class AccessControl:
    """ASGI middleware: authenticate calls under ``prefix``, audit the ones audit.wanted() names."""

    def __init__(self, app: ASGIApp, *, authenticator: Authenticator, auditor: audit.Auditor,
                 prefix: str, paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.authenticator = authenticator
        self.auditor = auditor
        self.prefix = prefix.rstrip("/") + "/"
        self.paths = paths  # outside the prefix, yet with a token only (/metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope["path"].startswith(self.prefix)
                                           or scope["path"] in self.paths):
            await self.app(scope, receive, send)
            return
        try:
            principal = await self.authenticator.authenticate(Headers(scope=scope).get("authorization"))
        except ApiError as exc:
            client = scope.get("client")
            log.info("refused %s %s from %s: %s", scope["method"], redact(scope["path"]),
                     client[0] if client else "unknown", exc.message)
            await error_response(exc)(scope, receive, send)
            return
        scope[PRINCIPAL] = principal
        started = False

        async def send_and_audit(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                # Written before the answer leaves: whoever sees the answer can find the record.
                if audit.wanted(scope, message["status"]):
                    await self.auditor.record(scope, principal, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_audit)
        except Exception:
            if not started and audit.wanted(scope, 500):
                await self.auditor.record(scope, principal, 500)
            raise
