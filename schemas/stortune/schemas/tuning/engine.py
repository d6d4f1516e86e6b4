"""The experiment engine: ask for a trial, tell it what the trial measured, read the outcome.

Pure and replayable: what ``next()`` asks for is a function of the spec, the baseline, the
seed and the measurements recorded, so a restarted control plane rebuilds the engine from
the stored measurements and continues where it stopped, with no trial lost or run twice.

The order of a run:
1. the baseline (the values in effect before), ``baseline_runs`` runs (at least 3);
2. the strategy's points, ``repeats.min`` runs each (a failed run is retried once; a point
   that fails twice is given up);
3. adaptive repeats: one more run of the leader or the runner-up (whichever has fewer)
   until the noise rule separates them or both reached ``repeats.max``;
4. confirmation: ``confirm_runs`` fresh runs of the leader. Its gain is judged on these
   alone: the runs that made it the leader are biased upwards (the best of many noisy
   means beats the baseline by chance), and noise must never be recommended;
5. the baseline again (``baseline-end``): if it moved beyond the noise, the result is
   flagged unreliable.
The trial budget always keeps room for steps 4 and 5.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.tuning import evidence
from stortune.schemas.tuning.evidence import MAX_FAILURES, Outcome, TrialSummary
from stortune.schemas.tuning.experiment import MemoryBound, TuningSpec
from stortune.schemas.tuning.space import Measurement, Point, Purpose, TrialRequest, describe, point_key
from stortune.schemas.tuning.strategies import Bayesian, Dimension, Grid, OneAtATime, Strategy, Tried


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Progress(_Model):
    done: int = Field(description="Trials recorded (failed ones included)")
    total_estimate: int
    leader: Point | None = None
    leader_mean: float | None = None
    margin_pct: float | None = Field(default=None, description="Leader against the runner-up, in %")
    best_so_far: list[float | None] = Field(
        default_factory=list, description="The best feasible mean after each trial")


class TrialPlan(_Model):
    """What an experiment will do, before it runs (``?dryRun=All``)."""

    strategy: str
    parameters: dict[str, list[int | str]] = Field(description="Each parameter's values to try")
    excluded: dict[str, list[int | str]] = Field(
        default_factory=dict, description="Values a memory bound rules out before any run")
    grid_size: int
    trials_estimate: int = Field(description="Benchmark runs, both baselines and the confirmation included")
    trials_budget: int
    duration_budget_s: float | None = None
    baseline_runs: int
    confirm_runs: int
    repeats: dict[str, int]
    first: list[Point] = Field(description="The first points the search will measure (at most 20)")


def trial_plan(spec: TuningSpec, baseline: Point, members: int = 1) -> TrialPlan:
    """The plan of a run from ``baseline``: the space, the order it starts in, what it costs."""
    engine = Engine(spec, baseline, members=members)
    dims = dimensions(spec, members)
    excluded = {p.key: [v for v in p.choices() if v not in d.choices]
                for p, d in zip(spec.parameters, dims, strict=True)}
    first: list[Point] = []
    if isinstance(engine.strategy, Grid):
        first = engine.strategy.points()[:20]
    elif isinstance(engine.strategy, OneAtATime):
        sweep = dims[0]
        first = [{**engine.baseline, sweep.key: v} for v in sweep.choices
                 if v != engine.baseline[sweep.key]][:20]
    return TrialPlan(
        strategy=spec.strategy, parameters={d.key: list(d.choices) for d in dims},
        excluded={k: v for k, v in excluded.items() if v}, grid_size=math.prod(len(d.choices) for d in dims),
        trials_estimate=engine.total_estimate(), trials_budget=spec.budget.trials,
        duration_budget_s=spec.budget.duration, baseline_runs=spec.baseline_runs,
        confirm_runs=spec.confirm_runs, repeats={"min": spec.repeats.min, "max": spec.repeats.max},
        first=first)


def dimensions(spec: TuningSpec, members: int = 1) -> list[Dimension]:
    """Each parameter's values, without those a memory bound rules out before any run."""
    bounds = [c.memory for c in spec.constraints if isinstance(c, MemoryBound)]
    dims = []
    for p in spec.parameters:
        choices = p.choices()
        if p.tunable == "stripe_cache_size" and bounds:
            choices = [v for v in choices
                       if evidence.memory_cost({p.tunable: v}, members) <= min(bounds)]
        dims.append(Dimension(p.key, tuple(choices)))
    return dims


