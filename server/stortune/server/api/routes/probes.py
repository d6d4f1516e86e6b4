"""Probes: measure the ceilings of a host's device (its members alone, then together).

    POST /api/v1/hosts/{name}/probes          {"consent": true, "device": "md126"}  (run benchmarks)
    GET  /api/v1/hosts/{name}/probes          newest first, without results          (read benchmarks)
    GET  /api/v1/hosts/{name}/probes/{id}     the probe, refreshed from the agent until it ends
    POST /api/v1/hosts/{name}/probes/{id}/cancel

A probe reads the host's disks for a while (read-only), so it needs ``consent: true`` and the
role that may run benchmarks; it takes the host's benchmark lock on the agent, so it is refused
(409) while a benchmark or another probe runs there. The device is a kernel name the agent
resolves in its own topology; no path and no fio option passes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from stortune.api.agent.wire import BenchmarkProgress
from stortune.schemas.analysis.probe import ProbeResult
from stortune.server.agentclient import (
    AgentBusy,
    AgentClient,
    AgentClientFactory,
    AgentError,
    AgentRejected,
)
from stortune.server.api.audit import note_resource
from stortune.server.api.bodies import OffLoopBodyRoute
from stortune.server.api.deps import NowDep, SessionDep
from stortune.server.api.openapi import BAD_REQUEST, CONFLICT, NOT_FOUND
from stortune.server.api.ratelimit import RateLimited
from stortune.server.api.security import Authorized, VisibleHostName
from stortune.server.auth import Permission, Principal
from stortune.server.errors import Cause, Conflict, Invalid, NotFound, Unavailable
from stortune.server.models.probes import ProbeList, ProbeRequest, ProbeView
from stortune.server.services import hosts, probes

log = logging.getLogger("stortune.server.probes")
router = APIRouter(route_class=OffLoopBodyRoute, tags=["hosts"])

Reader = Annotated[Principal, Authorized(Permission.READ_BENCHMARKS)]
Runner = Annotated[Principal, Authorized(Permission.RUN_BENCHMARKS)]
PROBES_PER_MINUTE = 30  # as benchmark runs: each one is a run on one host
_ID = r"^probe-[A-Za-z0-9_.-]{1,58}$"
_FOLLOWERS = "probe_followers"


async def probe_id(probe_id: Annotated[str, Path(description="The probe's id", max_length=64)]) -> str:
    if not re.fullmatch(_ID, probe_id):
        raise NotFound(probes.KIND, probe_id)  # no such id can exist
    return probe_id


ProbeId = Annotated[str, Depends(probe_id)]


def _host(sessions: sessionmaker[Session], name: str) -> tuple[str, dict[str, object] | None]:
    with sessions() as session:
        host = hosts.get(session, name)
        return host.address, host.topology


def _agent(request: Request, address: str, name: str) -> AgentClient:
    agents: AgentClientFactory = request.app.state.agents
    return agents.for_address(address, name)


def _store(sessions: sessionmaker[Session], name: str, pid: str, progress: BenchmarkProgress,
           result: ProbeResult | None) -> ProbeView:
    with sessions() as session, session.begin():
        row = probes.get_for_update(session, name, pid)
        probes.refresh(session, row, progress, result, datetime.now(UTC))
        return ProbeView.from_row(row)


async def _follow(sessions: sessionmaker[Session], agent: AgentClient, name: str, pid: str) -> None:
    """Until the probe ends on the agent, then store its result: the control plane keeps the
    ceilings without anyone asking. A follower lost (server restart) is made up for by a GET."""
    try:
        async for progress in agent.watch_benchmark(pid):
            if progress.finished:
                break
        got, result = await agent.get_probe_result(pid)
        await run_in_threadpool(_store, sessions, name, pid, got, result)
    except (AgentError, NotFound) as exc:
        log.warning("probe %s on %s: not followed to its end: %s", pid, name, exc)


@router.post("/hosts/{name}/probes", status_code=status.HTTP_201_CREATED,
             responses={**BAD_REQUEST, **NOT_FOUND, **CONFLICT},
             dependencies=[RateLimited("probes", per_minute=PROBES_PER_MINUTE)])
async def start_probe(*, who: Runner, name: VisibleHostName, body: ProbeRequest, request: Request,
                      now: NowDep) -> ProbeView:
    """Measure each member of the device alone (sequential 1 MiB, random 4 KiB reads), then
    2, 4 ... at once: the measured ceilings the host analysis uses. Read-only; needs consent."""
    sessions: sessionmaker[Session] = request.app.state.sessions
    address, topology = await run_in_threadpool(_host, sessions, name)
    probes.check_request(body.consent, body.device, topology)
    pid = probes.new_probe_id()
    note_resource(request, f"hosts/{name}/probes/{pid}")
    agent = _agent(request, address, name)
    try:
        progress = await agent.start_probe(pid, body.device)
    except AgentBusy as exc:
        raise Conflict(f"host {name} is busy, try again when it is done: {exc.message}",
                       kind=probes.KIND, name=pid) from None
    except AgentRejected as exc:
        raise Invalid([Cause("device", exc.message)], kind=probes.KIND) from None
    except AgentError as exc:
        raise Unavailable(f"cannot start a probe on {name}: {exc.message}", kind="Host", name=name) from None

    def create() -> ProbeView:
        with sessions() as session, session.begin():
            row = probes.create(session, pid, name, body.device, requested_by=f"{who.name}"
                                f" (token {who.token_id})", progress=progress, now=now)
            return ProbeView.from_row(row)

    view = await run_in_threadpool(create)
    followers: set[asyncio.Task[None]] = getattr(request.app.state, _FOLLOWERS, set())
    setattr(request.app.state, _FOLLOWERS, followers)
    task = asyncio.get_running_loop().create_task(_follow(sessions, agent, name, pid))
    followers.add(task)
    task.add_done_callback(followers.discard)
    return view


@router.get("/hosts/{name}/probes", responses=NOT_FOUND)
def list_probes(who: Reader, name: VisibleHostName, session: SessionDep) -> ProbeList:
    """The host's probes, newest first, without their results."""
    hosts.get(session, name, with_topology=False)
    rows = probes.list_probes(session, name)
    return ProbeList(items=[ProbeView.from_row(r, with_result=False) for r in rows])


