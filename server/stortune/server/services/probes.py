"""Probes of a host's device: start through the agent, keep the row, refresh it from the agent
until it is finished, and hand the host analysis the ceilings the done probes measured."""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.api.agent.wire import BenchmarkProgress
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.analysis.probe import ProbeResult
from stortune.schemas.bench.target import beneath
from stortune.schemas.protection import topology_refusals
from stortune.schemas.topology import is_device_name
from stortune.server.db.tables import Probe
from stortune.server.errors import BadRequest, Cause, Invalid, NotFound
from stortune.server.services.hosts import stored_topology
from stortune.server.services.versions import next_resource_version

KIND = "Probe"
TERMINAL = frozenset({"done", "failed", "cancelled"})
MAX_LISTED = 200


def new_probe_id() -> str:
    """The agent takes probe ids that start with "probe-" (benchmark runs never do)."""
    return f"probe-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def check_request(consent: bool, device: str | None, topology: dict[str, Any] | None) -> None:
    """400 naming ``consent`` or ``device`` (a path, not a kernel name); 422 naming ``device``
    for a device the host's last reported topology does not have or protects (or lies on one it
    protects). The agent checks again."""
    if consent is not True:
        raise BadRequest("consent: a probe loads the host's disks with reads for a while; send"
                         ' "consent": true to run it')
    if device is None:
        return
    if not is_device_name(device):
        raise BadRequest(f"device: {device!r} is not a kernel block device name (e.g. md126, sdb,"
                         " dm-3); a probe takes a device of the host, never a path")
    if topology is not None:
        known = stored_topology(topology)  # None: stored before the model's bounds
        if known is not None and known.device(device) is None:
            raise Invalid([Cause("device", f"{device!r} is not a block device of this host"
                                           " (GET /api/v1/hosts/{name} lists them)")], kind=KIND)
        if known is not None:  # a preview of the agent's refusal, from what the host reported
            refused = topology_refusals(known, [b.device for b in beneath(known, device)], "probe")
            if refused:
                raise Invalid([Cause("device", r) for r in refused], kind=KIND)


def create(session: Session, probe_id: str, host: str, device: str | None, *, requested_by: str,
           progress: BenchmarkProgress, now: datetime) -> Probe:
    next_resource_version(session)  # a write's first statement: it takes the write lock (db/engine.py)
    row = Probe(id=probe_id, host=host, device=device, requested_by=requested_by,
                state=progress.state, message=progress.message, created_at=now, updated_at=now,
                finished_at=now if progress.finished else None, result=None)
    session.add(row)
    session.flush()
    return row


def get_for_update(session: Session, host: str, probe_id: str) -> Probe:
    """The row, in a transaction that holds the write lock first. On SQLite a transaction that
    read first and writes later fails at once ("database is locked") when another writer
    committed in between; a follower storing a finished probe met exactly that."""
    next_resource_version(session)
    return get(session, host, probe_id)


def get(session: Session, host: str, probe_id: str) -> Probe:
    row = session.scalars(select(Probe).where(Probe.id == probe_id, Probe.host == host)).first()
    if row is None:
        raise NotFound(KIND, probe_id)
    return row


def list_probes(session: Session, host: str, limit: int = MAX_LISTED) -> list[Probe]:
    query = select(Probe).where(Probe.host == host).order_by(Probe.seq.desc()).limit(limit)
    return list(session.scalars(query))


def refresh(session: Session, row: Probe, progress: BenchmarkProgress, result: ProbeResult | None,
            now: datetime) -> None:
    """What the agent says now; a finished probe's result is stored once, then kept."""
    if row.state in TERMINAL and row.result is not None:
        return
    row.state, row.message, row.updated_at = progress.state, progress.message, now
    if result is not None:
        row.state, row.message = result.state, result.message
        row.result = result.model_dump(mode="json")
    if row.state in TERMINAL and row.finished_at is None:
        row.finished_at = now


def result_of(row: Probe) -> ProbeResult | None:
    """The stored result; None when there is none or it no longer validates (an older agent's)."""
    if row.result is None:
        return None
    try:
        return ProbeResult.model_validate(row.result)
    except ValidationError:
        return None


#: Done probes whose ceilings the analysis reads, newest first: loaded on every analysis, so
#: bounded (a host probed every day for years keeps them all).
MAX_MEASURED_PROBES = 200


def measured(session: Session, host: str) -> list[MeasuredCeiling]:
    """The latest measured ceiling per device over the host's latest done probes: what the
    host analysis takes as measured ceilings."""
    rows = list(session.scalars(select(Probe).where(Probe.host == host, Probe.state == "done")
                                .order_by(Probe.seq.desc()).limit(MAX_MEASURED_PROBES)))
    latest: dict[str, MeasuredCeiling] = {}
    for row in reversed(rows):  # oldest first: a later probe's figure replaces an earlier one
        result = result_of(row)
        if result is not None:
            latest.update({c.device: c for c in result.ceilings})
    return [latest[d] for d in sorted(latest)]
