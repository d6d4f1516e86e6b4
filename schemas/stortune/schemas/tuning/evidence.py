"""What an experiment found, as evidence: every point's repeats, the baseline at both ends,
the recommendation with its gain and 95% interval, and which parameters mattered.

All judgements use the benchmarks' noise rule (``bench.stats.delta``): a gain counts only
when it leaves the noise interval. When nothing beats the baseline beyond the noise the
recommendation is to keep the current settings: noise is never recommended.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.bench import metrics
from stortune.schemas.bench.stats import MetricDelta, Summary, delta, noise_interval, summarize, t95
from stortune.schemas.catalog import Value
from stortune.schemas.tuning.experiment import Fairness, MemoryBound, MetricBound, TuningSpec
from stortune.schemas.tuning.space import Measurement, Point, describe, point_key

#: RAM one stripe cache entry costs per member disk (a page).
STRIPE_PAGE = 4096
#: Failed runs after which a point is given up (one retry).
MAX_FAILURES = 2
#: Runs kept out of the search's figures: the confirmation of the winner and the end baseline.
APART = ("confirm", "baseline-end")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrialSummary(_Model):
    """One point over its runs (the end baseline apart: it is the drift check)."""

    point: Point
    purposes: list[str]
    n: int = Field(description="Successful runs")
    failures: int = 0
    mean: float | None = Field(description="Mean of the objective over the successful runs")
    ci95_low: float | None = None
    ci95_high: float | None = None
    values: list[float] = Field(default_factory=list, description="The objective, run by run")
    repeats: list[dict[str, float]] = Field(default_factory=list, description="Every run's metrics")
    feasible: bool = True
    violations: list[str] = Field(default_factory=list)
    first_index: int = Field(description="The trial that first measured this point")

    @property
    def dead(self) -> bool:
        """Given up: failed twice, or failed with nothing measured."""
        return self.n == 0 and self.failures >= MAX_FAILURES


class BaselineCheck(_Model):
    start: TrialSummary | None = None
    end: TrialSummary | None = None
    moved_pct: float | None = Field(default=None, description="End against start, in %")
    noise: str = "-"
    reliable: bool
    reason: str


class Gain(_Model):
    pct: float = Field(description="Change of the objective against the baseline, in %")
    low: float = Field(description="95% interval, low end, in %")
    high: float = Field(description="95% interval, high end, in %")


class Recommendation(_Model):
    values: Point
    keepCurrent: bool
    gain: Gain | None = None
    significant: bool = False
    reason: str


class Outcome(_Model):
    metric: str
    goal: str
    trials: list[TrialSummary]
    confirmation: TrialSummary | None = Field(
        default=None, description="Fresh runs of the leader that judge its gain")
    baseline: BaselineCheck
    recommendation: Recommendation
    effects: dict[str, float | None] = Field(
        default_factory=dict, description="Per parameter: spread of the best means across its values, in %")
    measurements: int = 0
    failed: int = 0
    finished_reason: str | None = None


def memory_cost(point: Mapping[str, Value], members: int) -> int:
    """Bytes of RAM the stripe cache of ``point`` costs (0 when it sets none)."""
    size = point.get("stripe_cache_size")
    return size * STRIPE_PAGE * max(1, members) if isinstance(size, int) else 0


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _violations(spec: TuningSpec, point: Point, runs: Sequence[Measurement], members: int) -> list[str]:
    out: list[str] = []
    for c in spec.constraints:
        if isinstance(c, MetricBound):
            seen = _mean([r.metrics[c.metric] for r in runs if c.metric in r.metrics])
            metric = metrics.get(c.metric)
            if seen is None:
                if runs:
                    out.append(f"{c.metric} was not measured")
            elif c.max is not None and seen > c.max:
                out.append(f"{c.metric} {metric.human(seen)} is above {metric.human(c.max)}")
            elif c.min is not None and seen < c.min:
                out.append(f"{c.metric} {metric.human(seen)} is below {metric.human(c.min)}")
        elif isinstance(c, Fairness):
            cv = _mean([r.job_cv for r in runs if r.job_cv is not None])
            if cv is None:
                if runs:
                    out.append(f"per-job {c.fairness} was not measured")
            elif cv > c.maxCV:
                out.append(f"per-job {c.fairness} CV {cv:.1f}% is above {c.maxCV:g}%")
        elif isinstance(c, MemoryBound):
            cost = memory_cost(point, members)
            if cost > c.memory:
                out.append(f"stripe cache costs {cost / 2**20:.0f} MiB, above {c.memory / 2**20:.0f} MiB")
    return out


def usable(spec: TuningSpec, m: Measurement) -> bool:
    """A run that measured the objective (a finite number); anything else counts as failed."""
    return m.ok and math.isfinite(m.metrics.get(spec.objective.metric, math.nan))


def summarize_point(spec: TuningSpec, runs: Sequence[Measurement], members: int = 1) -> TrialSummary:
    good = [r for r in runs if usable(spec, r)]
    values = [r.metrics[spec.objective.metric] for r in good]
    mean = _mean(values)
    low = high = None
    if len(values) > 1 and mean is not None:
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        half = t95(len(values) - 1) * sd / math.sqrt(len(values))
        low, high = mean - half, mean + half
    purposes: list[str] = []
    for r in runs:
        if r.purpose not in purposes:
            purposes.append(r.purpose)
    violations = _violations(spec, runs[0].point, good, members)
    return TrialSummary(
        point=dict(runs[0].point), purposes=purposes, n=len(values), failures=len(runs) - len(good),
        mean=mean, ci95_low=low, ci95_high=high, values=values, repeats=[dict(r.metrics) for r in good],
        feasible=not violations and bool(values), violations=violations, first_index=runs[0].index)


def by_point(spec: TuningSpec, measurements: Sequence[Measurement], members: int = 1,
             *, only: str | None = None) -> list[TrialSummary]:
    """Summaries in the order points were first measured: of the search's runs, or of the runs
    kept apart for one purpose (``only``: confirm, baseline-end)."""
    groups: dict[tuple[tuple[str, Value], ...], list[Measurement]] = {}
    for m in measurements:
        if (m.purpose == only) if only is not None else (m.purpose not in APART):
            groups.setdefault(point_key(m.point), []).append(m)
    return [summarize_point(spec, runs, members) for runs in groups.values()]


def better(spec: TuningSpec, a: float, b: float) -> bool:
    """Whether ``a`` beats ``b`` for the objective."""
    return a > b if spec.objective.maximize else a < b


def ranked(spec: TuningSpec, summaries: Sequence[TrialSummary]) -> list[TrialSummary]:
    """Feasible points with a mean, best first (ties: the earlier measured)."""
    feasible = [s for s in summaries if s.feasible and s.mean is not None]
    sign = -1.0 if spec.objective.maximize else 1.0
    return sorted(feasible, key=lambda s: (sign * (s.mean or 0.0), s.first_index))


def _summary(values: Sequence[float]) -> Summary:
    return summarize(list(values))


def compare(spec: TuningSpec, a: Sequence[float], b: Sequence[float]) -> MetricDelta:
    """B against A by the noise rule, on the objective."""
    return delta("objective", spec.objective.metric, _summary(a), _summary(b))


def gain_of(d: MetricDelta) -> Gain | None:
    """The change with its 95% interval: the ratio divided by the noise interval's ends."""
    if d.delta_pct is None or d.noise_low_pct is None or d.noise_high_pct is None:
        return None
    ratio = 1 + d.delta_pct / 100
    return Gain(pct=d.delta_pct, low=100 * (ratio / (1 + d.noise_high_pct / 100) - 1),
                high=100 * (ratio / (1 + d.noise_low_pct / 100) - 1))