@router.get("/hosts/{name}/probes/{probe_id}", responses=NOT_FOUND)
async def get_probe(who: Reader, name: VisibleHostName, pid: ProbeId, request: Request) -> ProbeView:
    """The probe and, once done, its ceilings and scaling curve; an unfinished one is asked
    of the agent first (when the agent cannot answer, the stored state is shown)."""
    sessions: sessionmaker[Session] = request.app.state.sessions

    def read() -> tuple[ProbeView, str]:
        with sessions() as session:
            row = probes.get(session, name, pid)
            return ProbeView.from_row(row), hosts.get(session, name, with_topology=False).address

    view, address = await run_in_threadpool(read)
    if view.state in probes.TERMINAL and view.result is not None:
        return view
    with contextlib.suppress(AgentError):
        progress, result = await _agent(request, address, name).get_probe_result(pid)
        view = await run_in_threadpool(_store, sessions, name, pid, progress, result)
    return view


@router.post("/hosts/{name}/probes/{probe_id}/cancel", responses={**NOT_FOUND, **CONFLICT})
async def cancel_probe(who: Runner, name: VisibleHostName, pid: ProbeId, request: Request) -> ProbeView:
    """Stop a running probe; the agent kills fio and frees the host's benchmark lock."""
    sessions: sessionmaker[Session] = request.app.state.sessions

    def read() -> tuple[str, str]:
        with sessions() as session:
            row = probes.get(session, name, pid)
            return row.state, hosts.get(session, name, with_topology=False).address

    state, address = await run_in_threadpool(read)
    if state in probes.TERMINAL:
        raise Conflict(f"probe {pid} has already ended ({state})", kind=probes.KIND, name=pid)
    agent = _agent(request, address, name)
    try:
        await agent.cancel_benchmark(pid)
        progress, result = await agent.get_probe_result(pid)
    except AgentError as exc:
        raise Unavailable(f"cannot cancel probe {pid} on {name}: {exc.message}", kind="Host",
                          name=name) from None
    return await run_in_threadpool(_store, sessions, name, pid, progress, result)
