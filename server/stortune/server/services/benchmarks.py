"""Benchmark runs: validating specs, choosing hosts, the run queue's rows and their results.

A run is one row from the moment it is asked for (``queued``) until its
result is stored (``done``, ``failed``, ``cancelled``). The API creates and
cancels runs; the dispatcher (``stortune.server.bench``) moves them along
through the functions at the end of this module. Every write transaction
begins with a write (an INSERT or a conditional UPDATE), never a read: on
SQLite a transaction that read first and writes later fails at once when
another writer committed in between, and benchmark rows are written often
(progress). Benchmark writes do not bump resourceVersion: they change no
profile or host, so cached host listings stay valid while runs report progress.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select, update
from sqlalchemy.orm import Session, defer

from stortune.schemas import protection
from stortune.schemas.bench.results import TERMINAL_STATES, BenchmarkResult
from stortune.schemas.bench.safety import write_refusals
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.bench.steps import TargetFacts, WorkloadStep
from stortune.schemas.bench.target import beneath, facts
from stortune.schemas.documents import DocumentError
from stortune.schemas.matching import mismatch
from stortune.schemas.profile import LabelSelector
from stortune.schemas.topology import DeviceKind, Topology
from stortune.server.agentclient import BenchmarkOutcome, BenchmarkProgress
from stortune.server.controller import request_reconcile
from stortune.server.db.tables import BenchmarkRawFile, BenchmarkRun, Host
from stortune.server.errors import Cause, Invalid, NotFound
from stortune.server.models.common import unstorable
from stortune.server.services import hosts

KIND: Final = "BenchmarkRun"
SPEC_KIND: Final = "BenchmarkSpec"
ACTIVE: Final = ("queued", "running")
#: Paths of raw files longer than this are cut (the column's size).
_MAX_PATH = 512


# -- specs and hosts ---------------------------------------------------------------------------
def validate(data: Any) -> BenchmarkSpec:
    """A request body -> BenchmarkSpec, or Invalid naming each bad field by its path."""
    meta = data.get("metadata") if isinstance(data, dict) else None
    name = meta.get("name") if isinstance(meta, dict) and isinstance(meta.get("name"), str) else None
    found = unstorable(data)
    if found:
        raise Invalid([found], kind=SPEC_KIND, name=name)
    try:
        return parse_benchmark(data)
    except DocumentError as exc:
        raise Invalid([Cause(p.path, p.message) for p in exc.problems], kind=SPEC_KIND, name=name) from None


def _host_row(session: Session, name: str) -> Host:
    row = session.get(Host, name, options=[defer(Host.topology)])
    if row is None:
        raise NotFound(hosts.KIND, name)
    return row


def select_hosts(session: Session, spec: BenchmarkSpec, host: str | None,
                 scope: LabelSelector | None = None) -> list[str]:
    """The hosts a request runs on: ``host`` alone (which the spec's selector, if any, must
    match), or every host ``spec.hostSelector`` matches. Invalid when none would run.

    ``scope`` (a support token's selector) hides the hosts outside it, as if they did not exist.
    """
    selector = spec.spec.hostSelector
    if host is not None:
        row = _host_row(session, host)
        labels = row.effective_labels
        if scope is not None and not scope.matches(labels):
            raise NotFound(hosts.KIND, host)
        if selector is not None and not selector.matches(labels):
            raise Invalid([Cause("spec.hostSelector", f"does not match host {host!r} (labels "
                                 f"{labels or '{}'}); drop ?host= or change the selector")],
                          kind=SPEC_KIND, name=spec.name)
        return [host]
    if selector is None:
        raise Invalid([Cause("spec.hostSelector", "required by the control plane: name the hosts to "
                             "run on with matchLabels or matchExpressions, or give ?host=NAME")],
                      kind=SPEC_KIND, name=spec.name)
    names = sorted(name for name, labels in hosts.labels_by_host(session).items()
                   if selector.matches(labels) and (scope is None or scope.matches(labels)))
    if not names:
        raise Invalid([Cause("spec.hostSelector", "matches no registered host")],
                      kind=SPEC_KIND, name=spec.name)
    return names


@dataclass(frozen=True)
class HostPreview:
    """What a dry run shows for one host: the target found in its last topology and the steps."""

    host: str
    target: str | None
    steps: list[WorkloadStep]
    problems: list[str]
    #: What the agent would refuse, as far as the host's last topology tells (the run would fail).
    refusals: list[str] = field(default_factory=list)


def _target(spec: BenchmarkSpec, topology: Topology | None) -> tuple[str | None, TargetFacts, list[str]]:
    target = spec.spec.target
    if target.file is not None:
        return target.file.path, TargetFacts(kind="file"), []
    if topology is None:
        return None, TargetFacts(), ["the host has not reported its topology yet: steps use defaults"]
    assert target.device is not None
    chosen = [d for d in topology.devices
              if d.kind is not DeviceKind.HOST and mismatch(target.device, d) is None]
    if len(chosen) != 1:
        listed = ", ".join(d.name for d in chosen[:8])
        why = ("spec.target.device matches no device of this host" if not chosen else
               f"spec.target.device matches {len(chosen)} devices ({listed}); a run needs exactly one")
        return None, TargetFacts(), [why]
    return chosen[0].name, facts(topology, chosen[0].name), []


def preview(session: Session, spec: BenchmarkSpec, names: Sequence[str]) -> list[HostPreview]:
    """The steps each host would run, expanded against the topology it last reported."""
    out = []
    for name in names:
        raw = session.scalar(select(Host.topology).where(Host.name == name))
        topology = hosts.stored_topology(raw)
        target, target_facts, problems = _target(spec, topology)
        steps = spec.steps(target_facts)
        refused = _refusals(spec, topology, target, steps) if topology is not None and target else []
        out.append(HostPreview(name, target, steps, problems, refused))
    return out


def _refusals(spec: BenchmarkSpec, topology: Topology, target: str,
              steps: Sequence[WorkloadStep]) -> list[str]:
    """The agent's refusals a topology answers: the same functions the agent calls, with the
    protected devices the host reported. The signatures wipefs finds are the agent's to add when
    the run starts."""
    dev = topology.device(target) if spec.spec.target.device is not None else None
    if dev is None:
        return []
    found = protection.topology_refusals(topology, [b.device for b in beneath(topology, target)], "benchmark")
    return found + write_refusals(dev, steps, spec.spec.allowDestructive)


# -- runs: creating, reading, cancelling ---------------------------------------------------------
def new_run_id(now: datetime) -> str:
    """Sortable by time, unique by its random part; fits the agent's run-id rule."""
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"


def queued_run(spec: BenchmarkSpec, host: str, *, requested_by: str, now: datetime,
               schedule: str | None = None) -> BenchmarkRun:
    """A new row for the queue (not added to any session)."""
    return BenchmarkRun(
        id=new_run_id(now), name=spec.name, host=host, spec=spec.document(), requested_by=requested_by,
        schedule=schedule, state="queued", message="queued", progress={}, created_at=now,
        updated_at=now, started_at=None, finished_at=None, cancel_requested_at=None, attempts=0,
        not_before=None, unreachable_since=None, agent_holds=False, profiles={}, kernel=None,
        fio_version=None, topology_hash=None, passed=None, result=None, experiment=None,
    )


def create_runs(session: Session, spec: BenchmarkSpec, names: Sequence[str], *, requested_by: str,
                now: datetime, schedule: str | None = None) -> list[BenchmarkRun]:
    """One queued run per host, in one transaction."""
    session.commit()  # end the reads that chose the hosts: this transaction starts with its INSERT
    rows = [queued_run(spec, name, requested_by=requested_by, now=now, schedule=schedule) for name in names]
    session.add_all(rows)
    session.commit()
    return rows


def get(session: Session, run_id: str, *, with_result: bool = True) -> BenchmarkRun:
    options = [] if with_result else [defer(BenchmarkRun.result)]
    row = session.scalars(select(BenchmarkRun).options(*options).where(BenchmarkRun.id == run_id)).first()
    if row is None:
        raise NotFound(KIND, run_id)
    return row


def list_runs(session: Session, *, host: str | None = None, name: str | None = None,
              states: Collection[str] | None = None, schedule: str | None = None,
              visible: Collection[str] | None = None, limit: int = 100) -> Sequence[BenchmarkRun]:
    """Newest first, results not loaded; ``visible``: only runs of these hosts."""
    stmt = select(BenchmarkRun).options(defer(BenchmarkRun.result))
    if visible is not None:
        stmt = stmt.where(BenchmarkRun.host.in_(sorted(visible)))
    if host is not None:
        stmt = stmt.where(BenchmarkRun.host == host)
    if name is not None:
        stmt = stmt.where(BenchmarkRun.name == name)
    if states:
        stmt = stmt.where(BenchmarkRun.state.in_(sorted(states)))
    if schedule is not None:
        stmt = stmt.where(BenchmarkRun.schedule == schedule)
    return session.scalars(stmt.order_by(BenchmarkRun.seq.desc()).limit(limit)).all()


def raw_files(session: Session, run_id: str, path: str | None = None) -> Sequence[BenchmarkRawFile]:
    stmt = select(BenchmarkRawFile).where(BenchmarkRawFile.run_id == run_id)
    if path is not None:
        stmt = stmt.where(BenchmarkRawFile.path == path)
    return session.scalars(stmt.order_by(BenchmarkRawFile.path)).all()


def cancel(session: Session, run_id: str, now: datetime) -> BenchmarkRun:
    """A queued run is cancelled at once; a running one is marked, and the dispatcher has the
    agent stop it (its fio is killed; what finished is kept). An ended run stays as it is."""
    session.commit()  # end the caller's reads: this transaction starts with its UPDATE
    stopped = session.execute(
        update(BenchmarkRun)
        .where(BenchmarkRun.id == run_id, BenchmarkRun.state == "queued")
        .values(state="cancelled", message="cancelled before it started", finished_at=now,
                updated_at=now, cancel_requested_at=now, not_before=None)
        .returning(BenchmarkRun.seq)
        .execution_options(synchronize_session=False)
    ).first()
    if stopped is None:
        session.execute(
            update(BenchmarkRun)
            .where(BenchmarkRun.id == run_id, BenchmarkRun.state == "running",
                   BenchmarkRun.cancel_requested_at.is_(None))
            .values(cancel_requested_at=now, updated_at=now, message="cancelling")
            .execution_options(synchronize_session=False))
    session.commit()
    return get(session, run_id)


def result_of(row: BenchmarkRun) -> BenchmarkResult | None:
    return BenchmarkResult.model_validate(row.result) if row.result is not None else None


# -- the dispatcher's side ---------------------------------------------------------------------
@dataclass(frozen=True)
class ActiveRun:
    """A run that has not ended, as the dispatcher needs it."""

    id: str
    host: str
    state: str
    spec: dict[str, Any]
    attempts: int
    not_before: datetime | None
    unreachable_since: datetime | None
    cancel_requested: bool
    #: The experiment this run is a trial of (None: a benchmark asked for itself).
    experiment: str | None = None


def active_runs(session: Session) -> list[ActiveRun]:
    """Every queued and running run, in queue order."""
    rows = session.execute(
        select(BenchmarkRun.id, BenchmarkRun.host, BenchmarkRun.state, BenchmarkRun.spec,
               BenchmarkRun.attempts, BenchmarkRun.not_before, BenchmarkRun.unreachable_since,
               BenchmarkRun.cancel_requested_at, BenchmarkRun.experiment)
        .where(BenchmarkRun.state.in_(ACTIVE)).order_by(BenchmarkRun.seq)).all()
    return [ActiveRun(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7] is not None, r[8]) for r in rows]


