"""/healthz: the process serves and its database answers."""

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
