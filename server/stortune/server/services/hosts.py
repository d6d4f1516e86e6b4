"""Hosts: registration and leases of agents, labels, topology and status."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from stortune.schemas.profile import LabelSelector
from stortune.schemas.topology import Topology
from stortune.server.controller import request_reconcile
from stortune.server.db.tables import Host, HostConditionChange
from stortune.server.errors import NotFound
from stortune.server.models.agents import Heartbeat, Registration, TopologyUpload
from stortune.server.models.hosts import ConditionStatus, DeviceSetting
from stortune.server.services import events, finalizers
from stortune.server.services.versions import current_resource_version, next_resource_version

KIND = "Host"
READY = "Ready"


def _get(session: Session, name: str) -> Host:
    host = session.get(Host, name)
    if host is None:
        raise NotFound(KIND, name)
    return host


def get(session: Session, name: str) -> Host:
    return _get(session, name)


def list_hosts(session: Session, selector: LabelSelector | None = None) -> tuple[list[Host], int]:
    """Hosts by name, and the resourceVersion the list is as new as."""
    version = current_resource_version(session)
    rows = session.scalars(select(Host).order_by(Host.name)).all()
    return [h for h in rows if selector is None or selector.matches(h.effective_labels)], version


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
    else:
        conditions[conditions.index(current)] = entry
    host.status = {**host.status, "conditions": conditions}
    if type == READY:
        host.ready = status == "True"
    if transition:
        session.add(HostConditionChange(host=host.name, type=type, status=status, reason=reason,
                                        message=message, at=now))
    return True


def _store_topology(host: Host, topology: Topology, topology_hash: str) -> bool:
    digest = topology_hash or topology.structure_hash()
    changed = digest != host.topology_hash
    host.topology = topology.model_dump(mode="json")
    host.topology_hash = digest
    return changed


def register(
    session: Session, reg: Registration, *, lease_duration_s: float, now: datetime
) -> tuple[Host, bool]:
    """Create or refresh a host from its agent; returns it and whether its topology is wanted."""
    version = next_resource_version(session)
    host = session.get(Host, reg.name)
    expires = now + timedelta(seconds=lease_duration_s)
    boot_id = reg.facts.boot_id
    facts = reg.facts.model_dump(mode="json", exclude_none=True)
    if host is None:
        host = Host(
            name=reg.name, uid=str(uuid.uuid4()), labels={}, reported_labels=reg.labels,
            address=reg.address, facts=facts, topology=None, topology_hash=None, boot_id=boot_id,
            registered_at=now, last_heartbeat=now, lease_expires=expires, ready=False,
            resource_version=version, status={}, applied_generations={},
        )
        session.add(host)
        events.record(session, kind=KIND, name=host.name, host=host.name, type="Normal",
                      reason="Registered", message=f"agent at {reg.address} registered", now=now)
    else:
        if boot_id and host.boot_id and boot_id != host.boot_id:
            _rebooted(session, host, boot_id, now)
        host.reported_labels = reg.labels
        host.address = reg.address
        host.facts = facts
        host.boot_id = boot_id or host.boot_id
        host.last_heartbeat = now
        host.lease_expires = expires
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
    set_condition(session, host, type=READY, status="True", reason="AgentRegistered", message="",
                  now=now)
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


def heartbeat(
    session: Session, name: str, beat: Heartbeat, *, lease_duration_s: float, now: datetime
) -> tuple[datetime, bool]:
    """Renew the lease; returns its new expiry and whether the topology is wanted.

    The common case is one UPDATE. A host that was not Ready or came back with
    a new boot id takes a second, ordinary write transaction: starting it after
    the first commit keeps the lock order (counter first) of every other write.
    """
    expires = now + timedelta(seconds=lease_duration_s)
    renewed = session.execute(
        update(Host)
        .where(Host.name == name)
        .values(last_heartbeat=now, lease_expires=expires)
        .returning(Host.topology_hash, Host.boot_id, Host.ready)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    session.commit()
    if renewed is None:
        raise NotFound(KIND, name)
    stored_hash, boot_id, ready = renewed
    rebooted = bool(beat.boot_id) and bool(boot_id) and beat.boot_id != boot_id
    if rebooted or not ready:
        _revive(session, name, beat.boot_id if rebooted else None, now)
    return expires, stored_hash is None or stored_hash != beat.topology_hash


def _revive(session: Session, name: str, boot_id: str | None, now: datetime) -> None:
    version = next_resource_version(session)
    host = session.get(Host, name)
    if host is None:  # deleted between the two transactions
        session.rollback()
        return
    if boot_id is not None:
        _rebooted(session, host, boot_id, now)
    if set_condition(session, host, type=READY, status="True", reason="LeaseRenewed", message="",
                     now=now):
        # It was unreachable: whatever changed meanwhile must be looked at again.
        request_reconcile(session, [name], "lease renewed")
    host.resource_version = version
    session.commit()


def store_topology(session: Session, name: str, upload: TopologyUpload, now: datetime) -> tuple[Host, bool]:
    version = next_resource_version(session)
    host = _get(session, name)
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
        request_reconcile(session, [name], "labels changed")
    session.commit()
    return host


def delete(session: Session, name: str, now: datetime) -> Host:
    """Declare a host gone: profile finalizers stop waiting for it."""
    next_resource_version(session)
    host = _get(session, name)
    session.delete(host)
    events.record(session, kind=KIND, name=name, host=name, type="Normal", reason="Removed",
                  message="host declared gone; profiles no longer wait for it", now=now)
    session.flush()
    finalizers.release_finished(session, now)
    request_reconcile(session, [name], "host removed")
    session.commit()
    return host


def write_status(
    session: Session,
    name: str,
    *,
    now: datetime,
    devices: Sequence[DeviceSetting] | None = None,
    applied_generations: dict[str, int] | None = None,
    conditions: Sequence[tuple[str, ConditionStatus, str, str]] = (),
) -> Host:
    """What the reconciler learned about a host. Not part of the HTTP API.

    ``conditions`` holds (type, status, reason, message). A profile whose
    deletion waited only for this host is removed in the same transaction.
    """
    version = next_resource_version(session)
    host = _get(session, name)
    if devices is not None:
        host.status = {**host.status, "devices": [d.model_dump(mode="json") for d in devices]}
    if applied_generations is not None:
        host.applied_generations = dict(applied_generations)
    for type, status, reason, message in conditions:
        set_condition(session, host, type=type, status=status, reason=reason, message=message, now=now)
    host.resource_version = version
    session.flush()
    finalizers.release_finished(session, now)
    session.commit()
    return host


def expire_leases(session: Session, now: datetime) -> list[str]:
    """Mark Ready=False the hosts whose lease ran out; for the reconciler's periodic pass."""
    version = next_resource_version(session)
    lapsed = session.scalars(
        select(Host).where(Host.ready.is_(True), Host.lease_expires < now).order_by(Host.name)
    ).all()
    for host in lapsed:
        set_condition(session, host, type=READY, status="False", reason="LeaseExpired",
                      message=f"no heartbeat since {host.last_heartbeat.isoformat()}", now=now)
        host.resource_version = version
        events.record(session, kind=KIND, name=host.name, host=host.name, type="Warning",
                      reason="LeaseExpired", message="agent stopped renewing its lease", now=now)
    session.commit()
    return [h.name for h in lapsed]