def host_target(session: Session, name: str) -> tuple[str, dict[str, int]] | None:
    """(agent address, profile generations it has applied), or None when the host is gone."""
    row = session.execute(select(Host.address, Host.applied_generations).where(Host.name == name)).first()
    return None if row is None else (row[0], dict(row[1]))


def progress_document(progress: BenchmarkProgress, now: datetime) -> dict[str, Any]:
    return {
        "state": progress.state, "percent": round(progress.percent, 1),
        "readBytesPerSecond": progress.read_bytes_per_s, "writeBytesPerSecond": progress.write_bytes_per_s,
        "readIops": progress.read_iops, "writeIops": progress.write_iops,
        "etaSeconds": progress.eta_seconds, "message": progress.message, "updatedAt": now.isoformat(),
    }


def _set(session: Session, run_id: str, where: Sequence[Any], values: Mapping[str, Any]) -> str | None:
    """UPDATE one run if ``where`` holds; its host, or None when nothing matched."""
    row = session.execute(
        update(BenchmarkRun).where(BenchmarkRun.id == run_id, *where).values(**values)
        .returning(BenchmarkRun.host).execution_options(synchronize_session=False)).first()
    return None if row is None else str(row[0])


def mark_running(session: Session, run_id: str, progress: BenchmarkProgress, profiles: Mapping[str, int],
                 now: datetime) -> bool:
    """The agent took the run; False when it was cancelled meanwhile (the agent must stop it)."""
    host = _set(session, run_id, [BenchmarkRun.state == "queued"], {
        "state": "running", "message": progress.message or "started", "started_at": now,
        "updated_at": now, "progress": progress_document(progress, now), "not_before": None,
        "unreachable_since": None, "agent_holds": True, "profiles": dict(profiles)})
    session.commit()
    return host is not None


