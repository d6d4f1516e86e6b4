"""All routers in one place."""

from __future__ import annotations

from fastapi import APIRouter

from stortune.server.api.openapi import AUTH, INVALID
from stortune.server.api.routes import (
    agents,
    audit,
    benchmark_baselines,
    benchmark_schedules,
    benchmarks,
    diagnostics,
    events,
    health,
    hosts,
    profiles,
    tokens,
)

API_PREFIX = "/api/v1"

# Every route under it needs a token (api/access.py) and declares a permission (api/security.py).
api_router = APIRouter(prefix=API_PREFIX, responses={**INVALID, **AUTH})
api_router.include_router(profiles.router)
api_router.include_router(hosts.router)
api_router.include_router(events.router)
api_router.include_router(agents.router)
api_router.include_router(tokens.router)
api_router.include_router(audit.router)
api_router.include_router(diagnostics.router)
api_router.include_router(benchmarks.router)
api_router.include_router(benchmark_baselines.router)
api_router.include_router(benchmark_schedules.router)

health_router = health.router
