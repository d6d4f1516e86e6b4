"""Support bundles: the agent's bundle, the control plane's view of the host, one redaction.

The agent collects what only the host can see (topology, procfs, tool output)
and sends it unredacted. Here the bundle gains what only the control plane
knows: the settings as declared against what was observed, the profiles behind
them, the condition history, drift and correction events and the latest
benchmark results. The whole bundle is then redacted in one pass, so a serial
number is the same token in the agent's smartctl output and in the control
plane's settings table, and the mapping is kept in the ``redactions`` table.

The mapping is fleet-wide: a shared SAN's WWN is one token in every host's
bundle, which lets support correlate hosts without learning the value.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.schemas import stripecache
from stortune.schemas.bundle import Bundle, unpack
from stortune.schemas.redact import Kind, RedactionMapping, Redactor
from stortune.server.db.tables import BenchmarkRun, Event, Host, HostConditionChange, Redaction
from stortune.server.models.benchmarks import BenchmarkRunDocument
from stortune.server.models.events import EventView
from stortune.server.models.hosts import HostStatus
from stortune.server.services import analysis, profiles
from stortune.server.services.versions import next_resource_version

#: A bundle from an agent larger than this (unpacked) is refused.
MAX_UNPACKED_BYTES = 1 << 30
#: How much history goes into a bundle.
EVENT_LIMIT = 1000
CONDITION_LIMIT = 1000
#: The host's latest benchmark runs, with their results (fio's raw files stay out).
BENCHMARK_LIMIT = 10
_SOURCE: Final = "control-plane"
#: Event reasons that tell how the host strayed from what was declared, and came back.
DRIFT_REASONS = frozenset({"Drift", "Corrected", "AgentError", "Unreachable", "Reachable", "Restored"})


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()


def _events(session: Session, host: str) -> list[dict[str, Any]]:
    rows = session.scalars(select(Event).where(Event.host == host)
                           .order_by(Event.last_timestamp.desc(), Event.id.desc()).limit(EVENT_LIMIT))
    return [EventView.from_row(r).model_dump(mode="json") for r in rows]


def _conditions(session: Session, host: str) -> list[dict[str, Any]]:
    rows = session.scalars(select(HostConditionChange).where(HostConditionChange.host == host)
                           .order_by(HostConditionChange.at.desc(), HostConditionChange.id.desc())
                           .limit(CONDITION_LIMIT))
    return [{"at": r.at.isoformat(), "type": r.type, "status": r.status, "reason": r.reason,
             "message": r.message} for r in rows]


def _benchmarks(session: Session, host: str) -> list[dict[str, Any]]:
    rows = session.scalars(select(BenchmarkRun).where(BenchmarkRun.host == host)
                           .order_by(BenchmarkRun.seq.desc()).limit(BENCHMARK_LIMIT))
    return [BenchmarkRunDocument.from_row(r, with_result=True).model_dump(mode="json") for r in rows]


def add_control_plane_files(session: Session, host: Host, bundle: Bundle, now: datetime, *,
                            ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> None:
    """Put the control plane's knowledge of ``host`` into ``bundle`` (under control-plane/);
    ``ram_share``: the stripe cache share of RAM the analysis' checks hold arrays to."""
    status = HostStatus.from_row(host)
    selecting = profiles.selecting(session, host.effective_labels)
    events = _events(session, host.name)
    drift = [e for e in events if e["reason"] in DRIFT_REASONS]
    files: list[tuple[str, Any, str]] = [
        ("control-plane/host.json", {
            "name": host.name, "address": host.address, "labels": host.effective_labels,
            "registeredAt": host.registered_at.isoformat(), "bootId": host.boot_id,
            "topologyHash": host.topology_hash, "facts": host.facts, "collectedAt": now.isoformat(),
        }, "the host as registered, with its labels"),
        ("control-plane/settings.json", {
            "appliedGenerations": status.appliedGenerations,
            "settings": [d.model_dump(mode="json") for d in status.devices],
        }, "per device and tunable: desired, observed, and the profile and rule behind it"),
        ("control-plane/conditions.json", {
            "current": [c.model_dump(mode="json") for c in status.conditions],
            "history": _conditions(session, host.name),
        }, "Reachable, Applied, Drifted, Ready now and every transition, newest first"),
        ("control-plane/events.json", events, "every event about the host, newest first"),
        ("control-plane/drift.json", drift, "drift, corrections, failures and unreachable periods"),
        ("control-plane/profiles.json", [profiles.stored_document(p) for p in selecting],
         "the StorageProfiles selecting the host"),
        ("control-plane/benchmarks.json", _benchmarks(session, host.name),
         "the host's latest benchmark runs, newest first: results with their context"),
    ]
    if host.topology is not None:
        found = analysis.analyze(session, host.name, ram_share=ram_share).model_dump(mode="json")
        files.append(("control-plane/analysis.json", found,
                      "where the host's limits are: layer ceilings and their sources, layout checks,"
                      " slow members and path balance"))
    for path, data, what in files:
        bundle.add(path, _json(data), source=_SOURCE, origin=what)


