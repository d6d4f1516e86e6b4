"""Rollout analysis (issue 27, point 2): a change must prove itself on the canaries.

For each host of a gated wave the machine asks ``StartAnalysis(host, "before")``: ``start``
queues a run of the analysis' benchmark (the ordinary benchmark queue: a ``benchmark_runs``
row the dispatcher runs on the agent) on the device the profile's change touches on that
host, or takes the host's own finished run of the same workload younger than ``maxAge``.
After the host applied the new generation, ``StartAnalysis(host, "after")`` queues the same
spec again. ``observe`` tells the machine when the before-run is ready and, once the
after-run ended, its verdict by the noise rule ``bench compare`` uses
(``server/bench/judge.py``): a significant regression of any objective fails; with
``requireImprovement`` an objective must also improve beyond the noise. A run that fails or is
cancelled, or a benchmark that cannot be run here (a stored spec that writes to a raw device,
no device of the host changed), fails the host's analysis with the reason.

``rollout_analyses`` records which run is which per (profile, generation, host), with the
spec both runs run (so the after-run repeats the before-run even when a stored spec changed
meanwhile), the device, and once judged the objectives' figures: ``evidence`` reads them for
the rollout's status. The after-run's spec is the before-run's; a reused before-run was
chosen for having the same workloads, repeats and device.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NamedTuple

from sqlalchemy import case, event, select
from sqlalchemy.orm import Session, SessionTransaction, aliased, sessionmaker

from stortune.schemas import planner
from stortune.schemas.bench import metrics
from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.bench.stats import MetricDelta
from stortune.schemas.bench.target import beneath
from stortune.schemas.documents import DocumentError
from stortune.schemas.patterns import glob_matches
from stortune.schemas.profile import StorageProfile
from stortune.schemas.rollout.machine import AnalysisStage, RolloutState, Verdict
from stortune.schemas.rollout.spec import Analysis, check_stored_benchmark
from stortune.schemas.topology import Device, DeviceKind, Topology
from stortune.schemas.trialprofile import EXPERIMENT_ANNOTATION, profile_name
from stortune.schemas.tuning.overlay import id_glob
from stortune.server.bench.judge import judge
from stortune.server.db.tables import (
    BenchmarkRun,
    BenchmarkSchedule,
    Host,
    Profile,
    ProfileGeneration,
    RolloutAnalysis,
)
from stortune.server.services import benchmarks, events, hosts

KIND: Final = "StorageProfile"
#: Runs of the host looked at for a before-run to reuse (newest first).
REUSE_CANDIDATES: Final = 50
#: Hosts the status lists evidence for (a rollout may gate every wave: a thousand canaries).
MAX_EVIDENCE: Final = 500
#: Lines of "what differed between the two runs" kept with a verdict.
MAX_CONTEXT: Final = 20
_ENDED_BADLY: Final = ("failed", "cancelled")
#: session.info key: this transaction queued an analysis run (the dispatcher is woken on commit).
_QUEUED: Final = "stortune.rollout_analysis.queued"


class Observation(NamedTuple):
    """What the analysis knows of one host: its before-run is ready, and the after-run's verdict
    (``failed`` in the baseline stage: no before-run can be had, the host fails)."""

    baseline: bool
    verdict: Verdict | None


class Refusal(Exception):
    """Why a host's analysis cannot run (recorded as its failed verdict)."""


# -- starting runs -----------------------------------------------------------------------
def start(session: Session, state: RolloutState, host: str, stage: AnalysisStage,
          now: datetime | float) -> None:
    """Queue (or reuse) the ``stage`` run of ``host`` in the caller's transaction (no commit).
    A benchmark that cannot run there is not an error: the host's analysis fails with why."""
    analysis = state.spec.analysis
    if analysis is None:
        return
    when = _as_datetime(now)
    row = session.get(RolloutAnalysis, (state.profile, state.generation, host))
    if row is None:
        row = RolloutAnalysis(profile=state.profile, generation=state.generation, host=host,
                              before_run=None, after_run=None, verdict=None, detail={},
                              created_at=when, updated_at=when)
        session.add(row)
    try:
        if stage == "before":
            _start_before(session, state, analysis, row, when)
        else:
            _start_after(session, state, row, when)
    except Refusal as exc:
        _refuse(session, state, row, stage, reason=str(exc), now=when)
    row.updated_at = when


