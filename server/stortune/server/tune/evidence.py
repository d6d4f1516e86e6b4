"""An experiment's evidence as the control plane stores and shows it, from the recorded trials.

The engine (``stortune.schemas.tuning.engine``) is rebuilt from the measurements stored per
host, so what the API shows is what the driver decides with: per host its Outcome and live
progress, and for a fleet the pooled outcome with whether the result holds on every host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.experiment import TuningExperiment, parse_experiment
from stortune.schemas.tuning.space import Measurement, TrialRequest, describe
from stortune.server.db.tables import Experiment, ExperimentHost, ExperimentTrial
from stortune.server.services import experiments

__all__ = ["Engine", "engine_for", "experiment_outcome", "outcome_doc", "progress_doc", "stored_outcome"]


def members_of(originals: Mapping[str, Any] | None) -> int:
    """Member disks beneath the target (what a stripe cache costs RAM per page), at least 1."""
    beneath = (originals or {}).get("beneath") or []
    return max(1, sum(1 for d in beneath if isinstance(d, dict) and d.get("kind") in ("disk", "partition")))


def engine_for(exp: TuningExperiment, baseline: Mapping[str, Any], history: Sequence[Measurement],
               seed: int, members: int = 1) -> Engine:
    return Engine(exp.spec, dict(baseline), history, seed=seed, members=members)


def measurements(rows: Sequence[ExperimentTrial]) -> list[Measurement]:
    """The recorded measurements of one host's trials, in trial order."""
    return [Measurement.model_validate(r.measurement) for r in sorted(rows, key=lambda r: r.index)
            if r.state in ("done", "failed") and r.measurement is not None]


def progress_doc(engine: Engine, current: TrialRequest | None, last: Measurement | None = None
                 ) -> dict[str, Any]:
    """Trial k of n, the values under test, the metric so far, the leader and its margin."""
    progress = engine.progress()
    metric = engine.spec.objective.metric
    doc: dict[str, Any] = {
        "trial": (current.index + 1) if current is not None else progress.done,
        "done": progress.done, "total": max(progress.total_estimate, progress.done),
        "metric": metric, "leader": progress.leader, "leaderMean": progress.leader_mean,
        "marginPct": progress.margin_pct,
        "bestSoFar": progress.best_so_far[-1] if progress.best_so_far else None,
    }
    if current is not None:
        doc.update(testing=dict(current.point), purpose=current.purpose, reason=current.reason,
                   testingText=describe(current.point))
    if last is not None:
        doc["last"] = {"trial": last.index + 1, "point": dict(last.point), "ok": last.ok,
                       "value": last.metrics.get(metric), "message": last.message}
    return doc


def outcome_doc(engine: Engine) -> dict[str, Any]:
    data: dict[str, Any] = engine.outcome().model_dump(mode="json")
    data["bestSoFar"] = engine.best_so_far()
    return data


def experiment_outcome(exp: TuningExperiment, host_rows: Sequence[ExperimentHost],
                       trials: Sequence[ExperimentTrial], seed: int) -> dict[str, Any] | None:
    """Per host and pooled: each host's outcome, the pooled recommendation over every host's
    measurements, and whether the recommended values beat the baseline on every host."""
    by_host: dict[str, list[ExperimentTrial]] = {}
    for t in trials:
        by_host.setdefault(t.host, []).append(t)
    per_host: dict[str, dict[str, Any]] = {}
    engines: dict[str, Engine] = {}
    for row in host_rows:
        if row.baseline is None:
            continue
        engine = engine_for(exp, row.baseline, measurements(by_host.get(row.host, [])), seed,
                            members_of(row.originals))
        engines[row.host] = engine
        per_host[row.host] = outcome_doc(engine)
    if not engines:
        return None
    if len(engines) == 1:
        (host, only), = per_host.items()
        return {**only, "hosts": [host], "perHost": per_host, "holdsEverywhere": True}
    return pooled_doc(exp, engines, per_host)


def pooled_doc(exp: TuningExperiment, engines: Mapping[str, Engine], per_host: Mapping[str, dict[str, Any]]
               ) -> dict[str, Any]:
    """A fleet's evidence: the recommendation pooled over every host's measurements (each host
    judged against its own baseline), whether it holds on every host, and each host's own outcome.
    The trials and baseline shown at the top are the first host's (``trialsHost``)."""
    from stortune.schemas.tuning.fleet import pooled

    fleet = pooled({h: e.measurements for h, e in engines.items()}, exp.spec,
                   {h: e.baseline for h, e in engines.items()}, {h: e.members for h, e in engines.items()})
    first = sorted(per_host)[0]
    shown = per_host[first]
    values = fleet.values if fleet.values is not None else shown["recommendation"]["values"]
    recommendation = {"values": values, "keepCurrent": fleet.keepCurrent,
                      "gain": None if fleet.gain is None else fleet.gain.model_dump(mode="json"),
                      "significant": fleet.significant, "reason": fleet.reason}
    return {**shown, "recommendation": recommendation, "holdsEverywhere": fleet.holds_everywhere,
            "hostVerdicts": [v.model_dump(mode="json") for v in fleet.hosts], "hosts": sorted(per_host),
            "perHost": dict(per_host), "trialsHost": first}


def stored_outcome(sessions: sessionmaker[Session], experiment_id: str) -> dict[str, Any] | None:
    """The experiment's evidence from what is stored now (a host's end writes it with its release)."""
    with sessions() as session:
        row = session.get(Experiment, _seq(session, experiment_id))
        if row is None:
            return None
        exp = parse_experiment(row.document)
        return experiment_outcome(exp, experiments.host_rows(session, experiment_id),
                                  experiments.trial_rows(session, experiment_id), row.seed)


def _seq(session: Session, experiment_id: str) -> int:
    from sqlalchemy import select

    return int(session.scalar(select(Experiment.seq).where(Experiment.id == experiment_id)) or 0)


#: Trials a dry run lists at most.
PLAN_LIMIT = 200


def plan_trials(exp: TuningExperiment, baseline: Mapping[str, Any], seed: int, members: int = 1
                ) -> tuple[int, list[TrialRequest]]:
    """(estimated trials, the order of trials if every point measured the same): the search adapts
    to what it measures, so this is the plan's shape, not a promise."""
    engine = engine_for(exp, baseline, (), seed, members)
    estimate = engine.progress().total_estimate
    metric = exp.spec.objective.metric
    planned: list[TrialRequest] = []
    while len(planned) < PLAN_LIMIT:
        request = engine.next(elapsed_s=0.0)
        if request is None:
            break
        planned.append(request)
        engine.record(Measurement(index=request.index, point=dict(request.point), purpose=request.purpose,
                                  ok=True, metrics={metric: 1.0}))
    return estimate, planned
