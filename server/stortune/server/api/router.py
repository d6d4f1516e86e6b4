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
    fleet,
    health,
    hosts,
    metrics,
    plans,
    probes,
    profiles,
    raid_plans,
    rollouts,
    sessions,
    tokens,
)
from stortune.server.api.security import Included, check_included, included_templates

API_PREFIX = "/api/v1"

#: Hottest first: agents' heartbeats, then host reads. Where two routers' paths could
#: overlap, the more specific one comes first (baselines and schedules before runs).
API_ROUTERS: tuple[APIRouter, ...] = (
    agents.router,
    hosts.router,
    fleet.router,
    probes.router,
    profiles.router,
    rollouts.router,
    plans.router,
    events.router,
    benchmark_baselines.router,
    benchmark_schedules.router,
    benchmarks.router,
    experiments.router,
    diagnostics.router,
    raid_plans.router,
    sessions.router,
    tokens.router,
    audit.router,
)

#: The order /docs lists the API in.
OPENAPI_TAGS = [{"name": tag} for tag in (
    "profiles", "hosts", "events", "agents", "tokens", "sessions", "audit", "diagnostics", "benchmarks",
    "experiments", "analysis", "health")]

health_router = health.router


#: (prefix, router) as the app includes them: /metrics needs a token, checked by api/access.py
#: as for /api/v1.
INCLUDED: Included = (("", health_router), ("", metrics.router),
                      *((API_PREFIX, router) for router in API_ROUTERS))
#: Where every route must declare a permission.
GUARDED = (API_PREFIX, metrics.PATH)


def include_api(app: FastAPI) -> None:
    """Every route under /api/v1 needs a token (api/access.py) and declares a permission
    (api/security.py): refused before anything is included otherwise."""
    check_included(INCLUDED, GUARDED)
    for prefix, router in INCLUDED:
        app.include_router(router, prefix=prefix,
                           responses={**INVALID, **AUTH} if prefix == API_PREFIX else None)


def route_templates(_app: FastAPI) -> dict[int, str]:
    """id(route in a request's scope) -> its path template (metrics/http.py)."""
    return included_templates(INCLUDED)