def _start_before(session: Session, state: RolloutState, analysis: Analysis, row: RolloutAnalysis,
                  now: datetime) -> None:
    host = row.host
    if row.before_run is not None and row.after_run is None and row.verdict is None:
        found = session.scalar(select(BenchmarkRun.state).where(BenchmarkRun.id == row.before_run))
        if found is not None and found not in _ENDED_BADLY:
            return  # asked again (a halt put the host back to pending, then resume): it still holds
    spec, device = _spec_for(session, state, analysis, host)
    reused = _reusable(session, state, host, spec, device=device, now=now)
    detail: dict[str, Any] = {"spec": spec.document(), "device": device.name if device else None,
                              "deviceId": device.id if device else None, "reused": reused is not None}
    if reused is None:
        run = benchmarks.queued_run(spec, host, requested_by=_requester(state, "before"), now=now)
        session.add(run)
        session.info[_QUEUED] = True
        reused_id = run.id
    else:
        reused_id = reused
    row.before_run, row.after_run, row.verdict, row.detail = reused_id, None, None, detail


def _start_after(session: Session, state: RolloutState, row: RolloutAnalysis, now: datetime) -> None:
    raw = row.detail.get("spec") if isinstance(row.detail, dict) else None
    if row.before_run is None or not isinstance(raw, dict):
        raise Refusal("no before-run was recorded for this host, so an after-run has nothing to be"
                      " judged against")
    try:
        spec = parse_benchmark(raw)
    except DocumentError as exc:  # stored by an earlier version that accepted more
        raise Refusal(f"the before-run's spec is not valid now: {exc}"[:1000]) from None
    run = benchmarks.queued_run(spec, row.host, requested_by=_requester(state, "after"), now=now)
    session.add(run)
    session.info[_QUEUED] = True
    row.after_run, row.verdict = run.id, None
    row.detail = {k: v for k, v in row.detail.items() if k not in ("reason", "objectives", "context")}


def _refuse(session: Session, state: RolloutState, row: RolloutAnalysis, stage: AnalysisStage, *,
            reason: str, now: datetime) -> None:
    if stage == "before":
        row.before_run, row.after_run = None, None
    row.verdict = "failed"
    row.detail = {**(row.detail if isinstance(row.detail, dict) else {}), "reason": reason,
                  "stage": stage}
    events.record(session, kind=KIND, name=state.profile, profile=state.profile, host=row.host,
                  type="Warning", reason="AnalysisRefused",
                  message=f"the {stage}-run of {row.host} for generation {state.generation} cannot"
                          f" run: {reason}"[:1000], now=now)