def hold(session: Session, run_id: str) -> None:
    """The agent has the run's files although the row ended (cancelled while it started)."""
    session.execute(update(BenchmarkRun).where(BenchmarkRun.id == run_id).values(agent_holds=True)
                    .execution_options(synchronize_session=False))
    session.commit()


def postpone(session: Session, run_id: str, *, message: str, not_before: datetime,
          unreachable_since: datetime | None, now: datetime) -> None:
    """The start was refused for now (busy, unreachable): try again at ``not_before``."""
    _set(session, run_id, [BenchmarkRun.state == "queued"], {
        "message": message, "not_before": not_before, "unreachable_since": unreachable_since,
        "attempts": BenchmarkRun.attempts + 1, "updated_at": now})
    session.commit()


def note(session: Session, run_id: str, *, message: str, unreachable_since: datetime | None,
         now: datetime) -> None:
    """What the dispatcher finds while following a running run (the agent does not answer)."""
    _set(session, run_id, [BenchmarkRun.state == "running"], {
        "message": message, "unreachable_since": unreachable_since, "updated_at": now})
    session.commit()


def fail(session: Session, run_id: str, message: str, now: datetime) -> bool:
    """End a run that cannot go on (the agent refused it, lost it, or stayed away too long)."""
    host = _set(session, run_id, [BenchmarkRun.state.in_(ACTIVE)], {
        "state": "failed", "message": message, "finished_at": now, "updated_at": now,
        "not_before": None})
    if host is not None:
        request_reconcile(session, [host], "benchmark ended")  # an apply may be waiting for it
    session.commit()
    return host is not None


