"""Health: /healthz (the process serves and its database answers) and /livez (it serves).

Kubernetes restarts a container whose liveness probe fails, so that probe is /livez,
which touches nothing but the event loop: a database outage must take the replicas
out of the Service (readiness, /healthz), not restart all of them at once.

Readiness answers within ``readiness_timeout_s`` whatever the database does: it reads the
resourceVersion counter every write starts from (services/versions.py), under a statement
timeout of its own, in a thread it stops waiting for when the time is up. A database that
hangs (or a lock nobody lets go) is 503 then, not a probe that hangs with it.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.db.engine import statement_timeout_ms
from stortune.server.errors import Unavailable
from stortune.server.services.versions import current_resource_version

router = APIRouter(tags=["health"])


def _read_counter(sessions: sessionmaker[Session], timeout_s: float) -> None:
    with sessions() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text(f"SET LOCAL statement_timeout = {statement_timeout_ms(timeout_s)}"))
        current_resource_version(session)
        session.rollback()


@router.get("/healthz", responses={503: {"description": "The database does not answer in time"}})
async def healthz(request: Request) -> dict[str, str]:
    timeout_s: float = request.app.state.settings.readiness_timeout_s
    late = f"database did not answer within {timeout_s:g} s (readiness_timeout_s)"
    try:
        with anyio.fail_after(timeout_s):
            await anyio.to_thread.run_sync(_read_counter, request.app.state.sessions, timeout_s,
                                           abandon_on_cancel=True)
    except TimeoutError:
        raise Unavailable(late) from None
    except SQLAlchemyError as exc:
        canceled = isinstance(exc, OperationalError) and type(exc.orig).__name__ == "QueryCanceled"
        raise Unavailable(late if canceled else f"database unavailable: {type(exc).__name__}") from None
    return {"status": "ok"}


@router.get("/livez")
async def livez() -> dict[str, str]:
    """The process answers; the database is not asked (the liveness probe)."""
    return {"status": "ok"}
