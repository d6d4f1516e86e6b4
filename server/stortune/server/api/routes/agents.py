"""/api/v1/agents: registration, lease renewal and topology reports of host agents."""

from __future__ import annotations

from fastapi import APIRouter

from stortune.server.api.deps import HostName, NowDep, SessionDep, SettingsDep
from stortune.server.api.openapi import NOT_FOUND
from stortune.server.models.agents import (
    Heartbeat,
    HeartbeatAccepted,
    Registration,
    RegistrationAccepted,
    TopologyAccepted,
    TopologyUpload,
)
from stortune.server.services import hosts

router = APIRouter(prefix="/agents", tags=["agents"])


@router.post("/register")
def register(
    body: Registration, session: SessionDep, settings: SettingsDep, now: NowDep
) -> RegistrationAccepted:
    """Create or refresh the host. Reported labels are kept apart from API-set ones, which win."""
    host, wanted = hosts.register(session, body, lease_duration_s=settings.lease_duration_s, now=now)
    return RegistrationAccepted(name=host.name, heartbeat_interval_s=settings.heartbeat_interval_s,
                                lease_duration_s=settings.lease_duration_s, topology_wanted=wanted)


@router.post("/{name}/heartbeat", responses=NOT_FOUND)
def heartbeat(
    name: HostName, body: Heartbeat, session: SessionDep, settings: SettingsDep, now: NowDep,
) -> HeartbeatAccepted:
    """Renew the lease. 404 means: register again."""
    expires, wanted = hosts.heartbeat(session, name, body, lease_duration_s=settings.lease_duration_s,
                                      now=now)
    return HeartbeatAccepted(lease_expires=expires, topology_wanted=wanted)


@router.put("/{name}/topology", responses=NOT_FOUND)
def put_topology(name: HostName, body: TopologyUpload, session: SessionDep, now: NowDep) -> TopologyAccepted:
    host, changed = hosts.store_topology(session, name, body, now)
    return TopologyAccepted(name=host.name, topology_hash=host.topology_hash or "", changed=changed)