def bind(sessions: sessionmaker[Session], wake: Callable[[], None]) -> None:
    """Call ``wake`` (the benchmark dispatcher's) after each commit that queued an analysis run,
    so a canary's run starts now rather than at the dispatcher's next look."""

    def after_commit(session: Session) -> None:
        if session.info.pop(_QUEUED, False):
            wake()

    def after_end(session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:  # rolled back (after_commit ran first on a commit)
            session.info.pop(_QUEUED, None)

    event.listen(sessions, "after_commit", after_commit)
    event.listen(sessions, "after_transaction_end", after_end)


def _requester(state: RolloutState, stage: str) -> str:
    return f"rollout of {state.profile} generation {state.generation} ({stage}-run)"


def _as_datetime(now: datetime | float) -> datetime:
    return now if isinstance(now, datetime) else datetime.fromtimestamp(now, UTC)


# -- which benchmark, on which device ------------------------------------------------------
def stored_spec(session: Session, name: str) -> BenchmarkSpec | None:
    """The BenchmarkSpec stored under ``name``: a schedule's, else the newest run's of that name
    (the control plane keeps a spec with each of its runs). None when there is neither."""
    raw = session.scalar(select(BenchmarkSchedule.spec).where(BenchmarkSchedule.name == name))
    if raw is None:
        raw = session.scalar(select(BenchmarkRun.spec).where(BenchmarkRun.name == name)
                             .order_by(BenchmarkRun.seq.desc()).limit(1))
    if raw is None:
        return None
    try:
        return parse_benchmark(raw)
    except DocumentError:
        return None


def check_benchmark(session: Session, analysis: Analysis) -> str | None:
    """Why ``analysis.benchmark`` cannot judge a canary, or None: for a stored spec, that it
    exists and passes ``check_stored_benchmark`` (an inline one was checked when parsed).
    Messages start with ``@field`` under ``spec.rollout.analysis``."""
    try:
        _checked_spec(session, analysis)
    except Refusal as exc:
        return str(exc)
    return None


def _checked_spec(session: Session, analysis: Analysis) -> BenchmarkSpec | None:
    """The stored spec ``analysis.benchmark`` names (None: the benchmark is inline), or Refusal."""
    if not isinstance(analysis.benchmark, str):
        return None
    found = stored_spec(session, analysis.benchmark)
    if found is None:
        raise Refusal(f"@benchmark no BenchmarkSpec named {analysis.benchmark!r} is stored (as a"
                      " schedule or a run): give a preset ({preset: stream-32k, runtime: 10s}) or"
                      " store the spec first")
    problems = check_stored_benchmark(analysis, found.spec)
    if problems:
        raise Refusal(problems[0])
    return found


def _spec_for(session: Session, state: RolloutState, analysis: Analysis, host: str
              ) -> tuple[BenchmarkSpec, Device | None]:
    """The spec the host's runs run, and the device it aims at (None: a stored spec's file)."""
    name = profile_name(state.profile, prefix="rollout-")
    body: dict[str, Any]
    try:
        found = _checked_spec(session, analysis)
    except Refusal as exc:
        raise Refusal(str(exc).removeprefix("@benchmark ")) from None
    if found is not None:
        name = found.name
        body = found.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        body.pop("hostSelector", None)  # the run is this host's, whatever the spec selects
    else:
        assert not isinstance(analysis.benchmark, str)
        body = {"workloads": [analysis.benchmark.model_dump(mode="json", by_alias=True, exclude_none=True)],
                "repeats": 1}
    device: Device | None = None
    if "file" not in body.get("target", {}):
        device = _changed_device(session, state, host)
        # Read-only by the checks above; allowDestructive false makes the spec refuse writes too.
        body["target"] = {"device": {"id": [id_glob(device.id)], "kind": [device.kind.value]}}
        body["allowDestructive"] = False
    doc = {"apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": name}, "spec": body}
    try:
        return parse_benchmark(doc), device
    except DocumentError as exc:
        raise Refusal("; ".join(f"{p.path}: {p.message}" for p in exc.problems)[:1000]) from None


def _profile_at(session: Session, name: str, generation: int) -> StorageProfile | None:
    """The profile as stored at ``generation``; None when it holds nothing (0, a tombstone, gone)."""
    if generation <= 0:
        return None
    spec = session.scalar(select(ProfileGeneration.spec).where(
        ProfileGeneration.profile == name, ProfileGeneration.generation == generation))
    if spec is None:
        row = session.get(Profile, name)
        if row is None or row.generation != generation or row.deletion_timestamp is not None:
            return None
        spec = row.spec
    try:
        return StorageProfile.model_validate({"metadata": {"name": name, "generation": generation},
                                              "spec": spec})
    except ValueError:
        return None


def _wanted(profile: StorageProfile | None, labels: Mapping[str, str], topology: Topology
            ) -> dict[tuple[str, str], object]:
    """(device, tunable) -> the value ``profile`` alone wants on this host (rejected ones too)."""
    if profile is None:
        return {}
    selector = profile.spec.hostSelector
    if selector is not None and not selector.matches(dict(labels)):
        return {}
    result = planner.plan([profile], topology)
    out: dict[tuple[str, str], object] = {(d.device, d.tunable): d.desired for d in result.desired}
    out.update({(r.device, r.tunable): r.value for r in result.rejections})
    return out