def improves(spec: TuningSpec, d: MetricDelta) -> bool:
    return d.significant and (d.delta > 0) == spec.objective.maximize


def baseline_check(spec: TuningSpec, start: TrialSummary | None, end: TrialSummary | None
                   ) -> BaselineCheck:
    if start is None or start.n == 0:
        return BaselineCheck(start=start, end=end, reliable=False, reason="the baseline was not measured")
    if end is None or end.n == 0:
        return BaselineCheck(start=start, end=end, reliable=False,
                             reason="the baseline was not measured again at the end (stopped early)")
    d = compare(spec, start.values, end.values)
    noise = d.noise_text()
    if d.significant:
        return BaselineCheck(start=start, end=end, moved_pct=d.delta_pct, noise=noise, reliable=False,
                             reason=f"the baseline moved {d.delta_pct or 0:+.1f}% during the run, beyond the"
                                    f" noise ({noise}): the device or its load changed; repeat the"
                                    " experiment")
    return BaselineCheck(start=start, end=end, moved_pct=d.delta_pct, noise=noise, reliable=True,
                         reason=f"the baseline held ({d.delta_pct or 0:+.1f}%, noise {noise})")


def effects(spec: TuningSpec, summaries: Sequence[TrialSummary], best: Point | None
            ) -> dict[str, float | None]:
    """Per parameter: (best mean / worst mean - 1) in % across its values, the others held at
    the best point's values; where too few such points exist, the best mean of each value."""
    out: dict[str, float | None] = {}
    good = [s for s in summaries if s.mean is not None and s.feasible]
    for key in spec.keys:
        fixed = [s for s in good if best is not None
                 and all(s.point.get(k) == best.get(k) for k in spec.keys if k != key)]
        pool = fixed if len({s.point.get(key) for s in fixed}) >= 2 else good
        per_value: dict[Value, float] = {}
        for s in pool:
            value, mean = s.point.get(key), s.mean or 0.0
            if value is None:
                continue
            if value not in per_value or better(spec, mean, per_value[value]):
                per_value[value] = mean
        means = list(per_value.values())
        if len(means) < 2 or min(means) <= 0:
            out[key] = None
        else:
            out[key] = 100 * (max(means) / min(means) - 1)
    return out


