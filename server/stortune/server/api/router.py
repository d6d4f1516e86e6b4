"""All routers in one place.

FastAPI matches a request against the routes in the order they were
included, and every router nested in another adds a level it walks twice
(once to match, once to dispatch). So the resource routers hang directly off
the app under the API prefix, the ones every agent and poller calls first:
a heartbeat is matched after a handful of routes instead of half the API.
The documentation keeps its own order (``OPENAPI_TAGS``).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from stortune.server.api.openapi import AUTH, INVALID
from stortune.server.api.routes import (
    agents,
    audit,
    benchmark_baselines,
    benchmark_schedules,
    benchmarks,
    diagnostics,
    events,
    experiments,
    health,
    hosts,
    plans,
    profiles,
    tokens,
)

API_PREFIX = "/api/v1"

#: Hottest first: agents' heartbeats, then host reads. Where two routers' paths could
#: overlap, the more specific one comes first (baselines and schedules before runs).
API_ROUTERS: tuple[APIRouter, ...] = (
    agents.router,
    hosts.router,
    profiles.router,
    plans.router,
    events.router,
    benchmark_baselines.router,
    benchmark_schedules.router,
    benchmarks.router,
    experiments.router,
    diagnostics.router,
    tokens.router,
    audit.router,
)

#: The order /docs lists the API in.
OPENAPI_TAGS = [{"name": tag} for tag in (
    "profiles", "hosts", "events", "agents", "tokens", "audit", "diagnostics", "benchmarks", "experiments",
    "health")]

health_router = health.router


def include_api(app: FastAPI) -> None:
    """Every route under /api/v1 needs a token (api/access.py) and declares a permission
    (api/security.py)."""
    app.include_router(health_router)
    for router in API_ROUTERS:
        app.include_router(router, prefix=API_PREFIX, responses={**INVALID, **AUTH})
