"""Hosts: registration and leases of agents, labels, topology and status."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from pydantic import ValidationError
from sqlalchemy import Table, bindparam, or_, select, update
from sqlalchemy import delete as sa_delete
from sqlalchemy.orm import Session, defer

from stortune.schemas.profile import LabelSelector
from stortune.schemas.topology import Topology
from stortune.server.controller import request_reconcile
from stortune.server.db.tables import AgentIdentity, Host, HostConditionChange, HostLease
from stortune.server.errors import NotFound
from stortune.server.models.agents import Heartbeat, Registration, TopologyUpload
from stortune.server.models.hosts import ConditionStatus, DeviceSetting, rejected_profiles
from stortune.server.services import events, finalizers, host_keys, rollouts
from stortune.server.services.events import EventType
from stortune.server.services.host_keys import Proof
from stortune.server.services.versions import next_resource_version

KIND = "Host"
# Reachable: the lease (heartbeats) and the reconciler's calls to the agent.
# Applied, Drifted: the reconciler. Ready is derived from those three, here only.
REACHABLE = "Reachable"
APPLIED = "Applied"
DRIFTED = "Drifted"
READY = "Ready"


def _get(session: Session, name: str) -> Host:
    host = session.get(Host, name)
    if host is None:
        raise NotFound(KIND, name)
    return host


def get(session: Session, name: str, *, with_topology: bool = True) -> Host:
    if with_topology:
        return _get(session, name)
    host = session.get(Host, name, options=[defer(Host.topology)])
    if host is None:
        raise NotFound(KIND, name)
    return host


def lease(session: Session, name: str) -> tuple[HostLease, bool]:
    """The host's lease and whether it has run out (Reachable=False until the next heartbeat)."""
    row = session.execute(select(HostLease, Host.lease_expired).join(Host, Host.name == HostLease.name)
                          .where(HostLease.name == name)).one_or_none()
    if row is None:
        raise NotFound(KIND, name)
    return row[0], row[1]


def resource_version(session: Session, name: str) -> int:
    found = session.scalar(select(Host.resource_version).where(Host.name == name))
    if found is None:
        raise NotFound(KIND, name)
    return found


def rows(session: Session, names: Sequence[str]) -> list[Host]:
    """The named hosts that exist (topologies not loaded)."""
    if not names:
        return []
    return list(session.scalars(select(Host).options(defer(Host.topology)).where(Host.name.in_(names))))


def labels_of(session: Session, name: str) -> dict[str, str] | None:
    """The host's effective labels (what selectors see), or None when there is no such host."""
    row = session.execute(select(Host.labels, Host.reported_labels).where(Host.name == name)).one_or_none()
    return None if row is None else {**row[1], **row[0]}


def names(session: Session) -> list[str]:
    return list(session.scalars(select(Host.name).order_by(Host.name)))


@dataclass(frozen=True)
class Standing:
    """How a host stands with its profiles: what profile summaries count."""

    name: str
    labels: dict[str, str]
    applied: dict[str, int]
    applied_condition: dict[str, Any] | None
    #: Profiles with a setting the host cannot set (an error in its settings table).
    rejected: frozenset[str] = frozenset()


def standings(session: Session) -> list[Standing]:
    rows = session.execute(select(Host.name, Host.labels, Host.reported_labels, Host.applied_generations,
                                  Host.status).order_by(Host.name)).all()
    return [Standing(name, {**reported, **api}, applied,
                     next((c for c in status.get("conditions", []) if c["type"] == APPLIED), None),
                     rejected_profiles(status))
            for name, api, reported, applied, status in rows]


def labels_by_host(session: Session) -> dict[str, dict[str, str]]:
    rows = session.execute(select(Host.name, Host.labels, Host.reported_labels)).all()
    return {name: {**reported, **api} for name, api, reported in rows}


def select_names(session: Session, selector: LabelSelector | None) -> list[str]:
    if selector is None:
        return []
    return sorted(name for name, labels in labels_by_host(session).items() if selector.matches(labels))


