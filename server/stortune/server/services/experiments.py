"""Tuning experiments: validating them, choosing hosts and devices, and their rows.

An experiment is one ``experiments`` row, one ``experiment_hosts`` row per host
chosen at submission, and one ``experiment_trials`` row per trial. A host row
in state ``running`` or ``restoring`` means the experiment owns that host's
settings: the reconciler holds off (``holding``), the benchmark queue starts no
other run there, and no other experiment claims it. The driver
(``stortune.server.tune``) moves experiments along through the functions at the
end of this module; like the benchmark queue, every write transaction begins
with a write, never a read (SQLite), and claims and releases bump
resourceVersion because they change what the host's status says.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, exists, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.schemas.documents import DocumentError
from stortune.schemas.matching import mismatch
from stortune.schemas.profile import LabelSelector
from stortune.schemas.topology import Device, DeviceKind, Topology
from stortune.server.controller import request_reconcile
from stortune.server.db.tables import BenchmarkRun, Experiment, ExperimentHost, ExperimentTrial, Host
from stortune.server.errors import Cause, Invalid, NotFound
from stortune.server.models.common import unstorable
from stortune.server.reconciler.decide import ExperimentHold
from stortune.server.services import benchmarks, events, hosts
from stortune.server.services.versions import next_resource_version

if TYPE_CHECKING:
    from stortune.schemas.tuning.experiment import TuningExperiment

KIND: Final = "TuningExperiment"
ACTIVE: Final = ("queued", "running")
#: Host states in which the experiment owns the host's settings.
OWNING: Final = ("running", "restoring")
HOST_ENDED: Final = ("done", "failed", "cancelled")


# -- documents, hosts and devices ----------------------------------------------------------------
def validate(data: Any, *, max_grid: int) -> TuningExperiment:
    """A request body -> TuningExperiment, or Invalid naming each bad field by its path."""
    from stortune.schemas.tuning.experiment import parse_experiment

    meta = data.get("metadata") if isinstance(data, dict) else None
    name = meta.get("name") if isinstance(meta, dict) and isinstance(meta.get("name"), str) else None
    found = unstorable(data)
    if found:
        raise Invalid([found], kind=KIND, name=name)
    try:
        return parse_experiment(data, max_grid=max_grid)
    except DocumentError as exc:
        raise Invalid([Cause(p.path, p.message) for p in exc.problems], kind=KIND, name=name) from None


def select_hosts(session: Session, exp: TuningExperiment, scope: LabelSelector | None = None) -> list[str]:
    """The first ``spec.maxHosts`` hosts (by name) ``spec.hostSelector`` matches; Invalid when none.

    ``scope`` (a support token's selector) hides the hosts outside it, as if they did not exist.
    """
    selector = exp.spec.hostSelector
    if selector is None:
        raise Invalid([Cause("spec.hostSelector", "required by the control plane: name the hosts to "
                             "run on with matchLabels or matchExpressions (stortune-agent tune runs "
                             "an experiment on one host without it)")], kind=KIND, name=exp.name)
    names = sorted(name for name, labels in hosts.labels_by_host(session).items()
                   if selector.matches(labels) and (scope is None or scope.matches(labels)))
    if not names:
        raise Invalid([Cause("spec.hostSelector", "matches no registered host")], kind=KIND, name=exp.name)
    return names[:exp.spec.maxHosts]


@dataclass(frozen=True)
class HostTarget:
    """The device an experiment tunes on one host, and the devices beneath it, from its topology."""

    host: str
    topology: Topology
    device: Device
    beneath: list[Device]


def beneath_of(topology: Topology, device: Device) -> list[Device]:
    """Every device below ``device`` (md members, LVM PVs, multipath paths ...), nearest first."""
    from stortune.schemas.bench.target import beneath

    found = []
    for below in beneath(topology, device.name):
        dev = topology.device(below.device)
        if dev is not None and dev.name != device.name:
            found.append(dev)
    return found


def find_target(exp: TuningExperiment, topology: Topology) -> tuple[Device | None, str]:
    """The one device ``spec.target.device`` selects, or None and why not."""
    chosen = [d for d in topology.devices
              if d.kind is not DeviceKind.HOST and mismatch(exp.spec.target.device, d) is None]
    if len(chosen) == 1:
        return chosen[0], ""
    if not chosen:
        return None, "matches no device of this host"
    listed = ", ".join(d.name for d in chosen[:8])
    return None, f"matches {len(chosen)} devices ({listed}); an experiment tunes exactly one"


def resolve(session: Session, exp: TuningExperiment, names: Sequence[str]) -> list[HostTarget]:
    """Each host's target device, checked against what that device and its kernel allow.

    Invalid (422) naming the field: ``spec.target.device`` when a host has no single match,
    ``spec.parameters[i]...`` for a value the device refuses (a scheduler its kernel does not offer).
    """
    from stortune.schemas.protection import topology_refusals
    from stortune.schemas.tuning.experiment import baseline_point, check_against_device

    causes: list[Cause] = []
    out: list[HostTarget] = []
    for name in names:
        topology = hosts.stored_topology(session.scalar(select(Host.topology).where(Host.name == name)))
        if topology is None:
            causes.append(Cause("spec.target.device", f"host {name} has not reported its topology yet"))
            continue
        device, why = find_target(exp, topology)
        if device is None:
            causes.append(Cause("spec.target.device", f"on host {name}: {why}"))
            continue
        below = beneath_of(topology, device)
        # as the agent refuses the first trial: before it, the host would be taken for nothing
        causes += [Cause("spec.target.device", f"on host {name}: {refused}") for refused in
                   topology_refusals(topology, [device.name, *(d.name for d in below)], "experiment")]
        found = check_against_device(exp, device, below)
        for problem in found:
            causes.append(Cause(problem.path, f"on host {name}: {problem.message}"))
        if not found:
            try:
                baseline_point(exp, device, below)
            except ValueError as exc:
                causes.append(Cause("spec.parameters", f"on host {name}: {exc}"))
        out.append(HostTarget(name, topology, device, below))
    if causes:
        raise Invalid(causes, kind=KIND, name=exp.name)
    return out


# -- experiments: creating, reading, cancelling ------------------------------------------------------
def new_id(now: datetime) -> str:
    """Sortable by time, unique by its random part; short enough for the trials' run ids."""
    return f"x{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def trial_run_id(experiment: str, host_index: int, index: int) -> str:
    """Deterministic: a restarted control plane asks the agent for the same run, which it knows."""
    return f"{experiment}-h{host_index}-t{index}"


def create(session: Session, exp: TuningExperiment, names: Sequence[str], *, requested_by: str,
           now: datetime) -> Experiment:
    session.commit()  # end the reads that chose the hosts: this transaction starts with its INSERT
    row = Experiment(
        id=new_id(now), name=exp.name, document=exp.document(), state="queued", reason="queued",
        created_by=requested_by, hosts=list(names), seed=exp.spec.seed, created_at=now, updated_at=now,
        started_at=None, finished_at=None, cancel_requested_at=None, outcome=None)
    session.add(row)
    session.flush()
    session.add_all(ExperimentHost(
        experiment=row.id, host=name, state="queued", message="waiting for its turn", device=None,
        baseline=None, originals=None, current_trial=None, progress={}, outcome=None, started_at=None,
        finished_at=None, updated_at=now) for name in names)
    session.commit()
    return row


def get(session: Session, experiment_id: str) -> Experiment:
    row = session.scalars(select(Experiment).where(Experiment.id == experiment_id)).first()
    if row is None:
        raise NotFound(KIND, experiment_id)
    return row


def list_experiments(session: Session, *, name: str | None = None, states: Collection[str] | None = None,
                     visible: Collection[str] | None = None, limit: int = 100) -> list[Experiment]:
    """Newest first; ``visible``: only experiments all of whose hosts are among these."""
    stmt = select(Experiment)
    if name is not None:
        stmt = stmt.where(Experiment.name == name)
    if states:
        stmt = stmt.where(Experiment.state.in_(sorted(states)))
    rows = list(session.scalars(stmt.order_by(Experiment.seq.desc()).limit(limit if visible is None else
                                                                            10 * limit)).all())
    if visible is not None:
        rows = [r for r in rows if set(r.hosts) <= set(visible)][:limit]
    return rows


def host_rows(session: Session, experiment_id: str) -> list[ExperimentHost]:
    return list(session.scalars(select(ExperimentHost).where(ExperimentHost.experiment == experiment_id)
                                .order_by(ExperimentHost.host)).all())


def trial_rows(session: Session, experiment_id: str, host: str | None = None) -> list[ExperimentTrial]:
    stmt = select(ExperimentTrial).where(ExperimentTrial.experiment == experiment_id)
    if host is not None:
        stmt = stmt.where(ExperimentTrial.host == host)
    return list(session.scalars(stmt.order_by(ExperimentTrial.host, ExperimentTrial.index)).all())


def cancel(session: Session, experiment_id: str, now: datetime) -> Experiment:
    """A queued experiment ends at once; a running one is marked, and its driver stops the trial
    running (the agent kills fio) and puts each host back before it ends as cancelled."""
    session.commit()  # this transaction starts with its UPDATE
    # The counter first, as claim and release take it: writers of both tables queue in one order.
    next_resource_version(session)
    stopped = session.execute(
        update(Experiment).where(Experiment.id == experiment_id, Experiment.state == "queued")
        .values(state="cancelled", reason="cancelled before it started", finished_at=now, updated_at=now,
                cancel_requested_at=now)
        .returning(Experiment.seq).execution_options(synchronize_session=False)).first()
    if stopped is not None:
        session.execute(update(ExperimentHost).where(ExperimentHost.experiment == experiment_id)
                        .values(state="cancelled", message="cancelled before it started", finished_at=now,
                                updated_at=now).execution_options(synchronize_session=False))
    else:
        session.execute(
            update(Experiment)
            .where(Experiment.id == experiment_id, Experiment.state == "running",
                   Experiment.cancel_requested_at.is_(None))
            .values(cancel_requested_at=now, updated_at=now, reason="cancelling")
            .execution_options(synchronize_session=False))
    session.commit()
    return get(session, experiment_id)


# -- the reconciler's side ---------------------------------------------------------------------
def holding(session: Session, host: str) -> ExperimentHold | None:
    """The experiment that owns ``host``'s settings now, with the settings it owns."""
    row = session.execute(
        select(ExperimentHost.experiment, ExperimentHost.originals, Experiment.name)
        .join(Experiment, Experiment.id == ExperimentHost.experiment)
        .where(ExperimentHost.host == host, ExperimentHost.state.in_(OWNING))
        .order_by(Experiment.seq)).first()
    if row is None:
        return None
    owned = (row[1] or {}).get("owned", [])
    return ExperimentHold(experiment=row[0], name=row[2],
                          owned=frozenset((str(k[0]), str(k[1])) for k in owned))


def owners(session: Session) -> dict[str, str]:
    """host -> the experiment owning it, for every host an experiment owns."""
    rows = session.execute(select(ExperimentHost.host, ExperimentHost.experiment)
                           .where(ExperimentHost.state.in_(OWNING))).all()
    return {r[0]: r[1] for r in rows}


# -- the driver's side ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ActiveHost:
    """One host of an experiment that has not ended, as the driver needs it."""

    experiment: str
    seq: int
    name: str
    host: str
    host_index: int
    state: str
    document: dict[str, Any]
    seed: int
    cancel_requested: bool
    started_at: datetime | None


def active_hosts(session: Session) -> list[ActiveHost]:
    """Hosts of queued and running experiments that have not ended, oldest experiment first."""
    rows = session.execute(
        select(Experiment.id, Experiment.seq, Experiment.name, ExperimentHost.host, ExperimentHost.state,
               Experiment.document, Experiment.seed, Experiment.cancel_requested_at, Experiment.hosts,
               ExperimentHost.started_at)
        .join(ExperimentHost, ExperimentHost.experiment == Experiment.id)
        .where(Experiment.state.in_(ACTIVE), ExperimentHost.state.not_in(HOST_ENDED))
        .order_by(Experiment.seq, ExperimentHost.host)).all()
    return [ActiveHost(r[0], r[1], r[2], r[3], list(r[8]).index(r[3]), r[4], r[5], r[6], r[7] is not None,
                       r[9]) for r in rows]


def host_state(session: Session, experiment_id: str, host: str) -> ExperimentHost | None:
    return session.get(ExperimentHost, (experiment_id, host))


def claim(session: Session, experiment_id: str, host: str, *, device: str, baseline: Mapping[str, Any],
          originals: Mapping[str, Any], now: datetime) -> bool:
    """Take ``host`` for the experiment, unless a benchmark runs there or another experiment owns it.

    From here on the reconciler holds off the host's settings (``holding``)."""
    next_resource_version(session)
    other = exists().where(ExperimentHost.host == host, ExperimentHost.state.in_(OWNING),
                           ExperimentHost.experiment != experiment_id)
    running = exists().where(BenchmarkRun.host == host, BenchmarkRun.state == "running",
                             BenchmarkRun.experiment.is_distinct_from(experiment_id))
    taken = session.execute(
        update(ExperimentHost)
        .where(ExperimentHost.experiment == experiment_id, ExperimentHost.host == host,
               ExperimentHost.state == "queued", ~other, ~running)
        .values(state="running", message="running", device=device, baseline=dict(baseline),
                originals=dict(originals), started_at=now, updated_at=now)
        .returning(ExperimentHost.host).execution_options(synchronize_session=False)).first()
    if taken is None:
        session.rollback()
        return False
    session.execute(update(Experiment).where(Experiment.id == experiment_id, Experiment.state == "queued")
                    .values(state="running", reason="running", started_at=now, updated_at=now)
                    .execution_options(synchronize_session=False))
    events.record(session, kind=hosts.KIND, name=host, host=host, type="Normal", reason="ExperimentStarted",
                  message=f"experiment {experiment_id} took the host's settings: it tunes device {device}",
                  now=now)
    request_reconcile(session, [host], f"experiment {experiment_id} started")
    session.commit()
    return True


def note_host(session: Session, experiment_id: str, host: str, message: str, now: datetime) -> None:
    """What the driver waits on for a host (the agent does not answer, a benchmark runs there)."""
    session.execute(update(ExperimentHost)
                    .where(ExperimentHost.experiment == experiment_id, ExperimentHost.host == host)
                    .values(message=message, updated_at=now).execution_options(synchronize_session=False))
    session.commit()


def open_trial(session: Session, experiment_id: str, host: str, *, index: int, point: Mapping[str, Any],
               purpose: str, run_id: str, spec: BenchmarkSpec, requested_by: str, progress: Mapping[str, Any],
               now: datetime) -> bool:
    """The trial's row and its benchmark run (queued) in one transaction; False when the trial
    exists already (a restarted driver reached it again: follow the run that exists)."""
    session.commit()
    try:
        session.add(ExperimentTrial(
            experiment=experiment_id, host=host, index=index, point=dict(point), purpose=purpose,
            state="running", run_id=run_id, measurement=None, message="benchmark queued", created_at=now,
            started_at=now, finished_at=None))
        session.flush()
    except IntegrityError:
        session.rollback()
        return False
    run = benchmarks.queued_run(spec, host, requested_by=requested_by, now=now)
    run.id, run.experiment = run_id, experiment_id
    session.add(run)
    session.execute(update(ExperimentHost)
                    .where(ExperimentHost.experiment == experiment_id, ExperimentHost.host == host)
                    .values(current_trial=index, message=f"trial {index + 1} running",
                            progress=dict(progress), updated_at=now)
                    .execution_options(synchronize_session=False))
    session.commit()
    return True


def trial_run(session: Session, run_id: str) -> BenchmarkRun | None:
    return session.scalars(select(BenchmarkRun).where(BenchmarkRun.id == run_id)).first()


def record_trial(session: Session, experiment_id: str, host: str, index: int, *, ok: bool,
                 measurement: Mapping[str, Any], message: str, outcome: Mapping[str, Any] | None,
                 progress: Mapping[str, Any], now: datetime) -> bool:
    """Store a trial's measurement with the host's evidence and progress so far, in one
    transaction; False when it was recorded already (nothing is written then)."""
    session.commit()
    done = session.execute(
        update(ExperimentTrial)
        .where(ExperimentTrial.experiment == experiment_id, ExperimentTrial.host == host,
               ExperimentTrial.index == index, ExperimentTrial.state.in_(("queued", "running")))
        .values(state="done" if ok else "failed", measurement=dict(measurement), message=message,
                finished_at=now)
        .returning(ExperimentTrial.index).execution_options(synchronize_session=False)).first()
    if done is None:
        session.rollback()
        return False
    _host_evidence(session, experiment_id, host, outcome=outcome, progress=progress, now=now)
    session.commit()
    return True


def _host_evidence(session: Session, experiment_id: str, host: str, *, outcome: Mapping[str, Any] | None,
                   progress: Mapping[str, Any], now: datetime) -> None:
    """The host's evidence and progress after a recorded trial; no trial is running there."""
    session.execute(update(ExperimentHost)
                    .where(ExperimentHost.experiment == experiment_id, ExperimentHost.host == host)
                    .values(current_trial=None, updated_at=now, progress=dict(progress),
                            outcome=None if outcome is None else dict(outcome))
                    .execution_options(synchronize_session=False))


def refused_trial(session: Session, experiment_id: str, host: str, index: int, *, point: Mapping[str, Any],
                  purpose: str, run_id: str, measurement: Mapping[str, Any], message: str,
                  outcome: Mapping[str, Any] | None, progress: Mapping[str, Any], now: datetime) -> bool:
    """A trial that never ran (the agent refused its values): its row, failed, with the host's
    evidence, in one transaction; False when it was recorded already."""
    session.commit()
    try:
        session.add(ExperimentTrial(
            experiment=experiment_id, host=host, index=index, point=dict(point), purpose=purpose,
            state="failed", run_id=run_id, measurement=dict(measurement), message=message, created_at=now,
            started_at=now, finished_at=now))
        session.flush()
    except IntegrityError:
        session.rollback()
        return False
    _host_evidence(session, experiment_id, host, outcome=outcome, progress=progress, now=now)
    session.commit()
    return True


def begin_restore(session: Session, experiment_id: str, host: str, *, message: str,
                  progress: Mapping[str, Any], now: datetime) -> None:
    """The host's trials are over: it is being put back (still owned until that has succeeded);
    ``progress`` says how it ended, for a restarted driver that finishes the restore."""
    session.execute(update(ExperimentHost)
                    .where(ExperimentHost.experiment == experiment_id, ExperimentHost.host == host,
                           ExperimentHost.state.in_(OWNING))
                    .values(state="restoring", message=message, progress=dict(progress), updated_at=now)
                    .execution_options(synchronize_session=False))
    session.commit()


def release(session: Session, experiment_id: str, host: str, *, state: str, message: str,
            outcome: Mapping[str, Any] | None, now: datetime) -> None:
    """The host is back at its desired state (or never was taken): the reconciler resumes.
    The experiment ends with its last host: done, cancelled or failed, with the evidence."""
    next_resource_version(session)
    session.execute(update(ExperimentHost)
                    .where(ExperimentHost.experiment == experiment_id, ExperimentHost.host == host,
                           ExperimentHost.state.not_in(HOST_ENDED))
                    .values(state=state, message=message, current_trial=None, finished_at=now, updated_at=now)
                    .execution_options(synchronize_session=False))
    events.record(session, kind=hosts.KIND, name=host, host=host,
                  type="Normal" if state != "failed" else "Warning", reason="ExperimentEnded",
                  message=f"experiment {experiment_id} {state}: {message}; the host's desired state is "
                          "enforced again", now=now)
    request_reconcile(session, [host], f"experiment {experiment_id} ended")
    left = session.scalar(select(ExperimentHost.host).where(
        ExperimentHost.experiment == experiment_id, ExperimentHost.state.not_in(HOST_ENDED)).limit(1))
    values: dict[str, Any] = {"updated_at": now}
    if outcome is not None:
        values["outcome"] = dict(outcome)
    if left is None:
        states = set(session.scalars(select(ExperimentHost.state)
                                     .where(ExperimentHost.experiment == experiment_id)).all())
        row = session.get(Experiment, _seq_of(session, experiment_id))
        cancelled = row is not None and row.cancel_requested_at is not None
        final = "cancelled" if cancelled else "failed" if states == {"failed"} else "done"
        values.update(state=final, finished_at=now, reason=message if final != "done" or len(states) == 1
                      else f"{message} ({', '.join(sorted(states))} across hosts)")
    session.execute(update(Experiment).where(Experiment.id == experiment_id, Experiment.state.in_(ACTIVE))
                    .values(**values).execution_options(synchronize_session=False))
    session.commit()


def _seq_of(session: Session, experiment_id: str) -> int | None:
    return session.scalar(select(Experiment.seq).where(Experiment.id == experiment_id))


def cancel_requested(session: Session, experiment_id: str) -> bool:
    return session.scalar(select(Experiment.cancel_requested_at).where(Experiment.id == experiment_id)
                          ) is not None


def busy_with_benchmark(session: Session, host: str) -> str | None:
    """A benchmark run (not a trial of an experiment) running on ``host``: its id."""
    return session.scalar(select(BenchmarkRun.id).where(
        and_(BenchmarkRun.host == host, BenchmarkRun.state == "running", BenchmarkRun.experiment.is_(None))))
