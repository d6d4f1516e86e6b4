"""All routers in one place."""

from __future__ import annotations

from fastapi import APIRouter

from stortune.server.api.openapi import INVALID
from stortune.server.api.routes import agents, events, health, hosts, profiles

API_PREFIX = "/api/v1"

api_router = APIRouter(prefix=API_PREFIX, responses={**INVALID})
api_router.include_router(profiles.router)
api_router.include_router(hosts.router)
api_router.include_router(events.router)
api_router.include_router(agents.router)

health_router = health.router