def make_strategy(spec: TuningSpec, baseline: Point, seed: int, members: int = 1) -> Strategy:
    dims = dimensions(spec, members)
    maximize = spec.objective.maximize
    if spec.strategy == "grid":
        return Grid(dims)
    if spec.strategy == "bayesian":
        room = spec.budget.trials - 2 * spec.baseline_runs - spec.confirm_runs
        return Bayesian(dims, maximize, seed, max(1, room // spec.repeats.min))
    return OneAtATime(dims, baseline, maximize)


class Engine:
    def __init__(self, spec: TuningSpec, baseline: Point, history: Sequence[Measurement] = (),
                 seed: int = 0, members: int = 1) -> None:
        missing = [k for k in spec.keys if k not in baseline]
        if missing:
            raise ValueError(f"the baseline gives no value for {', '.join(missing)}")
        self.spec = spec
        self.baseline: Point = {k: baseline[k] for k in spec.keys}
        self.seed = seed
        self.members = members
        self.strategy = make_strategy(spec, self.baseline, seed, members)
        # What a recorded point may hold: a value tried, or the baseline's (one-at-a-time starts there).
        self._allowed = {d.key: {*d.choices, self.baseline[d.key]} for d in dimensions(spec, members)}
        self.measurements: list[Measurement] = []
        self.finished_reason: str | None = None
        self._cut: str | None = None  # why the search stopped early (a budget)
        for m in history:
            self.record(m)

    # -- telling ------------------------------------------------------------------
    def record(self, m: Measurement) -> None:
        """A trial's measurement; one already recorded (same index and point) is ignored."""
        # Checked again: model_copy(update=...) skips the validators that drop impossible figures.
        m = Measurement.model_validate(m.model_dump())
        if set(m.point) != set(self.spec.keys):
            raise ValueError(f"measurement {m.index} is of {describe(m.point)}, not a point of this"
                             f" experiment ({', '.join(self.spec.keys)})")
        if m.index < len(self.measurements):
            had = self.measurements[m.index]
            if point_key(had.point) != point_key(m.point) or had.purpose != m.purpose:
                raise ValueError(f"trial {m.index} was already recorded, of {describe(had.point)}")
            return
        if m.index > len(self.measurements):
            raise ValueError(f"trial {m.index} recorded before trial {len(self.measurements)}")
        for key, value in m.point.items():
            if value not in self._allowed[key]:
                raise ValueError(f"measurement {m.index} has {key}={value!r:.40}, not a value of this"
                                 " experiment (was its document changed?)")
        if m.purpose in ("baseline", "baseline-end") and point_key(m.point) != point_key(self.baseline):
            raise ValueError(f"measurement {m.index} is a baseline run of {describe(m.point)}, but the"
                             f" baseline is {describe(self.baseline)}")
        self.measurements.append(m)

    # -- asking -------------------------------------------------------------------
    def _runs(self, point: Point, *, end: bool = False) -> list[Measurement]:
        """The runs of ``point`` in the search (or, with ``end``, the end baseline's)."""
        key = point_key(point)
        if end:
            return [m for m in self.measurements if point_key(m.point) == key and m.purpose == "baseline-end"]
        return [m for m in self.measurements if point_key(m.point) == key and m.purpose not in evidence.APART]

    def _complete(self, runs: Sequence[Measurement], wanted: int) -> bool:
        ok = sum(1 for m in runs if evidence.usable(self.spec, m))
        return ok >= wanted or len(runs) - ok >= MAX_FAILURES

    def _request(self, point: Point, purpose: Purpose, reason: str) -> TrialRequest:
        return TrialRequest(index=len(self.measurements), point=dict(point), purpose=purpose,
                            total_estimate=self.total_estimate(), reason=reason)

    def _summaries(self) -> list[TrialSummary]:
        return evidence.by_point(self.spec, self.measurements, self.members)

    def _tried(self, summaries: Sequence[TrialSummary]) -> list[Tried]:
        return [Tried(point=s.point, mean=s.mean, feasible=s.feasible) for s in summaries]

    def next(self, elapsed_s: float | None = None) -> TrialRequest | None:
        """The next trial to run, or None when the experiment is finished (see ``finished_reason``)."""
        if self.finished_reason is not None:
            return None
        spec = self.spec
        used = len(self.measurements)
        if used >= spec.budget.trials:
            return self._finish("budget-trials")
        base_runs = [m for m in self._runs(self.baseline) if m.purpose == "baseline"]
        if not self._complete(base_runs, spec.baseline_runs):
            return self._request(self.baseline, "baseline", f"the current settings, run {len(base_runs) + 1}")
        if not any(evidence.usable(spec, m) for m in base_runs):
            return self._finish("baseline-failed")
        closing = any(m.purpose in ("confirm", "baseline-end") for m in self.measurements)
        if not closing and self._cut is None:
            limit = spec.budget.duration
            if limit is not None and elapsed_s is not None and elapsed_s >= limit:
                self._cut = "budget-duration"
            elif used >= spec.budget.trials - spec.baseline_runs - spec.confirm_runs:
                self._cut = "budget-trials"
            else:
                req = self._search()
                if req is not None:
                    return req
        req = self._confirm()
        if req is not None:
            return req
        end = self._runs(self.baseline, end=True)
        if not self._complete(end, spec.baseline_runs):
            return self._request(self.baseline, "baseline-end",
                                 f"the current settings again, to check nothing drifted (run {len(end) + 1})")
        return self._finish(self._cut or self._why_closed())

    def _why_closed(self) -> str:
        """Why a run rebuilt from its history closed: the search was complete, or a budget cut it
        (the elapsed time that cut it is not in the history; a search with room left was cut by it)."""
        closing = next(i for i, m in enumerate(self.measurements) if m.purpose in ("confirm", "baseline-end"))
        replay = Engine(self.spec, self.baseline, self.measurements[:closing], self.seed, self.members)
        if replay._search() is None:
            return "done"
        room = closing < self.spec.budget.trials - self.spec.baseline_runs - self.spec.confirm_runs
        return "budget-duration" if room and self.spec.budget.duration is not None else "budget-trials"

    def leader(self) -> TrialSummary | None:
        """The best feasible point by the search's runs (confirmation runs apart)."""
        order = self._contenders(self._summaries())
        return order[0] if order else None

    def _confirm(self) -> TrialRequest | None:
        if any(m.purpose == "baseline-end" for m in self.measurements):
            return None
        done = [m for m in self.measurements if m.purpose == "confirm"]
        if done:
            point = done[0].point  # the leader when confirmation began
        else:
            best = self.leader()
            if best is None or point_key(best.point) == point_key(self.baseline):
                return None  # nothing to confirm: the current settings stay
            point = best.point
        if self._complete(done, self.spec.confirm_runs):
            return None
        return self._request(point, "confirm", f"{describe(point)}, the leader: fresh run {len(done) + 1}"
                                               " to confirm its gain")

    def _finish(self, reason: str) -> TrialRequest | None:
        self.finished_reason = reason
        return None

    def _search(self) -> TrialRequest | None:
        lo = self.spec.repeats.min
        # A point under way is measured to the end of its repeats before anything else.
        last = next((m for m in reversed(self.measurements) if m.purpose in ("explore", "repeat")), None)
        if last is not None and last.purpose == "explore":
            runs = self._runs(last.point)
            explore = [m for m in runs if m.purpose == "explore"]
            if not self._complete(explore, lo):
                return self._request(last.point, "explore", f"{describe(last.point)}, run {len(explore) + 1}")
        summaries = self._summaries()
        if not any(m.purpose == "repeat" for m in self.measurements):
            point = self.strategy.propose(self._tried(summaries))
            if point is not None:
                return self._request(point, "explore", f"{describe(point)} ({self.spec.strategy})")
        return self._refine(summaries)

    def _refine(self, summaries: Sequence[TrialSummary]) -> TrialRequest | None:
        """One more run of the leader or the runner-up, until the noise rule separates them."""
        order = self._contenders(summaries)
        if len(order) < 2:
            return None
        leader, runner = order[0], order[1]
        d = evidence.compare(self.spec, runner.values, leader.values)
        if d.significant:
            return None
        hi = self.spec.repeats.max
        pick = leader if leader.n <= runner.n else runner
        if pick.n >= hi:
            pick = runner if pick is leader else leader
        if pick.n >= hi:
            return None
        role = "leader" if pick is leader else "runner-up"
        return self._request(pick.point, "repeat",
                             f"{describe(pick.point)} ({role}, run {pick.n + 1}): the leader is"
                             f" {d.delta_pct or 0:+.1f}% from the runner-up, inside the noise"
                             f" ({d.noise_text()})")

    def _contenders(self, summaries: Sequence[TrialSummary]) -> list[TrialSummary]:
        """The feasible points best first, without those given up (repeats failed twice); one
        pass over the history (a pass per point made the live view quadratic)."""
        failed: dict[tuple[tuple[str, int | str], ...], int] = {}
        for m in self.measurements:
            if m.purpose == "repeat" and not evidence.usable(self.spec, m):
                key = point_key(m.point)
                failed[key] = failed.get(key, 0) + 1
        return [s for s in evidence.ranked(self.spec, summaries)
                if failed.get(point_key(s.point), 0) < MAX_FAILURES]

    # -- reading ------------------------------------------------------------------
    def total_estimate(self) -> int:
        lo, hi = self.spec.repeats.min, self.spec.repeats.max
        estimate = (2 * self.spec.baseline_runs + self.strategy.estimate() * lo + 2 * (hi - lo)
                    + self.spec.confirm_runs)
        return max(len(self.measurements), min(self.spec.budget.trials, estimate))

    def progress(self) -> Progress:
        order = self._contenders(self._summaries())
        margin = None
        if len(order) >= 2:
            margin = evidence.compare(self.spec, order[1].values, order[0].values).delta_pct
        return Progress(done=len(self.measurements), total_estimate=self.total_estimate(),
                        leader=order[0].point if order else None,
                        leader_mean=order[0].mean if order else None, margin_pct=margin,
                        best_so_far=self.best_so_far())

    def best_so_far(self) -> list[float | None]:
        """The best feasible mean of the search as it stood after each trial.

        Incremental (a heap of the points' standings, stale entries skipped): ranking every
        point after every trial made the live view quadratic in the trials."""
        out: list[float | None] = []
        sign = -1.0 if self.spec.objective.maximize else 1.0
        runs: dict[tuple[tuple[str, int | str], ...], list[Measurement]] = {}
        standing: dict[tuple[tuple[str, int | str], ...], tuple[float, int, float]] = {}
        heap: list[tuple[float, int, tuple[tuple[str, int | str], ...]]] = []
        for m in self.measurements:
            if m.purpose not in evidence.APART:
                key = point_key(m.point)
                runs.setdefault(key, []).append(m)
                s = evidence.summarize_point(self.spec, runs[key], self.members)
                if s.feasible and s.mean is not None:
                    standing[key] = (sign * s.mean, s.first_index, s.mean)
                    heapq.heappush(heap, (sign * s.mean, s.first_index, key))
                else:
                    standing.pop(key, None)
            while heap and standing.get(heap[0][2], (None, None))[:2] != heap[0][:2]:
                heapq.heappop(heap)
            out.append(standing[heap[0][2]][2] if heap else None)
        return out

    def outcome(self) -> Outcome:
        return evidence.outcome(self.spec, self.baseline, self.measurements, self.members,
                                self.finished_reason)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None
