"""A database that does not answer in time makes a call 503 with Retry-After, never 500.

The engine bounds every wait (db/engine.py: PostgreSQL's statement and connect timeouts,
SQLite's busy timeout, the pool's checkout timeout); what a call gets when one runs out is
said here, once for every route, dependency and middleware inside it (the audit record's
write included): a route that hit the timeout is not a bug of that route.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stortune.server.api.handlers import error_response
from stortune.server.auth import redact
from stortune.server.errors import Unavailable

log = logging.getLogger(__name__)

#: Seconds a client is told to wait: a hung database is not back at once, a busy one soon is.
RETRY_AFTER_S = 5


def unavailable(exc: OperationalError | PoolTimeout, statement_timeout_s: float) -> Unavailable:
    """What a caller is told: the kind of failure, not the driver's words (those go to the log)."""
    if isinstance(exc, PoolTimeout):
        why = "no database connection became free in time"
    elif type(exc.orig).__name__ in ("QueryCanceled", "LockNotAvailable"):
        why = f"the database did not answer within {statement_timeout_s:g} s (db_statement_timeout_s)"
    else:
        why = f"the database is unavailable ({type(exc.orig).__name__})"
    return Unavailable(f"{why}; retry in a few seconds", headers={"Retry-After": str(RETRY_AFTER_S)})


class DatabaseErrors:
    """ASGI middleware: a database timeout or outage escaping a call becomes 503."""

    def __init__(self, app: ASGIApp, *, statement_timeout_s: float) -> None:
        self.app = app
        self.statement_timeout_s = statement_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watching(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watching)
        except (OperationalError, PoolTimeout) as exc:
            if started:  # half an answer is out: nothing better to say than breaking it off
                raise
            log.warning("%s %s: database: %s", scope["method"], redact(scope["path"]), exc.__class__.__name__
                        + (f" ({type(exc.orig).__name__})" if isinstance(exc, OperationalError) else ""))
            await error_response(unavailable(exc, self.statement_timeout_s))(scope, receive, send)
