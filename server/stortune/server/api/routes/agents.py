"""/api/v1/agents: registration, lease renewal and topology reports of host agents."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from stortune.api.agent import HOST_KEY_HEADER
from stortune.server.api.audit import audited_when_refused, note_resource
from stortune.server.api.bodies import OffLoopBodyRoute
from stortune.server.api.buckets import Limiter
from stortune.server.api.deps import HostName, NowDep, SessionDep, SettingsDep
from stortune.server.api.openapi import NOT_FOUND
from stortune.server.api.ratelimit import sized
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.errors import Cause, Conflict, Invalid
from stortune.server.models.agents import (
    CertificateIssued,
    CertificateRequest,
    Heartbeat,
    HeartbeatAccepted,
    Registration,
    RegistrationAccepted,
    TopologyAccepted,
    TopologyUpload,
    WatchAccepted,
)
from stortune.server.services import corrections, host_keys, hosts
from stortune.server.services.agent_pki import AgentPki, PkiRefusal
from stortune.server.services.host_keys import Proof
from stortune.server.services.pacing import FleetSize, Pace
from stortune.server.services.watches import WatchBook
from stortune.server.settings import Settings

router = APIRouter(route_class=OffLoopBodyRoute, prefix="/agents", tags=["agents"])

# The agents' bootstrap token (role agent) may make these calls and nothing else,
# and for an enrolled host only with the host's key (services/host_keys.py).
# Registration and topology uploads are audited: they decide which address the
# control plane dials for a host and what it plans there. Heartbeats only when
# refused: accepted ones are no one's action, and every agent sends one every few
# seconds.
Agent = Annotated[Principal, Authorized(Permission.REPORT_AS_AGENT)]

# Read from the headers rather than declared as a parameter: the heartbeat is the hottest
# call, and each declared parameter costs every request. Documented here instead.
_HOST_KEY_DOC: dict[str, Any] = {"parameters": [{
    "name": HOST_KEY_HEADER, "in": "header", "required": False,
    "schema": {"type": "string", "maxLength": host_keys.MAX_LENGTH},
    "description": "The agent's host key: pinned at the host's first registration, then required "
                   "for every agent call for the host (an admin may act without it)"}]}


def proof_of(who: Principal, request: Request) -> Proof:
    return Proof(request.headers.get(HOST_KEY_HEADER), who.can(Permission.ACT_FOR_ANY_HOST))


@router.post("/register", openapi_extra=_HOST_KEY_DOC, responses={
    409: {"description": "the name is enrolled with another host key"}})
def register(
    *, who: Agent, body: Registration, session: SessionDep, settings: SettingsDep, now: NowDep,
    request: Request,
) -> RegistrationAccepted:
    """Create or refresh the host. Reported labels are kept apart from API-set ones, which win.

    A new name is pinned to the host key sent with it; an enrolled one is refreshed only with
    that key (409 otherwise) or by an admin.
    """
    note_resource(request, f"hosts/{body.name}")
    fleet: FleetSize = request.app.state.fleet_size
    paced = fleet.pace(settings, joining=True)
    host, wanted = hosts.register(session, body, proof=proof_of(who, request),
                                  lease_duration_s=paced.lease_s, now=now)
    return RegistrationAccepted(name=host.name, heartbeat_interval_s=paced.interval_s,
                                lease_duration_s=paced.lease_s, topology_wanted=wanted)


@router.post("/{name}/heartbeat", openapi_extra=_HOST_KEY_DOC, responses={
    **NOT_FOUND, 403: {"description": "without the host's key"}})
@audited_when_refused
async def heartbeat(*, who: Agent, name: HostName, body: Heartbeat, request: Request) -> HeartbeatAccepted:
    """Renew the lease. 404 means: register again; 403: the host key is not the host's."""
    # The hottest call (every agent, every few seconds): one trip to the threadpool for
    # the whole database part, and the app's state read here rather than through more
    # dependencies, each of which costs a request noticeable CPU.
    paced, expires, wanted, recorded = await _renew(request, name, body, proof_of(who, request))
    return HeartbeatAccepted(lease_expires=expires, topology_wanted=wanted,
                             heartbeat_interval_s=paced.interval_s, lease_duration_s=paced.lease_s,
                             corrections_recorded=recorded)


