"""/metrics: the Prometheus scrape, with a token whose role may read metrics (admin, operator,
viewer, metrics). Served from memory: the fleet's state is refreshed by resourceVersion
(services/fleet_state.py), never by asking agents. Not in the OpenAPI document: it is text, not JSON.
"""

from __future__ import annotations

import gzip
from typing import Annotated

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from stortune.server.api.ratelimit import RateLimited
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.metrics.exposition import FleetExposition
from stortune.server.metrics.recorder import Recorder
from stortune.server.metrics.rollouts import RolloutGauges

PATH = "/metrics"
#: The classic text format, what both halves of the scrape are written in (and every Prometheus reads).
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
router = APIRouter(tags=["metrics"])
#: Prometheus scrapes every 15 to 60 s (twice with an HA pair): far below this. A token that
#: scrapes in a loop would otherwise keep API threads waiting on the one render at a time.
SCRAPES_PER_MINUTE = 30
MetricsReader = Annotated[Principal, Authorized(Permission.READ_METRICS)]


@router.get(PATH, include_in_schema=False,
            dependencies=[RateLimited("metrics", per_minute=SCRAPES_PER_MINUTE)])
async def metrics(who: MetricsReader, request: Request) -> Response:
    state = request.app.state
    exposition: FleetExposition = state.metrics_fleet
    recorder: Recorder = state.metrics
    rollouts: RolloutGauges = state.metrics_rollouts

    packed = "gzip" in request.headers.get("accept-encoding", "")

    def scrape() -> bytes:
        exposition.fleet.refresh()
        exposition.regressions.refresh()
        rollouts.refresh()
        body = recorder.render() + exposition.render() + rollouts.render().encode()
        # Prometheus asks for gzip; a large fleet's scrape shrinks about twentyfold in ~0.15 s
        # for 10,000 hosts (level 1: the label text repeats, more effort buys little).
        return gzip.compress(body, compresslevel=1, mtime=0) if packed else body

    headers = {"Vary": "Accept-Encoding", **({"Content-Encoding": "gzip"} if packed else {})}
    return Response(await run_in_threadpool(scrape), media_type=TEXT_FORMAT, headers=headers)