def load_mapping(session: Session) -> RedactionMapping:
    values: dict[str, dict[str, str]] = {}
    for row in session.scalars(select(Redaction)):
        values.setdefault(row.kind, {})[row.token] = row.value
    return RedactionMapping.model_validate({"values": values})


def store_mapping(session: Session, before: RedactionMapping, after: RedactionMapping, host: str,
                  now: datetime) -> int:
    """Insert the tokens ``after`` has and ``before`` had not; returns how many."""
    added = 0
    for kind, tokens in after.values.items():
        known = before.values.get(kind, {})
        for token, value in tokens.items():
            if token not in known:
                session.add(Redaction(token=token, kind=kind, value=value, host=host, created_at=now))
                added += 1
    return added


def known_values(host: Host) -> Iterable[tuple[Kind, str]]:
    """What identifies the host to the control plane, beyond what the bundle's topology names."""
    yield "hostname", host.name
    # the whole HOST:PORT the control plane dials (a loopback or link-local host part included)
    yield "address", host.address
    if host.boot_id:
        yield "bootid", host.boot_id
    boot_id = host.facts.get("boot_id")
    if isinstance(boot_id, str) and boot_id:
        yield "bootid", boot_id
    hostname = host.facts.get("hostname")
    if isinstance(hostname, str) and hostname:
        yield "hostname", hostname
    address = host.address.rpartition(":")[0].strip("[]")
    if address:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            yield "hostname", address
        else:
            yield "ip", address


def build(session: Session, host: Host, agent_bundle: bytes, now: datetime, *,
          redact: bool, ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> tuple[Bundle, int]:
    """The bundle to hand out, and how many new tokens the mapping gained (committed).

    Redaction runs outside any write (a large bundle takes seconds); the new
    mapping rows are then stored in a write transaction that takes the lock
    first (db/engine.py). Tokens are numbered per kind, so if another bundle
    added tokens in the meantime this one is redacted again under the lock.
    """
    bundle = unpack(agent_bundle, max_bytes=MAX_UNPACKED_BYTES)
    add_control_plane_files(session, host, bundle, now, ram_share=ram_share)
    if not redact:
        return bundle, 0
    name, known = host.name, list(known_values(host))
    before = load_mapping(session)
    redacted, after = _redacted(bundle, before, known)
    session.rollback()
    next_resource_version(session)
    current = load_mapping(session)
    if current != before:
        before = current
        redacted, after = _redacted(bundle, before, known)
    added = store_mapping(session, before, after, name, now)
    session.commit()
    return redacted, added


def _redacted(bundle: Bundle, mapping: RedactionMapping,
              known: list[tuple[Kind, str]]) -> tuple[Bundle, RedactionMapping]:
    redactor = Redactor(mapping)
    for kind, value in known:
        redactor.add(kind, value)
    return redactor.redact(bundle), redactor.mapping


def list_redactions(session: Session, *, host: str | None = None,
                    tokens: Iterable[str] = ()) -> list[Redaction]:
    stmt = select(Redaction)
    if host is not None:
        stmt = stmt.where(Redaction.host == host)
    wanted = sorted(set(tokens))
    if wanted:
        stmt = stmt.where(Redaction.token.in_(wanted))
    return list(session.scalars(stmt.order_by(Redaction.kind, Redaction.token)))