def set_condition(
    session: Session, host: Host, *, type: str, status: ConditionStatus, reason: str, message: str,
    now: datetime,
) -> bool:
    """Set one condition; part of the caller's transaction (which also bumps resourceVersion).

    lastTransitionTime moves only when the status flips. A change of status or
    reason is appended to the history the diagnostics read; a message-only
    change is not a transition.
    """
    conditions: list[dict[str, Any]] = [dict(c) for c in host.status.get("conditions", [])]
    current = next((c for c in conditions if c["type"] == type), None)
    if current is not None and (current["status"], current["reason"], current["message"]) == (
        status, reason, message,
    ):
        return False
    if current is None or current["status"] != status:
        since, transition = now.isoformat(), True
    else:
        since, transition = current["lastTransitionTime"], current["reason"] != reason
    entry = {"type": type, "status": status, "reason": reason, "message": message,
             "lastTransitionTime": since}
    if current is None:
        conditions.append(entry)
        conditions.sort(key=lambda c: _ORDER.get(c["type"], len(_ORDER)))
    else:
        conditions[conditions.index(current)] = entry
    host.status = {**host.status, "conditions": conditions}
    if type == READY:
        host.ready = status == "True"
    if transition:
        session.add(HostConditionChange(host=host.name, type=type, status=status, reason=reason,
                                        message=message, at=now))
    return True


_ORDER = {READY: 0, REACHABLE: 1, APPLIED: 2, DRIFTED: 3}
# (condition, the status that makes the host not Ready), in the order Ready reports them.
_BLOCKERS = ((REACHABLE, "False"), (APPLIED, "False"), (DRIFTED, "True"))


def ready_from(conditions: Sequence[Mapping[str, Any]]) -> tuple[ConditionStatus, str, str]:
    """Ready = Reachable and Applied and not Drifted, as (status, reason, message).

    Not Ready carries the first blocking condition's reason, so a listing says
    why (LeaseExpired, Rejected, Drift...). Unknown until each of the three is known.
    """
    by_type = {c["type"]: c for c in conditions}
    for type, blocking in _BLOCKERS:
        c = by_type.get(type)
        if c is not None and c["status"] == blocking:
            return "False", c["reason"], f"{type}={blocking}: {c['message']}".rstrip(": ")
    if all(type in by_type and by_type[type]["status"] != "Unknown" for type, _ in _BLOCKERS):
        return "True", "Reconciled", ""
    missing = [type for type, _ in _BLOCKERS if by_type.get(type, {}).get("status", "Unknown") == "Unknown"]
    return "Unknown", "Reconciling", "not known yet: " + ", ".join(missing)


def _settle_ready(session: Session, host: Host, now: datetime) -> None:
    status, reason, message = ready_from(host.status.get("conditions", []))
    set_condition(session, host, type=READY, status=status, reason=reason, message=message, now=now)


def stored_topology(raw: Mapping[str, Any] | None) -> Topology | None:
    """A host's stored topology, or None when there is none or it no longer validates (stored by
    an older server, before the model's limits): the reconciler then asks the agent again."""
    if raw is None:
        return None
    try:
        return Topology.model_validate(raw)
    except ValidationError:
        return None


def _store_topology(host: Host, topology: Topology, topology_hash: str) -> bool:
    digest = topology_hash or topology.structure_hash()
    changed = digest != host.topology_hash
    host.topology = topology.model_dump(mode="json")
    host.topology_hash = digest
    return changed


