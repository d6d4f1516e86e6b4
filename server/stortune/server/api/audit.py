"""Which calls are audited, and writing their rows.

Every mutating call (POST, PUT, PATCH, DELETE) under /api/v1 by an
authenticated caller is audited, whatever its outcome (403 and other 4xx
included), unless its endpoint says ``@not_audited``, or ``@audited_when_refused``
(heartbeats: only the calls answered with an error); a GET is audited when
its endpoint says ``@audited`` (diagnostics downloads). Unauthenticated calls
are refused before any route runs and only logged: a client without a token
must not be able to make the server write to its database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Request
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Scope

from stortune.server.api.deps import Clock
from stortune.server.auth import Principal
from stortune.server.services import audit

log = logging.getLogger(__name__)

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_POLICY = "__stortune_audit__"
_REFUSED = "refused"
_RESOURCE = "stortune.audit.resource"

F = TypeVar("F", bound=Callable[..., Any])


def audited(endpoint: F) -> F:
    """Audit every call of this endpoint, reads included (e.g. a diagnostics download)."""
    setattr(endpoint, _POLICY, True)
    return endpoint


def not_audited(endpoint: F) -> F:
    """Never audit this endpoint: for machine traffic that is not anyone's action (heartbeats)."""
    setattr(endpoint, _POLICY, False)
    return endpoint


def audited_when_refused(endpoint: F) -> F:
    """Audit only the calls answered with an error (4xx, 5xx): machine traffic whose refusals
    someone must be able to find (a heartbeat for a host without its key)."""
    setattr(endpoint, _POLICY, _REFUSED)
    return endpoint


def note_resource(request: Request, resource: str) -> None:
    """Name what the call is about when the path does not (POST /profiles -> profiles/NAME)."""
    request.scope[_RESOURCE] = resource


def wanted(scope: Scope, code: int) -> bool:
    """Whether a call answered with ``code`` is audited."""
    endpoint = getattr(scope.get("route"), "endpoint", None)
    policy = getattr(endpoint, _POLICY, None)
    if policy == _REFUSED:
        return code >= 400
    return bool(policy) if policy is not None else scope["method"] in MUTATING


def _resource(scope: Scope, prefix: str) -> str:
    noted = scope.get(_RESOURCE)
    if isinstance(noted, str):
        return noted
    path: str = scope["path"]
    return path.removeprefix(prefix).strip("/") or path


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class Auditor:
    """Writes the audit rows of one app, in a worker thread each."""

    def __init__(self, sessions: sessionmaker[Session], clock: Clock, prefix: str) -> None:
        self._sessions = sessions
        self._clock = clock
        self._prefix = prefix

    async def record(self, scope: Scope, principal: Principal, code: int) -> None:
        query = scope.get("query_string", b"").decode("latin-1")
        call = audit.Call(
            principal=principal, method=scope["method"], code=code, client=_client(scope),
            path=scope["path"] + (f"?{query}" if query else ""), resource=_resource(scope, self._prefix),
        )
        # Shielded: a client that hangs up must not cancel the record of what it did.
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(self._write, call)
            except SQLAlchemyError:
                log.exception("could not write the audit record of %s %s by %s",
                              call.method, call.resource, principal.describe())

    def _write(self, call: audit.Call) -> None:
        with self._sessions() as session:
            audit.record(session, call, self._clock())
