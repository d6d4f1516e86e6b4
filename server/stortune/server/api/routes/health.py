"""Health: /healthz (the process serves and its database answers) and /livez (it serves).

Kubernetes restarts a container whose liveness probe fails, so that probe is /livez,
which touches nothing but the event loop: a database outage must take the replicas
out of the Service (readiness, /healthz), not restart all of them at once.
"""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from stortune.server.api.deps import SessionDep
from stortune.server.errors import Unavailable

router = APIRouter(tags=["health"])


@router.get("/healthz", responses={503: {"description": "The database does not answer"}})
def healthz(session: SessionDep) -> dict[str, str]:
    try:
        session.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        raise Unavailable(f"database unavailable: {type(exc).__name__}") from None
    return {"status": "ok"}


@router.get("/livez")
async def livez() -> dict[str, str]:
    """The process answers; the database is not asked (the liveness probe)."""
    return {"status": "ok"}