def register(
    session: Session, reg: Registration, *, proof: Proof, lease_duration_s: float, now: datetime
) -> tuple[Host, bool]:
    """Create or refresh a host from its agent; returns it and whether its topology is wanted.

    A new name is pinned to the key ``proof`` presents; an enrolled one is refreshed only by a
    call that proves it (Conflict otherwise, and nothing changes).
    """
    version = next_resource_version(session)
    host = session.get(Host, reg.name)
    if host is not None and not proof.proves(host.host_key_sha256):
        session.rollback()
        raise host_keys.taken(reg.name, proof)
    expires = now + timedelta(seconds=lease_duration_s)
    boot_id = reg.facts.boot_id
    facts = reg.facts.model_dump(mode="json", exclude_none=True)
    if host is None:
        host = Host(
            name=reg.name, uid=str(uuid.uuid4()), labels={}, reported_labels=reg.labels,
            address=reg.address, facts=facts, topology=None, topology_hash=None, boot_id=boot_id,
            registered_at=now, ready=False, host_key_sha256=proof.pin(reg.name),
            lease_expired=False, resource_version=version, status={}, applied_generations={},
        )
        session.add(host)
        session.add(HostLease(name=reg.name, renew_time=now, expire_time=expires,
                              observed_digest=reg.observed_digest))
        events.record(session, kind=KIND, name=host.name, host=host.name, type="Normal",
                      reason="Registered", message=f"agent at {reg.address} registered", now=now)
    else:
        if host.host_key_sha256 is None:  # registered before host keys, or by an admin: pinned now
            host.host_key_sha256 = proof.pin(reg.name)
        if boot_id and host.boot_id and boot_id != host.boot_id:
            _rebooted(session, host, boot_id, now)
        host.reported_labels = reg.labels
        host.address = reg.address
        host.facts = facts
        host.boot_id = boot_id or host.boot_id
        session.merge(HostLease(name=host.name, renew_time=now, expire_time=expires,
                                observed_digest=reg.observed_digest))
        host.lease_expired = False
        # A restarted (perhaps upgraded) agent may accept what it refused before.
        host.status = {k: v for k, v in host.status.items() if k != "refusedGenerations"}
        host.resource_version = version
        events.record(session, kind=KIND, name=host.name, host=host.name, type="Normal",
                      reason="Reregistered", message=f"agent at {reg.address} registered again",
                      now=now)
    if reg.topology is not None:
        if _store_topology(host, reg.topology, reg.topology_hash):
            events.record(session, kind=KIND, name=host.name, host=host.name, type="Normal",
                          reason="TopologyChanged", message=f"topology {host.topology_hash}", now=now)
        wanted = False
    else:
        wanted = host.topology is None or host.topology_hash != reg.topology_hash
    set_condition(session, host, type=REACHABLE, status="True", reason="AgentRegistered", message="",
                  now=now)
    _settle_ready(session, host, now)
    rollouts.host_selected(session, host.name, host.effective_labels, now)
    request_reconcile(session, [host.name], "agent registered")
    session.commit()
    return host, wanted


def _rebooted(session: Session, host: Host, boot_id: str, now: datetime) -> None:
    host.boot_id = boot_id
    host.facts = {**host.facts, "boot_id": boot_id}
    events.record(session, kind=KIND, name=host.name, host=host.name, type="Normal",
                  reason="Rebooted", message=f"boot id {boot_id}: settings reset by the reboot",
                  now=now)
    request_reconcile(session, [host.name], "host rebooted")


# The heartbeat's two statements, built once and run as plain table statements: every
# agent sends one every few seconds, and the ORM's bulk-update machinery cost a
# heartbeat about twice the CPU of the statements themselves.
_LEASES, _HOSTS = cast(Table, HostLease.__table__), cast(Table, Host.__table__)
_RENEW = (update(_LEASES).where(_LEASES.c.name == bindparam("host"))
          .values(renew_time=bindparam("renew"), expire_time=bindparam("expire"))
          .returning(_LEASES.c.name))
# Only when it differs: a row back says the agent reported new values.
_NEW_DIGEST = (update(_LEASES).where(_LEASES.c.name == bindparam("host"))
               .where(or_(_LEASES.c.observed_digest.is_(None),
                          _LEASES.c.observed_digest != bindparam("digest")))
               .values(observed_digest=bindparam("digest")).returning(_LEASES.c.name))
_SEEN_AS = select(_HOSTS.c.topology_hash, _HOSTS.c.boot_id, _HOSTS.c.lease_expired,
                  _HOSTS.c.host_key_sha256).where(_HOSTS.c.name == bindparam("host"))