def _changed_device(session: Session, state: RolloutState, host: str) -> Device:
    """The device the new generation changes on ``host``: the topmost of those it changes (an
    array rather than its members, as applications see it), first in discovery order."""
    found = session.execute(select(Host.labels, Host.reported_labels, Host.topology)
                            .where(Host.name == host)).first()
    if found is None:
        raise Refusal(f"host {host} is not registered")
    topology = hosts.stored_topology(found[2])
    if topology is None:
        raise Refusal(f"host {host} has not reported its devices yet, so the device to benchmark is"
                      " not known")
    labels = {**found[1], **found[0]}
    held = state.hosts[host].generation if host in state.hosts else state.previous
    before = _wanted(_profile_at(session, state.profile, held), labels, topology)
    after = _wanted(_profile_at(session, state.profile, state.generation), labels, topology)
    changed = {key[0] for key in set(before) | set(after) if before.get(key) != after.get(key)}
    devices = [d for d in topology.devices if d.name in changed and d.kind is not DeviceKind.HOST]
    if not devices:
        raise Refusal(f"generation {state.generation} changes no device of {host} (only host-wide"
                      " settings, or nothing), so no device can be benchmarked")
    below = {b.device for d in devices for b in beneath(topology, d.name)[1:]}  # [0]: itself
    top = [d for d in devices if d.name not in below]
    return (top or devices)[0]


def _workload_key(doc: Mapping[str, Any]) -> tuple[str, str]:
    body = doc.get("spec")
    body = body if isinstance(body, Mapping) else {}
    return (json.dumps(body.get("workloads"), sort_keys=True), json.dumps(body.get("repeats", 1)))


def _reusable(session: Session, state: RolloutState, host: str, spec: BenchmarkSpec, *,
              device: Device | None, now: datetime) -> str | None:
    """The host's newest finished run of the same workloads on the same device, younger than
    ``maxAge`` and measured under the generation of the profile the host holds now."""
    analysis = state.spec.analysis
    if analysis is None or analysis.maxAge is None or device is None:
        return None
    profile = state.profile
    held = state.hosts[host].generation if host in state.hosts else state.previous
    since = now - timedelta(seconds=analysis.maxAge)
    key = _workload_key(spec.document())
    candidates = session.execute(
        select(BenchmarkRun.id, BenchmarkRun.spec, BenchmarkRun.profiles)
        .where(BenchmarkRun.host == host, BenchmarkRun.state == "done", BenchmarkRun.finished_at >= since)
        .order_by(BenchmarkRun.seq.desc()).limit(REUSE_CANDIDATES)).all()
    expected = held if held > 0 else None
    fitting = [str(run_id) for run_id, doc, profiles in candidates
               if _workload_key(doc) == key and (profiles or {}).get(profile) == expected]
    for run_id in fitting:
        result = benchmarks.result_of(benchmarks.get(session, run_id))
        target = result.context.target if result is not None and result.context is not None else None
        if target is not None and target.device_id == device.id:
            return run_id
    return None


# -- observing ---------------------------------------------------------------------------
def observe(session: Session, state: RolloutState, _records: object = None) -> dict[str, Observation]:
    """Per host in the ``baseline`` or ``analysing`` stage: (before-run ready, verdict). One
    query for the rollout's analyses and their runs; a newly finished pair is judged and its
    verdict written to the session (the caller's commit keeps it; else it is judged again)."""
    analysis = state.spec.analysis
    asked = {h for h, hs in state.hosts.items() if hs.stage in ("baseline", "analysing")}
    if analysis is None or not asked:
        return {}
    before, after = aliased(BenchmarkRun), aliased(BenchmarkRun)
    rows = session.execute(
        select(RolloutAnalysis.host, RolloutAnalysis.before_run, RolloutAnalysis.after_run,
               RolloutAnalysis.verdict, before.state, before.message, after.state, after.message)
        .outerjoin(before, before.id == RolloutAnalysis.before_run)
        .outerjoin(after, after.id == RolloutAnalysis.after_run)
        .where(RolloutAnalysis.profile == state.profile,
               RolloutAnalysis.generation == state.generation)).all()
    out: dict[str, Observation] = {}
    to_judge: list[str] = []
    ended: dict[str, str] = {}
    for host, before_id, after_id, verdict, b_state, b_message, a_state, a_message in rows:
        if host not in asked:
            continue
        stage = state.hosts[host].stage
        ready = b_state == "done"
        if stage == "baseline":
            if after_id is None and verdict == "failed":
                out[host] = Observation(False, "failed")
            elif before_id is not None and (b_state is None or b_state in _ENDED_BADLY):
                ended[host] = _ended_reason("before", before_id, b_state, b_message)
                out[host] = Observation(False, "failed")
            else:
                out[host] = Observation(ready, None)
            continue
        if verdict is not None:
            out[host] = Observation(True, "passed" if verdict == "passed" else "failed")
        elif after_id is None:
            out[host] = Observation(True, None)  # the after-run is not asked for yet
        elif a_state is None or a_state in _ENDED_BADLY:
            ended[host] = _ended_reason("after", after_id, a_state, a_message)
            out[host] = Observation(True, "failed")
        elif a_state == "done" and ready:
            to_judge.append(host)
        elif a_state == "done":  # the before-run it is judged against is gone
            ended[host] = _ended_reason("before", before_id or "?", b_state, b_message)
            out[host] = Observation(True, "failed")
        else:
            out[host] = Observation(True, None)
    for host, reason in ended.items():
        _write(session, state, host, "failed", {"reason": reason})
    for host in to_judge:
        verdict, detail = _judge_host(session, state, analysis, host)
        _write(session, state, host, verdict, detail)
        out[host] = Observation(True, verdict)
    return out