async def _renew(request: Request, name: str, body: Heartbeat, proof: Proof
                 ) -> tuple[Pace, datetime, bool, int | None]:
    """The heartbeat's database part: one trip to the threadpool. The last element: up to which
    seq the corrections sent are recorded (None: none were sent, or past the host's rate)."""
    state = request.app.state
    sessions: sessionmaker[Session] = state.sessions
    fleet: FleetSize = state.fleet_size
    settings: Settings = state.settings
    now: datetime = state.clock()

    def renew() -> tuple[Pace, datetime, bool, corrections.Recorded | None]:
        with sessions() as session:
            paced = fleet.pace(settings)
            expires, wanted = hosts.heartbeat(session, name, body, proof=proof,
                                              lease_duration_s=paced.lease_s, now=now)
            # After the lease's commit, and only once the host key is proven (heartbeat raised else),
            # so no one else spends the host's rate. A batch past it is not taken: sent again later.
            if body.corrections is None or not _takes_batch(state.rate_limiter, settings, name, now):
                return paced, expires, wanted, None
            return paced, expires, wanted, corrections.record(
                session, name, body.corrections, now, per_minute=settings.agent_correction_events_per_minute)

    paced, expires, wanted, recorded = await run_in_threadpool(renew)
    state.metrics.heartbeat()
    for c in recorded.new if recorded else ():
        state.metrics.drift(c.tunable, c.cause)
        state.metrics.corrected(c.tunable, c.cause)
    return paced, expires, wanted, None if recorded is None else recorded.upto


def _takes_batch(limiter: Limiter, settings: Settings, name: str, now: datetime) -> bool:
    """One batch of corrections from host ``name`` within its rate (per host: the agents share a token)."""
    # The routes' rule: a quarter minute's worth, scaled with a rate overridden by --rate-limit.
    per_minute, burst = sized(settings.rate_limits, corrections.LIMIT,
                              per_minute=corrections.BATCHES_PER_MINUTE)
    return limiter.take(corrections.LIMIT, name, per_minute=per_minute, burst=burst, now=now) == 0


@router.post("/{name}/watch", openapi_extra=_HOST_KEY_DOC, responses={
    **NOT_FOUND, 403: {"description": "without the host's key"}})
@audited_when_refused
async def watch(*, who: Agent, name: HostName, body: Heartbeat, request: Request) -> WatchAccepted:
    """A heartbeat the server holds open (up to ``watch_s``): while it is held the agent's lease
    is kept without further calls (services/watches.py). Answered at once when the server wants
    the topology (send it, then watch again) or is shutting down (``reconnect_after_s``); else
    at the end of the hold. Agents that report ``observed_digest`` report changes with a
    heartbeat meanwhile. 404: register again; 403: the host key is not the host's."""
    state = request.app.state
    paced, expires, wanted, recorded = await _renew(request, name, body, proof_of(who, request))
    book: WatchBook = state.watches
    hold = 0.0 if wanted or book.draining else book.hold_for()
    if hold:
        with book.holding(name, hold):
            await book.wait(hold, request.receive)
    return WatchAccepted(lease_expires=expires, topology_wanted=wanted, watch_s=hold,
                         reconnect_after_s=book.reconnect_after(), corrections_recorded=recorded,
                         heartbeat_interval_s=paced.interval_s, lease_duration_s=paced.lease_s)


@router.put("/{name}/topology", openapi_extra=_HOST_KEY_DOC, responses={
    **NOT_FOUND, 403: {"description": "without the host's key"}})
def put_topology(
    *, who: Agent, name: HostName, body: TopologyUpload, session: SessionDep, now: NowDep, request: Request,
) -> TopologyAccepted:
    host, changed = hosts.store_topology(session, name, body, proof=proof_of(who, request), now=now)
    return TopologyAccepted(name=host.name, topology_hash=host.topology_hash or "", changed=changed)


@router.post("/certificate", openapi_extra=_HOST_KEY_DOC, responses={409: {
    "description": "plaintext control plane, or the name belongs to another agent's key or host key"}})
def issue_certificate(
    *, who: Agent, body: CertificateRequest, request: Request, session: SessionDep, now: NowDep,
) -> CertificateIssued:
    """Sign the agent's CSR: a server certificate naming the host it registers as.

    The first key to ask for a name keeps it: another key asking for the same
    name is refused (409) until an admin deletes the host. For an enrolled host
    the request must also carry the host key (409 otherwise), so that a
    certificate for its name goes to no one else.
    """
    note_resource(request, f"hosts/{body.name}")
    pki: AgentPki | None = request.app.state.agent_pki
    if pki is None:
        raise Conflict("this control plane dials its agents in plaintext (--insecure) and issues no "
                       "certificates; run the agent with --insecure too")
    hosts.check_enrolled_key(session, body.name, proof_of(who, request))
    try:
        cert, expires = pki.issue(session, body.name, body.csr.encode(), now)
    except PkiRefusal as exc:
        if exc.field:
            raise Invalid([Cause(exc.field, exc.message)], kind="CertificateRequest",
                          name=body.name) from None
        raise Conflict(exc.message, kind="Host", name=body.name) from None
    return CertificateIssued(name=body.name, certificate=cert.decode(), ca=pki.ca_pem.decode(),
                             expires=expires)
