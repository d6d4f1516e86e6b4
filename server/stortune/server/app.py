"""The application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import anyio.to_thread
from fastapi import FastAPI

from stortune.server import rollout_analysis, ui
from stortune.server.agentclient import AgentClientFactory, AgentClients
from stortune.server.api import docs, handlers, openapi
from stortune.server.api.access import AccessControl, Authenticator
from stortune.server.api.audit import Auditor
from stortune.server.api.cached_reads import CachedReads
from stortune.server.api.dberrors import DatabaseErrors
from stortune.server.api.deps import Clock
from stortune.server.api.documents import Parsers
from stortune.server.api.limits import BodyLimits
from stortune.server.api.ratelimit import RateLimiter
from stortune.server.api.rendered import DocumentCache, RenderedCache
from stortune.server.api.router import API_PREFIX, OPENAPI_TAGS, include_api, route_templates
from stortune.server.api.routes import metrics as metrics_route
from stortune.server.api.sharedlimits import SharedRateLimiter
from stortune.server.api.signins import FailedSignIns
from stortune.server.bench.dispatcher import BenchmarkDispatcher
from stortune.server.controller import Controller, bind
from stortune.server.db.engine import API_THREADS, make_engine, make_sessions
from stortune.server.db.migrate import upgrade
from stortune.server.metrics import Recorder
from stortune.server.metrics.exposition import FleetExposition
from stortune.server.metrics.http import RequestMetrics
from stortune.server.metrics.rollouts import RolloutGauges
from stortune.server.reconciler import Reconciler
from stortune.server.rollout_driver import RolloutDriver
from stortune.server.services.agent_pki import AgentPki
from stortune.server.services.fleet_state import FleetState
from stortune.server.services.pacing import FleetSize
from stortune.server.services.regressions import Regressions
from stortune.server.services.versions import VersionReader
from stortune.server.services.watches import WatchBook
from stortune.server.settings import Settings
from stortune.server.shards import SHARDS, AllShards, Notices, Ownership, ShardKeeper
from stortune.server.tune.driver import ExperimentDriver

VERSION = "0.1.0"


def _utcnow() -> datetime:
    return datetime.now(UTC)


@runtime_checkable
class Runnable(Protocol):
    """A controller with a life of its own, run for as long as the app serves."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def create_app(
    settings: Settings,
    *,
    controller: Controller | None = None,
    agents: AgentClientFactory | None = None,
    clock: Clock | None = None,
) -> FastAPI:
    """Build the service on its own engine, migrating the database to the newest schema first.

    ``controller`` gets the reconcile requests after each commit; by default it
    is a Reconciler dialling agents through ``agents`` (real gRPC clients
    unless given), started and stopped with the app. A controller with async
    ``start()``/``stop()`` is run the same way.

    State lives on ``app.state``: ``settings``, ``engine``, ``sessions`` (a
    sessionmaker), ``controller``, ``agents`` (the AgentClientFactory), ``clock``,
    ``authenticator``, ``rate_limiter``, ``rendered`` and ``host_documents``
    (api/rendered.py), ``versions`` (services/versions.py), ``fleet_size``
    (services/pacing.py), ``fleet`` (services/fleet_state.py), ``watches`` (services/watches.py).
    The engine is disposed when the app shuts down (or call ``app.state.engine.dispose()``).

    Every call under /api/v1 needs a bearer token (api/access.py): tokens are
    made with ``stortune-server token create`` or the API, or written to the
    state directory by ``stortune-server`` on its first start (bootstrap.py).
    """
    engine = make_engine(settings.db_url, statement_timeout_s=settings.db_statement_timeout_s,
                         connect_timeout_s=settings.db_connect_timeout_s)
    upgrade(engine)
    sessions = make_sessions(engine)
    now = clock or _utcnow
    # Mutual TLS to agents unless the settings say plaintext (stortune-server --insecure).
    pki = AgentPki.load(settings.agent_pki) if settings.agent_pki is not None else None
    # The one factory of agent clients: the reconciler, benchmark runs and diagnostics share it.
    if agents is None:
        agents = AgentClients(tls=pki.client if pki is not None else None)
    recorder = Recorder()  # counts from this process's start (Prometheus counter semantics)
    versions = VersionReader(sessions)  # shared: API GETs and drift checks read it in the same batches
    # Servers sharing a PostgreSQL database divide the hosts by shard leases; on SQLite one owns all.
    shared = engine.dialect.name == "postgresql"
    ownership: Ownership = (ShardKeeper(engine, lease_s=settings.shard_lease_s, metrics=recorder) if shared
                            else AllShards())
    ownership.install(sessions)
    if not shared:
        recorder.shards_owned_from(lambda: SHARDS)
    notices: Notices | None = None
    fleet = FleetState(sessions)
    if controller is None:
        reconciler = Reconciler(
            sessions, agents,
            interval=settings.reconcile_interval_s, workers=settings.reconcile_workers, clock=now,
            versions=versions, ram_share=settings.stripe_cache_ram_share, metrics=recorder,
            ownership=ownership, max_looks_per_s=settings.max_looks_per_s, fleet=fleet,
        )
        if shared:
            notices = reconciler.notices = Notices(engine, reconciler.noticed)
        controller = reconciler
    bind(sessions, controller)
    running = controller if isinstance(controller, Runnable) else None
    # The benchmark run queue (its rows survive restarts), run with the app like the reconciler.
    dispatcher = BenchmarkDispatcher(sessions, agents, clock=now, interval=settings.benchmark_interval_s,
                                     unreachable_timeout=settings.benchmark_unreachable_timeout_s,
                                     ownership=ownership)
    # Tuning experiments: per host one trial at a time, each a run of the benchmark queue.
    # Agents holding a watch here: their leases renewed in batches (services/watches.py).
    watches = WatchBook(sessions, now, hold_s=settings.agent_watch_s, lease_s=settings.lease_duration_s)
    experiments = ExperimentDriver(sessions, agents, dispatcher, clock=now,
                                   interval=settings.experiment_interval_s,
                                   unreachable_timeout=settings.benchmark_unreachable_timeout_s,
                                   ownership=ownership, ram_share=settings.stripe_cache_ram_share)
    # Progressive rollouts (issue 27): stepped when hosts report, through the reconciler's writes.
    rollouts = RolloutDriver(sessions, fleet, clock=now, interval=settings.rollout_interval_s,
                             ownership=ownership)
    if isinstance(controller, Reconciler):
        controller.listeners.append(rollouts.wake)
    # Canaries' analysis runs (rollout_analysis): started once queued; their end steps the rollout.
    rollout_analysis.bind(sessions, dispatcher.wake)
    dispatcher.listeners.append(rollouts.wake)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Sync routes and dependencies run on anyio's threadpool; bounded so the
        # database pool always has a connection for each of its threads (engine.py).
        anyio.to_thread.current_default_thread_limiter().total_tokens = API_THREADS
        await ownership.start()  # first: the workers below start on the shards held
        if notices is not None:
            notices.start()
        if running is not None:
            await running.start()
        await dispatcher.start()
        await experiments.start()
        await rollouts.start()
        await watches.start()
        try:
            yield
        finally:
            await watches.stop()
            await rollouts.stop()
            await experiments.stop()
            await dispatcher.stop()
            if running is not None:
                await running.stop()
            await ownership.stop()  # its shards go to the others now, not when their leases run out
            if notices is not None:
                notices.stop()
            close = getattr(agents, "close", None)  # the reconciler may have closed it already
            if close is not None:
                await close()
            versions.close()
            engine.dispose()

    app = FastAPI(
        title="stortune control plane",
        version=VERSION,
        description="Declarative Linux storage tuning: StorageProfiles, hosts and their agents.",
        lifespan=lifespan,
        openapi_tags=OPENAPI_TAGS,
        docs_url=None,  # api/docs.py serves /docs and /redoc without a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.controller = controller
    app.state.agents = agents
    app.state.benchmarks = dispatcher
    app.state.experiments = experiments
    app.state.rollouts = rollouts
    app.state.watches = watches
    app.state.ownership = ownership
    app.state.agent_pki = pki
    app.state.clock = now
    app.state.rendered = RenderedCache()
    app.state.host_documents = DocumentCache()
    app.state.versions = versions
    app.state.metrics = recorder
    app.state.fleet = fleet  # the scrape's, the host list's and the summaries' in-memory index
    app.state.metrics_fleet = FleetExposition(app.state.fleet, Regressions(sessions))
    app.state.metrics_rollouts = RolloutGauges(sessions)  # one query of the rollouts table per change
    app.state.fleet_size = FleetSize(sessions)
    app.state.session_closers = anyio.CapacityLimiter(API_THREADS)  # see api/deps.py
    app.state.document_parsers = Parsers(settings.document_parsers)  # off the event loop, bounded
    # Several servers share a PostgreSQL database: their rate limits must be one.
    app.state.rate_limiter = (SharedRateLimiter(engine) if engine.dialect.name == "postgresql"
                              else RateLimiter())
    authenticator = Authenticator(sessions, now, cache_s=settings.token_cache_s)
    app.state.authenticator = authenticator
    include_api(app)
    # Added innermost first: authentication (and the audit record) wraps the cached reads
    # (which need the caller) and the body limits, so a call refused for its size by a
    # known caller is audited too.
    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes, max_depth=settings.max_document_depth)
    app.add_middleware(CachedReads, api_prefix=API_PREFIX)
    app.add_middleware(AccessControl, authenticator=authenticator,
                       auditor=Auditor(sessions, now, API_PREFIX), prefix=API_PREFIX,
                       failures=FailedSignIns(burst=settings.failed_auth_burst,
                                              per_minute=settings.failed_auth_per_minute),
                       paths=frozenset({metrics_route.PATH}))
    # A database that does not answer in time is 503, its audit record included.
    app.add_middleware(DatabaseErrors, statement_timeout_s=settings.db_statement_timeout_s)
    # Outermost: the time a caller waits, refusals included.
    app.add_middleware(RequestMetrics, recorder=recorder, templates=route_templates)
    handlers.install(app)
    openapi.install(app, API_PREFIX)
    docs.install(app)
    ui.install(app)  # the dashboard, /ui/: a client of the API above
    return app