def _ended_reason(stage: str, run_id: str, run_state: str | None, message: str | None) -> str:
    if run_state is None:
        return f"the {stage}-run {run_id} is gone"
    return f"the {stage}-run {run_id} {run_state}: {message or run_state}"[:1000]


def _write(session: Session, state: RolloutState, host: str, verdict: Verdict,
           detail: Mapping[str, Any]) -> None:
    row = session.get(RolloutAnalysis, (state.profile, state.generation, host))
    if row is None:
        return
    row.verdict = verdict
    row.detail = {**(row.detail if isinstance(row.detail, dict) else {}), **detail}


def _judge_host(session: Session, state: RolloutState, analysis: Analysis, host: str
                ) -> tuple[Verdict, dict[str, Any]]:
    row = session.get(RolloutAnalysis, (state.profile, state.generation, host))
    assert row is not None and row.before_run is not None and row.after_run is not None
    runs = {r.id: r for r in session.scalars(select(BenchmarkRun).where(
        BenchmarkRun.id.in_([row.before_run, row.after_run])))}
    a, b = (benchmarks.result_of(runs[i]) if i in runs else None for i in (row.before_run, row.after_run))
    if a is None or b is None:
        return "failed", {"reason": "a run ended without a result to compare"}
    return verdict_of(analysis, a, b)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _row(d: MetricDelta, maximize: bool) -> dict[str, Any]:
    went_up = d.delta > 0
    verdict = "within noise" if not d.significant else ("better" if went_up == maximize else "worse")
    return {"step": d.step, "metric": d.metric, "goal": "maximize" if maximize else "minimize",
            "beforeMedian": _median(d.a.values), "afterMedian": _median(d.b.values),
            "changePct": d.delta_pct, "noiseLowPct": d.noise_low_pct, "noiseHighPct": d.noise_high_pct,
            "verdict": verdict}


def verdict_of(analysis: Analysis, before: BenchmarkResult, after: BenchmarkResult
               ) -> tuple[Verdict, dict[str, Any]]:
    """The noise rule over the objectives: (verdict, detail with the figures and the reason).
    Pure: the same comparison ``bench compare`` makes, the objectives chosen by the analysis."""
    comparison = judge(before, after)
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    if analysis.objectives:
        for i, objective in enumerate(analysis.objectives):
            found = [d for d in comparison.deltas
                     if d.metric == objective.metric and glob_matches(objective.step, d.step)]
            if not found:
                missing.append(f"objectives[{i}] {objective.metric} ({objective.step})")
            rows += [_row(d, objective.maximize) for d in found]
    else:
        rows = [_row(d, metrics.get(d.metric).higher_is_better) for d in comparison.deltas
                if comparison.is_objective(d)]
    changes = _changes(comparison.deltas)
    detail: dict[str, Any] = {"objectives": rows, "context": comparison.context[:MAX_CONTEXT],
                              "changes": changes}
    worse = [r for r in rows if r["verdict"] == "worse"]
    if missing or not rows:
        what = ", ".join(missing) if missing else "no objective figure"
        detail["reason"] = f"{what} was not measured by both runs, so the change cannot be judged"
        return "failed", detail
    if worse:
        detail["reason"] = "regressed beyond the noise: " + "; ".join(_brief(r) for r in worse[:5])
        return "failed", detail
    better = [r for r in rows if r["verdict"] == "better"]
    if analysis.requireImprovement and not better:
        detail["reason"] = ("requireImprovement: no objective improved beyond the noise ("
                            + "; ".join(_brief(r) for r in rows[:5]) + ")")
        return "failed", detail
    detail["reason"] = ("improved beyond the noise: " + "; ".join(_brief(r) for r in better[:5])
                        if better else "no objective moved beyond the noise")
    return "passed", detail


