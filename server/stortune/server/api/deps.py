"""Dependencies of the routes, as typed aliases."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.profile import NAME_PATTERN, is_name
from stortune.server.api.documents import DocumentLimits, Parsers
from stortune.server.errors import NotFound
from stortune.server.settings import Settings

Clock = Callable[[], datetime]


# Dependencies that do not block are ``async def``: FastAPI runs a plain ``def``
# dependency in the threadpool, and those hops cost more CPU than a heartbeat's
# database write.


async def get_session(request: Request) -> AsyncIterator[Session]:
    # Opening a session touches no connection (that happens at its first query,
    # inside the sync route). Closing returns the connection and may roll back
    # over the network, so it runs in a thread, but under its own limiter: if it
    # queued behind routes that wait for a pooled connection, the connections
    # it would give back could never be given back. Shielded, because a client
    # hanging up must not leave the connection checked out.
    sessions: sessionmaker[Session] = request.app.state.sessions
    closers: anyio.CapacityLimiter = request.app.state.session_closers
    session = sessions()
    try:
        yield session
    finally:
        if session.in_transaction():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(session.close, limiter=closers)
        else:  # unused or committed: it holds no connection, and closing it touches nothing
            session.close()


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_now(request: Request) -> datetime:
    clock: Clock = request.app.state.clock
    return clock()


async def read_document(request: Request) -> Any:
    """The raw body, JSON or YAML: documents are validated by the schemas package, not FastAPI,
    so error paths are the document's own (spec.rules[0]...). Parsed in a worker thread within
    the document bounds (api/documents.py); size and JSON depth are bounded before this runs
    (api/limits.py)."""
    limits = DocumentLimits.of(request.app.state.settings)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:  # refused before it is read
        raise limits.too_many_bytes()
    body = await request.body()
    content_type = request.headers.get("content-type", "application/json")
    parsers: Parsers = request.app.state.document_parsers
    return await parsers.parse(body, "YAML" if "yaml" in content_type else "JSON", limits)


# The pattern is documented, not enforced as 422: a name that cannot exist is simply not found.
NamePath = Annotated[str, Path(description="Object name (RFC 1123)",
                               json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 253})]


def _known_name(kind: str, name: str) -> str:
    # A string that is not a valid name names nothing; answering 404 here also
    # keeps text no database column accepts (NUL) away from the queries.
    if not is_name(name):
        raise NotFound(kind, name)
    return name


async def profile_name(name: NamePath) -> str:
    return _known_name("StorageProfile", name)


async def host_name(name: NamePath) -> str:
    return _known_name("Host", name)


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
NowDep = Annotated[datetime, Depends(get_now)]
DocumentDep = Annotated[Any, Depends(read_document)]
ProfileName = Annotated[str, Depends(profile_name)]
HostName = Annotated[str, Depends(host_name)]