def heartbeat(
    session: Session, name: str, beat: Heartbeat, *, proof: Proof, lease_duration_s: float,
    now: datetime,
) -> tuple[datetime, bool]:
    """Renew the lease; returns its new expiry and whether the topology is wanted.

    The common case is one UPDATE and one SELECT, which also reads the host's pinned key: a
    call that does not prove it is Forbidden and its transaction rolled back, so the lease
    is not renewed. (The UPDATE stays first: on SQLite a transaction that read before it
    wrote would fail at once whenever another writer committed in between, db/engine.py.)
    A host whose lease had expired or that came back with a new boot id takes a second,
    ordinary write transaction: starting it after the first commit keeps the lock order
    (counter first) of every other write.
    """
    expires = now + timedelta(seconds=lease_duration_s)
    renewed = session.execute(_RENEW, {"host": name, "renew": now, "expire": expires}).one_or_none()
    known = session.execute(_SEEN_AS, {"host": name}).one_or_none()
    if renewed is None or known is None:
        session.rollback()
        raise NotFound(KIND, name)
    stored_hash, boot_id, lapsed, pinned = known
    if not proof.proves(pinned):
        session.rollback()
        raise host_keys.forbidden(name, proof, "heartbeat")
    if beat.observed_digest is not None and session.execute(
            _NEW_DIGEST, {"host": name, "digest": beat.observed_digest}).first() is not None:
        # Its values changed (drift, a hand-made change, an apply's): look now, not at the next pass.
        request_reconcile(session, [name], "agent reported new values")
    session.commit()
    rebooted = bool(beat.boot_id) and bool(boot_id) and beat.boot_id != boot_id
    if rebooted or lapsed:
        _revive(session, name, beat.boot_id if rebooted else None, now)
    return expires, stored_hash is None or stored_hash != beat.topology_hash


def revive(session: Session, name: str, now: datetime) -> None:
    """The host whose lease was declared expired is there after all (its watch is held)."""
    _revive(session, name, None, now)


def _revive(session: Session, name: str, boot_id: str | None, now: datetime) -> None:
    version = next_resource_version(session)
    host = session.get(Host, name)
    if host is None:  # deleted between the two transactions
        session.rollback()
        return
    if boot_id is not None:
        _rebooted(session, host, boot_id, now)
    if host.lease_expired:
        host.lease_expired = False
        set_condition(session, host, type=REACHABLE, status="True", reason="LeaseRenewed", message="",
                      now=now)
        _settle_ready(session, host, now)
        # It was away: whatever changed meanwhile must be looked at again.
        request_reconcile(session, [name], "lease renewed")
    host.resource_version = version
    session.commit()


def store_topology(session: Session, name: str, upload: TopologyUpload, *, proof: Proof,
                   now: datetime) -> tuple[Host, bool]:
    version = next_resource_version(session)
    host = _get(session, name)
    if not proof.proves(host.host_key_sha256):
        session.rollback()
        raise host_keys.forbidden(name, proof, "topology upload")
    changed = _store_topology(host, upload.topology, upload.topology_hash)
    host.resource_version = version
    if changed:
        events.record(session, kind=KIND, name=name, host=name, type="Normal", reason="TopologyChanged",
                      message=f"topology {host.topology_hash}", now=now)
        request_reconcile(session, [name], "topology changed")
    session.commit()
    return host, changed


def set_labels(
    session: Session, name: str, labels: dict[str, str | None], *, merge: bool, now: datetime
) -> Host:
    """Replace the API-set labels, or merge-patch them (a None value removes the key)."""
    version = next_resource_version(session)
    host = _get(session, name)
    wanted = {k: v for k, v in {**(host.labels if merge else {}), **labels}.items() if v is not None}
    if wanted == host.labels:
        session.rollback()
        return host
    before = host.effective_labels
    host.labels = wanted
    host.resource_version = version
    events.record(session, kind=KIND, name=name, host=name, type="Normal", reason="LabelsChanged",
                  message=f"labels set through the API: {wanted}", now=now)
    if host.effective_labels != before:
        rollouts.host_selected(session, name, host.effective_labels, now)
        request_reconcile(session, [name], "labels changed")
    session.commit()
    return host


def check_enrolled_key(session: Session, name: str, proof: Proof) -> None:
    """Conflict unless ``proof`` may act for host ``name`` (any call may for a name not enrolled)."""
    pinned = session.scalar(select(Host.host_key_sha256).where(Host.name == name))
    # A read-only transaction, ended here: on SQLite a write that follows a read in the same
    # transaction fails at once when another writer committed in between (db/engine.py).
    session.rollback()
    if not proof.proves(pinned):
        raise host_keys.taken(name, proof)


def delete(session: Session, name: str, now: datetime) -> Host:
    """Declare a host gone: profile finalizers stop waiting for it (and its key pin goes with it)."""
    next_resource_version(session)
    host = _get(session, name)
    session.delete(host)
    # Its name is free again: a reinstalled machine (a new key) may obtain a certificate for it.
    session.execute(sa_delete(AgentIdentity).where(AgentIdentity.name == name))
    rollouts.host_removed(session, name, now)  # a machine registered again under the name is a new host
    events.record(session, kind=KIND, name=name, host=name, type="Normal", reason="Removed",
                  message="host declared gone; profiles no longer wait for it", now=now)
    session.flush()
    finalizers.release_finished(session, now)
    request_reconcile(session, [name], "host removed")
    session.commit()
    return host