def write_progress(session: Session, run_id: str, progress: BenchmarkProgress, now: datetime) -> bool | None:
    """Store the latest progress; whether a cancel was asked for (None: the run is not running)."""
    row = session.execute(
        update(BenchmarkRun)
        .where(BenchmarkRun.id == run_id, BenchmarkRun.state == "running")
        .values(progress=progress_document(progress, now), updated_at=now, unreachable_since=None,
                message=progress.message or "running")
        .returning(BenchmarkRun.cancel_requested_at)
        .execution_options(synchronize_session=False)).first()
    session.commit()
    return None if row is None else row[0] is not None


def _storable(result: BenchmarkResult) -> dict[str, Any]:
    # fio's text may carry NUL, which PostgreSQL cannot store in jsonb.
    data: dict[str, Any] = json.loads(result.model_dump_json().replace("\\u0000", "\\ufffd"))
    return data


def conclude(session: Session, run_id: str, outcome: BenchmarkOutcome, now: datetime) -> bool:
    """Store an ended run's result and raw files in one transaction; False if it had ended already."""
    result = outcome.result
    state = result.state if result is not None else outcome.progress.state
    if state not in TERMINAL_STATES:  # a state a newer agent invented: not a success we can vouch for
        state = "failed"
    message = (result.message if result is not None and result.message else outcome.progress.message)
    final = progress_document(outcome.progress, now)
    if state == "done":
        final["percent"] = 100.0
    values: dict[str, Any] = {
        "state": state, "message": message or state, "finished_at": now, "updated_at": now,
        "progress": final, "agent_holds": True, "unreachable_since": None,
        "result": _storable(result) if result is not None else None,
        "passed": result.verdict.passed if result is not None and result.verdict is not None else None,
    }
    context = result.context if result is not None else None
    if context is not None:
        values.update(kernel=context.kernel, fio_version=context.fio_version,
                      topology_hash=context.topology_hash)
        if context.profiles:
            values["profiles"] = dict(context.profiles)
    elif outcome.info.kernel:
        values["kernel"] = outcome.info.kernel
    host = _set(session, run_id, [BenchmarkRun.state.in_(ACTIVE)], values)
    if host is None:
        session.rollback()
        return False
    for path, text in sorted(outcome.raw_files.items()):
        session.add(BenchmarkRawFile(run_id=run_id, path=path[:_MAX_PATH],
                                     text=text.replace("\x00", "\ufffd")))
    request_reconcile(session, [host], "benchmark ended")  # an apply may be waiting for it
    session.commit()
    return True


def forgotten(session: Session, run_id: str) -> None:
    session.execute(update(BenchmarkRun).where(BenchmarkRun.id == run_id).values(agent_holds=False)
                    .execution_options(synchronize_session=False))
    session.commit()


def held(session: Session, limit: int = 20) -> list[tuple[str, str]]:
    """(run id, host) of ended runs whose files the agent still keeps (forget not acknowledged)."""
    rows = session.execute(
        select(BenchmarkRun.id, BenchmarkRun.host)
        .where(BenchmarkRun.agent_holds.is_(True), BenchmarkRun.state.in_(sorted(TERMINAL_STATES)))
        .order_by(BenchmarkRun.seq).limit(limit)).all()
    return [(r[0], r[1]) for r in rows]