def outcome(spec: TuningSpec, baseline: Point, measurements: Sequence[Measurement], members: int = 1,
            finished_reason: str | None = None) -> Outcome:
    """The evidence and the recommendation from the measurements so far (partial when stopped)."""
    trials = by_point(spec, measurements, members)
    ends = by_point(spec, measurements, members, only="baseline-end")
    confirms = by_point(spec, measurements, members, only="confirm")
    start = next((s for s in trials if point_key(s.point) == point_key(baseline)), None)
    starting = [m for m in measurements if m.purpose == "baseline"]
    first = summarize_point(spec, starting, members) if starting else None
    check = baseline_check(spec, first, ends[0] if ends else None)
    order = ranked(spec, trials)
    leader = order[0] if order else None
    confirmation = confirms[0] if confirms else None
    rec = _recommend(spec, baseline, start, check, leader, confirmation=confirmation)
    return Outcome(
        metric=spec.objective.metric, goal="maximize" if spec.objective.maximize else "minimize",
        trials=trials, confirmation=confirmation, baseline=check, recommendation=rec,
        effects=effects(spec, trials, leader.point if leader else None),
        measurements=len(measurements), failed=sum(1 for m in measurements if not usable(spec, m)),
        finished_reason=finished_reason)


def _recommend(spec: TuningSpec, baseline: Point, start: TrialSummary | None, check: BaselineCheck,
               leader: TrialSummary | None, *, confirmation: TrialSummary | None) -> Recommendation:
    keep = dict(baseline)
    if leader is None:
        return Recommendation(values=keep, keepCurrent=True, reason="no point met the constraints")
    if start is None or start.n == 0:
        return Recommendation(values=keep, keepCurrent=True,
                              reason="the baseline was not measured: nothing to compare with")
    if confirmation is None and point_key(leader.point) == point_key(baseline):
        return Recommendation(values=keep, keepCurrent=True,
                              reason="the current settings measured best: keep them")
    if confirmation is None or confirmation.n == 0:
        return Recommendation(values=keep, keepCurrent=True,
                              reason=f"the leader {describe(leader.point)} was not confirmed by fresh runs"
                                     " (the experiment stopped first): keep the current settings")
    if not confirmation.feasible:
        return Recommendation(values=keep, keepCurrent=True,
                              reason=f"the leader {describe(confirmation.point)} broke a constraint when"
                                     f" confirmed ({'; '.join(confirmation.violations)})")
    # The baseline's runs were never chosen for being high: with the end baseline (when it held)
    # they are the reference; the leader is judged on its confirmation runs alone.
    reference = start.values + (check.end.values if check.reliable and check.end else [])
    leader = confirmation
    d = compare(spec, reference, leader.values)
    gain = gain_of(d)
    shown = f"{describe(leader.point)} changes {spec.objective.metric} by {d.delta_pct or 0:+.1f}%"
    if not improves(spec, d):
        return Recommendation(values=keep, keepCurrent=True, gain=gain, significant=False,
                              reason=f"{shown} in its confirmation runs, inside the noise"
                                     f" ({d.noise_text()}): keep the current settings")
    note = "" if check.reliable else f"; unreliable: {check.reason}"
    return Recommendation(values=dict(leader.point), keepCurrent=False, gain=gain, significant=True,
                          reason=f"{shown} over the current settings in its confirmation runs, beyond"
                                 " the noise"
                                 f" ({noise_interval(d.noise_low_pct, d.noise_high_pct)}){note}")