@dataclass(frozen=True)
class StatusEvent:
    """An event the reconciler records with a status write; about the host unless ``on_profile``."""

    type: EventType
    reason: str
    message: str
    profile: str | None = None
    on_profile: bool = False


def write_status(
    session: Session,
    name: str,
    *,
    now: datetime,
    devices: Sequence[DeviceSetting] | None = None,
    applied_generations: Mapping[str, int] | None = None,
    conditions: Sequence[tuple[str, ConditionStatus, str, str]] = (),
    topology: tuple[Topology, str] | None = None,
    fields: Mapping[str, Any] | None = None,
    new_events: Sequence[StatusEvent] = (),
    observed_digest: str | None = None,
) -> Host:
    """What the reconciler learned about a host. Not part of the HTTP API; never touches spec.

    ``conditions`` holds (type, status, reason, message); Ready is derived from
    them. ``fields`` are other status keys (a None value removes one).
    ``topology`` is (topology, structure hash) as the agent reported it. A
    profile whose deletion waited only for this host is removed in the same
    transaction.
    """
    version = next_resource_version(session)
    host = _get(session, name)
    if devices is not None:
        host.status = {**host.status, "devices": [d.model_dump(mode="json") for d in devices]}
    if fields:
        merged = {**host.status, **fields}
        host.status = {k: v for k, v in merged.items() if v is not None}
    if applied_generations is not None:
        host.applied_generations = dict(applied_generations)
    if topology is not None and _store_topology(host, *topology):
        events.record(session, kind=KIND, name=name, host=name, type="Normal", reason="TopologyChanged",
                      message=f"topology {host.topology_hash}", now=now)
    for type, status, reason, message in conditions:
        set_condition(session, host, type=type, status=status, reason=reason, message=message, now=now)
    _settle_ready(session, host, now)
    for e in new_events:
        kind, involved = ("StorageProfile", e.profile) if e.on_profile and e.profile else (KIND, name)
        events.record(session, kind=kind, name=involved, host=name, profile=e.profile, type=e.type,
                      reason=e.reason, message=e.message, now=now)
    host.resource_version = version
    session.flush()
    if observed_digest is not None:  # only for an agent that reports digests itself
        reporting = HostLease.observed_digest.is_not(None)
        session.execute(update(HostLease).where(HostLease.name == name, reporting)
                        .values(observed_digest=observed_digest).execution_options(synchronize_session=False))
    finalizers.release_finished(session, now)
    session.commit()
    return host


def reported_digests(session: Session) -> dict[str, str]:
    """Host -> the digest of the values its agent last reported (or an apply left)."""
    rows = session.execute(select(HostLease.name, HostLease.observed_digest)
                           .where(HostLease.observed_digest.is_not(None)))
    return {name: digest for name, digest in rows if digest is not None}


def expire_leases(session: Session, now: datetime) -> list[str]:
    """Mark Reachable=False the hosts whose lease ran out; for the reconciler's periodic pass."""
    overdue = (Host.lease_expired.is_(False), HostLease.expire_time < now)
    # Looked up first in a read-only transaction so that an idle pass writes
    # nothing (no resourceVersion churn); the write below takes the lock first.
    any_due = session.scalars(select(HostLease.name).join(Host, Host.name == HostLease.name)
                              .where(*overdue).limit(1)).first()
    session.rollback()
    if any_due is None:
        return []
    version = next_resource_version(session)
    lapsed = session.execute(select(Host, HostLease.renew_time).join(HostLease, Host.name == HostLease.name)
                             .where(*overdue).order_by(Host.name)).all()
    for host, renewed in lapsed:
        host.lease_expired = True
        set_condition(session, host, type=REACHABLE, status="False", reason="LeaseExpired",
                      message=f"no heartbeat since {renewed.isoformat()}", now=now)
        _settle_ready(session, host, now)
        host.resource_version = version
        events.record(session, kind=KIND, name=host.name, host=host.name, type="Warning",
                      reason="LeaseExpired", message="agent stopped renewing its lease", now=now)
    session.commit()
    return [h.name for h, _ in lapsed]