def _brief(row: Mapping[str, Any]) -> str:
    pct = row["changePct"]
    low, high = row["noiseLowPct"], row["noiseHighPct"]
    change = "n/a" if pct is None else f"{pct:+.1f}%"
    noise = "" if low is None or high is None else f" (noise {low:+.1f}%..{high:+.1f}%)"
    return f"{row['metric']} of {row['step']} {change}{noise}"


def _changes(deltas: Sequence[MetricDelta]) -> dict[str, float]:
    """Metric -> mean change in % over the steps measuring it (for the experiment's claim)."""
    by_metric: dict[str, list[float]] = {}
    for d in deltas:
        if d.delta_pct is not None:
            by_metric.setdefault(d.metric, []).append(d.delta_pct)
    return {m: sum(v) / len(v) for m, v in by_metric.items()}


# -- for the status -----------------------------------------------------------------------
def evidence(session: Session, profile: str, generation: int, *, limit: int = MAX_EVIDENCE
             ) -> list[dict[str, Any]]:
    """The status's "analysis" list: per host its runs, verdict, objectives and reason, failed
    hosts first, at most ``limit``; when the profile came from an experiment, the gain it
    claimed next to the one measured here."""
    failed_first = case((RolloutAnalysis.verdict == "failed", 0), else_=1)
    rows = session.scalars(select(RolloutAnalysis).where(
        RolloutAnalysis.profile == profile, RolloutAnalysis.generation == generation)
        .order_by(failed_first, RolloutAnalysis.host).limit(max(0, limit))).all()
    if not rows:
        return []
    claim = _claim(session, profile)
    out = []
    for row in rows:
        detail = row.detail if isinstance(row.detail, dict) else {}
        item: dict[str, Any] = {
            "host": row.host, "before": row.before_run, "after": row.after_run, "verdict": row.verdict,
            "device": detail.get("device"), "reused": bool(detail.get("reused")),
            "objectives": list(detail.get("objectives") or []), "reason": detail.get("reason"),
            "context": list(detail.get("context") or []),
        }
        if claim is not None:
            changes = detail.get("changes") or {}
            measured = changes.get(claim["metric"]) if isinstance(changes, dict) else None
            item["experiment"] = {**claim, "measuredGainPct": measured}
        out.append(item)
    return out


def _claim(session: Session, profile: str) -> dict[str, Any] | None:
    """The experiment an applyResult profile names in its annotations, and the gain it claimed."""
    annotations = session.scalar(select(Profile.annotations).where(Profile.name == profile)) or {}
    experiment = annotations.get(EXPERIMENT_ANNOTATION)
    if not experiment:
        return None
    goal, _, metric = str(annotations.get("stortune.io/objective", "")).partition(" ")
    return {"name": experiment, "metric": metric or None, "goal": goal or None,
            "claimedGain": annotations.get("stortune.io/gain"),
            "claimedInterval": annotations.get("stortune.io/interval")}




def status(session: Session, state: RolloutState) -> list[dict[str, Any]]:
    """``evidence`` of the state's generation (what services/rollouts.status lists)."""
    return evidence(session, state.profile, state.generation)


__all__ = ["Observation", "bind", "check_benchmark", "evidence", "observe", "start", "status", "stored_spec",
           "verdict_of"]
