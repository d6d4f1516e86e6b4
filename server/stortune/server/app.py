"""The application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from fastapi import FastAPI

from stortune.server.api import handlers, openapi
from stortune.server.api.deps import Clock
from stortune.server.api.router import api_router, health_router
from stortune.server.controller import Controller, RecordingController, bind
from stortune.server.db.engine import make_engine, make_sessions
from stortune.server.db.migrate import upgrade
from stortune.server.settings import Settings

VERSION = "0.1.0"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def create_app(
    settings: Settings, *, controller: Controller | None = None, clock: Clock | None = None,
) -> FastAPI:
    """Build the service on its own engine, migrating the database to the newest schema first.

    State lives on ``app.state``: ``settings``, ``engine``, ``sessions`` (a
    sessionmaker), ``controller`` (gets reconcile requests after each commit;
    a RecordingController unless one is given) and ``clock``. The engine is
    disposed when the app shuts down (or call ``app.state.engine.dispose()``).
    """
    engine = make_engine(settings.db_url)
    upgrade(engine)
    sessions = make_sessions(engine)
    controller = controller if controller is not None else RecordingController()
    bind(sessions, controller)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(
        title="stortune control plane",
        version=VERSION,
        description="Declarative Linux storage tuning: StorageProfiles, hosts and their agents.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.controller = controller
    app.state.clock = clock or _utcnow
    app.include_router(health_router)
    app.include_router(api_router)
    handlers.install(app)
    openapi.install(app)
    return app
