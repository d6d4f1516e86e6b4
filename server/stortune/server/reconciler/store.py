"""The reconciler's database side: short transactions through the services, run in threads.

Each function opens its own session and returns plain data, so no
transaction stays open while the reconciler waits on an agent.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.topology import Topology
from stortune.server.db.tables import Host, HostLease, Profile
from stortune.server.errors import NotFound
from stortune.server.models.hosts import settings_table
from stortune.server.reconciler.decide import HostView
from stortune.server.reconciler.report import Update
from stortune.server.services import experiments, hosts, profiles, rollouts
from stortune.server.services.fleet_state import FleetState
from stortune.server.services.versions import current_resource_version
from stortune.server.versioned import VersionedCache

Sessions = sessionmaker[Session]


class Topologies:
    """Parsed topologies by hash: a host's topology is read and validated once per change,
    not on every drift check (most passes find the same structure)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._parsed: OrderedDict[str, Topology] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str | None) -> Topology | None:
        if digest is None:
            return None
        with self._lock:
            found = self._parsed.get(digest)
            if found is not None:
                self._parsed.move_to_end(digest)
            return found

    def put(self, digest: str | None, topology: Topology | None) -> None:
        if digest is None or topology is None:
            return
        with self._lock:
            self._parsed[digest] = topology
            while len(self._parsed) > self._size:
                self._parsed.popitem(last=False)


class Views(VersionedCache[str, HostView]):
    """Each host's last HostView, kept with the resourceVersion the database was at when it was read.

    The counter moves with every write of every object, so while it stands
    still a view read at that value is still exactly what the database holds:
    an idle fleet's drift checks then cost one counter read instead of loading
    the host and its profiles again. Heartbeats do not move it.
    """

    def __init__(self, size: int = 20_000) -> None:
        super().__init__(size)


def load(sessions: Sessions, name: str, topologies: Topologies | None = None,
         views: Views | None = None) -> HostView | None:
    """The host and the profiles it should run; None if the host is gone."""
    with sessions() as session:
        # The counter first: what is read after it is at least as new as the version it is kept under.
        version = current_resource_version(session)
        kept = views.get(name, version) if views is not None else None
        if kept is not None:
            return kept
        view = _load(session, name, topologies or Topologies(size=1))
    if view is not None and views is not None:
        views.put(name, version, view)
    return view


def _load(session: Session, name: str, cache: Topologies) -> HostView | None:
    try:
        host = hosts.get(session, name, with_topology=False)
    except NotFound:
        return None
    topology = cache.get(host.topology_hash)
    if topology is None and host.topology_hash is not None:
        # The hash is a digest of the structure and values the agent sent with it.
        topology = _topology(session.scalar(select(Host.topology).where(Host.name == name)))
        cache.put(host.topology_hash, topology)
    # Each profile at the generation the host must hold: a rollout's pin, or the current one.
    invalid: dict[str, str] = {}
    labels = host.effective_labels
    live = rollouts.desired(session, name, profiles.selecting(session, labels), labels=labels,
                            invalid=invalid)
    deleting = profiles.being_deleted(session, host.applied_generations)
    status = host.status
    return HostView(
        name=host.name, address=host.address, profiles=tuple(live),
        applied=dict(host.applied_generations), deleting=frozenset(deleting),
        conditions={c["type"]: c for c in status.get("conditions", [])},
        devices=settings_table(status.get("devices", [])),
        topology=topology, topology_hash=host.topology_hash,
        checked_boot_id=status.get("checkedBootId"), applied_boot_id=status.get("appliedBootId"),
        refused=status.get("refusedGenerations"), lease_expired=host.lease_expired, invalid=invalid,
        boot_id=host.boot_id,
        experiment=experiments.holding(session, name),
    )


def _topology(raw: dict[str, Any] | None) -> Topology | None:
    return hosts.stored_topology(raw)  # None for an older model: ask the agent for it again


def write(sessions: Sessions, name: str, update: Update, now: datetime) -> bool:
    """Store ``update``; False if the host was deleted meanwhile."""
    if update.empty:
        return True
    with sessions() as session:
        try:
            hosts.write_status(
                session, name, now=now, devices=update.devices, applied_generations=update.applied,
                conditions=[(t, *c) for t, c in update.conditions.items()], topology=update.topology,
                fields=update.fields, new_events=update.events, observed_digest=update.observed_digest,
            )
        except NotFound:
            return False
    return True


def reported_digest(sessions: Sessions, name: str) -> str | None:
    """The digest the host's agent last reported, read now (heartbeats do not move the counter
    the views are kept by)."""
    with sessions() as session:
        return session.scalar(select(HostLease.observed_digest).where(HostLease.name == name))


def reported_digests(sessions: Sessions) -> dict[str, str]:
    """Host -> the digest its agent last reported (hosts whose agents report one)."""
    with sessions() as session:
        return hosts.reported_digests(session)


def host_names(sessions: Sessions) -> list[str]:
    with sessions() as session:
        return hosts.names(session)


def expire_leases(sessions: Sessions, now: datetime) -> list[str]:
    with sessions() as session:
        return hosts.expire_leases(session, now)


def profiles_and_hosts(sessions: Sessions, fleet: FleetState | None = None
                       ) -> tuple[list[Profile], list[hosts.Standing]]:
    """Every profile and how every host stands, for the profile summaries: from the in-memory
    fleet index when there is one (it reads only the hosts written since its last look; reading
    every host's status each pass cost seconds at 10,000 hosts)."""
    with sessions() as session:
        listed = profiles.list_profiles(session)[0]
        if fleet is None:
            return listed, hosts.standings(session)
    fleet.refresh()
    records, names = fleet.snapshot()
    standings = []
    for name in names:
        record = records[name]
        applied = record.conditions.get(hosts.APPLIED)  # (status, reason)
        standings.append(hosts.Standing(
            name, dict(record.labels), dict(record.applied),
            None if applied is None else {"status": applied[0], "reason": applied[1]}, record.rejected))
    return listed, standings


def write_profile_status(sessions: Sessions, name: str, status: dict[str, Any], now: datetime) -> None:
    # NotFound: deleted since it was read, nothing to report on.
    with sessions() as session, contextlib.suppress(NotFound):
        profiles.write_status(session, name, status, now)
