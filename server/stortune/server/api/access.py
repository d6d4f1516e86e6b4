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

The dashboard signs in once with a bearer token and then holds a session cookie
(api/routes/sessions.py): the same path authenticates it here, as the principal of the
token behind it, so roles, scopes and audit records are the token's. A call with an
``Authorization`` header is judged by that header alone. A call made with the cookie that
could change anything (any method but GET, HEAD, OPTIONS) must also carry the session's
CSRF token in ``X-CSRF-Token`` and come from this origin (``Sec-Fetch-Site`` and ``Origin``
when the browser sends them), or it is 403: the cookie is SameSite=Strict already, and
this holds even where a browser ignores that.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import anyio.to_thread
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stortune.server.api import audit
from stortune.server.api.deps import Clock
from stortune.server.api.handlers import error_response
from stortune.server.api.signins import FailedSignIns
from stortune.server.auth import Principal, redact, secret_hash
from stortune.server.errors import ApiError, Forbidden, TooManyRequests, Unauthorized, Unavailable
from stortune.server.services import tokens, ui_sessions
from stortune.server.services.tokens import Refusal

log = logging.getLogger(__name__)

#: Where the accepted principal waits for the routes (api/security.py).
PRINCIPAL = "stortune.principal"
#: The cookie's secret, when the call was authenticated by a dashboard session.
SESSION = "stortune.session"
SESSION_COOKIE = "stortune_session"
CSRF_HEADER = "x-csrf-token"
#: Methods that change nothing, so a session cookie alone may make them.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SESSION_HINT = "sign in again at /ui/"
_SESSION_REFUSALS = {Refusal.UNKNOWN: "unknown or ended session",
                     Refusal.REVOKED: "the token this session stands for was revoked",
                     Refusal.EXPIRED: "the session, or the token it stands for, has expired"}
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


#: Keeps session digests apart from token digests in the Authenticator's one cache.
_SESSION_KEY = "s:"


def _session_digest(secret: str) -> str:
    return _SESSION_KEY + secret_hash(secret)


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

    def now(self) -> datetime:
        return self._clock()

    @staticmethod
    def digest_of(authorization: str | None, session: str | None) -> str | None:
        """The cache key of a call's credentials (None: it has none that could be valid)."""
        if session is not None:
            return _session_digest(session)
        try:
            return secret_hash(bearer_secret(authorization))
        except Unauthorized:
            return None

    async def authenticate(self, authorization: str | None) -> Principal:
        digest = secret_hash(bearer_secret(authorization))
        return await self._principal(digest, self._lookup, f"{_HINT} with a valid token", "token",
                                     lambda refusal: refusal.value)

    async def authenticate_session(self, secret: str) -> Principal:
        """The principal of a dashboard session cookie: its token's, expiring with the earlier."""
        return await self._principal(_session_digest(secret), self._lookup_session, _SESSION_HINT, "session",
                                     _SESSION_REFUSALS.__getitem__)

    async def _principal(self, digest: str, lookup: Callable[[str, datetime], Principal | Refusal],
                         hint: str, what: str, say: Callable[[Refusal], str]) -> Principal:
        now = self._clock()
        principal = self._cached(digest, now)
        if principal is None:
            found = await anyio.to_thread.run_sync(lookup, digest, now)
            if isinstance(found, Refusal):
                raise Unauthorized(f"{say(found)}: {hint}", invalid_token=True)
            principal = found
            self._remember(digest, principal, now)
        if principal.expires_at is not None and principal.expires_at <= now:
            self.forget(principal.token_id)
            raise Unauthorized(f"the {what} expired at {principal.expires_at.isoformat()}: {hint}",
                               invalid_token=True)
        return principal

    def forget(self, token_id: str) -> None:
        """Drop a token and its sessions from the cache (it was revoked)."""
        with self._lock:
            for digest in [d for d, (p, _) in self._cache.items() if p.token_id == token_id]:
                del self._cache[digest]

    def forget_session(self, secret: str) -> None:
        """Drop one session from the cache (it was signed out)."""
        with self._lock:
            self._cache.pop(_session_digest(secret), None)

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

    def _lookup_session(self, digest: str, now: datetime) -> Principal | Refusal:
        try:
            with self._sessions() as session:
                return ui_sessions.find(session, digest.removeprefix(_SESSION_KEY), now)
        except SQLAlchemyError as exc:
            raise Unavailable(f"cannot check the session: database unavailable ({type(exc).__name__})"
                              ) from None


def session_secret(headers: Headers) -> str | None:
    """The session cookie's secret, if the call carries one that could be one.

    The first of its name: browsers send the cookie of the longest path first, which is ours
    (Path=/api/v1), before one that another page of the site may have planted under Path=/."""
    raw = headers.get("cookie")
    if not raw or len(raw) > 8192:
        return None
    for part in raw.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == SESSION_COOKIE:
            value = value.strip().strip('"')
            plausible = 0 < len(value) <= _MAX_SECRET and value.isascii() and value.isprintable()
            return value if plausible else None
    return None


def check_same_site(scope: Scope, headers: Headers, secret: str) -> None:
    """A write made with the session cookie: the session's CSRF token, from this origin."""
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Forbidden("a write with the dashboard's session cookie must come from the dashboard "
                        f"itself (Sec-Fetch-Site: {headers.get('sec-fetch-site')})")
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != headers.get("host", ""):
        raise Forbidden(f"a write with the dashboard's session cookie from another origin ({origin!r}) "
                        "is refused")
    if not ui_sessions.csrf_matches(secret, headers.get(CSRF_HEADER)):
        raise Forbidden("a write with the dashboard's session cookie needs the session's CSRF token in "
                        "the X-CSRF-Token header (GET /api/v1/session gives it); or send a bearer token")


class AccessControl:
    """ASGI middleware: authenticate calls under ``prefix``, audit the ones audit.wanted() names."""

    def __init__(self, app: ASGIApp, *, authenticator: Authenticator, auditor: audit.Auditor,
                 prefix: str, failures: FailedSignIns, paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.authenticator = authenticator
        self.failures = failures
        self.auditor = auditor
        self.prefix = prefix.rstrip("/") + "/"
        self.paths = paths  # outside the prefix, yet with a token only (/metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope["path"].startswith(self.prefix)
                                           or scope["path"] in self.paths):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        authorization = headers.get("authorization")
        # The bearer header, when there is one, decides alone: a cookie beside it is not looked at.
        secret = session_secret(headers) if authorization is None else None
        client = scope.get("client")
        address = client[0] if client else "unknown"
        digest = self.authenticator.digest_of(authorization, secret)
        now = self.authenticator.now()
        try:
            # An address that keeps failing is refused before its guesses are looked up.
            if not self.failures.vouched(digest, now):
                self.failures.check(address, now)
            if secret is None:
                principal = await self.authenticator.authenticate(authorization)
            else:
                principal = await self.authenticator.authenticate_session(secret)
        except ApiError as exc:
            what = f"{scope['method']} {redact(scope['path'])}: {exc.message}"
            if isinstance(exc, Unauthorized) and (authorization is not None or secret is not None):
                self.failures.failed(address, now, what)
            elif not isinstance(exc, TooManyRequests):  # those were counted by check()
                self.failures.refused(address, now, what)
            await error_response(exc)(scope, receive, send)
            return
        if digest is not None:
            self.failures.accepted(digest, now)
        scope[PRINCIPAL] = principal
        if secret is not None:
            scope[SESSION] = secret
            if scope["method"] not in SAFE_METHODS:
                try:
                    check_same_site(scope, headers, secret)
                except Forbidden as exc:
                    # A forged write is somebody's action against this token: on the record.
                    log.info("refused %s %s with %s's session: %s", scope["method"], redact(scope["path"]),
                             principal.describe(), exc.message)
                    await self.auditor.record(scope, principal, exc.code)
                    await error_response(exc)(scope, receive, send)
                    return
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
