"""Search strategies behind one small interface: given what was measured, which point next.

A strategy is a pure function of the points measured so far (each with its mean and
whether it met the constraints); the engine owns the loop, the repeats and the budget.
``one-at-a-time`` sweeps each parameter in turn with the others at their best so far,
as engineers do by hand; ``grid`` tries every point; ``bayesian`` asks Optuna's TPE
sampler, replaying the history into a fresh study for every proposal, so the same
history always gives the same proposal (a restarted control plane continues the search).
Optuna is imported by the bayesian strategy alone: nothing else pays for it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from stortune.schemas.catalog import Value
from stortune.schemas.tuning.space import Point, point_key


@dataclass(frozen=True)
class Dimension:
    key: str
    choices: tuple[Value, ...]


@dataclass(frozen=True)
class Tried:
    """A point measured to the end of its repeats (or given up)."""

    point: Point
    mean: float | None  # None: nothing measured (failed twice)
    feasible: bool


class Strategy(Protocol):
    def propose(self, tried: Sequence[Tried]) -> Point | None:
        """The next point to measure, never one of ``tried``; None when the search is done."""
        ...

    def estimate(self) -> int:
        """Points the search will probably measure (for progress)."""
        ...


def _best(tried: Sequence[Tried], maximize: bool) -> Tried | None:
    good = [t for t in tried if t.feasible and t.mean is not None]
    if not good:
        return None
    return max(good, key=lambda t: t.mean or 0.0) if maximize else min(good, key=lambda t: t.mean or 0.0)


class OneAtATime:
    """Each parameter in turn over its values, the others at their best so far (from the baseline)."""

    def __init__(self, dims: Sequence[Dimension], baseline: Point, maximize: bool) -> None:
        self.dims, self.baseline, self.maximize = list(dims), dict(baseline), maximize

    def propose(self, tried: Sequence[Tried]) -> Point | None:
        seen = {point_key(t.point): t for t in tried}
        current = dict(self.baseline)
        for dim in self.dims:
            sweep = [{**current, dim.key: v} for v in dim.choices]
            for point in sweep:
                if point_key(point) not in seen:
                    return point
            # The sweep is measured: keep its best value (the current one if none is feasible).
            done = [seen[point_key(p)] for p in sweep]
            here = seen.get(point_key(current))
            best = _best(done + ([here] if here else []), self.maximize)
            if best is not None:
                current = dict(best.point)
        return None

    def estimate(self) -> int:
        return 1 + sum(len(d.choices) for d in self.dims)


class Grid:
    """Every point, the first parameter varying slowest."""

    def __init__(self, dims: Sequence[Dimension]) -> None:
        self.dims = list(dims)

    def points(self) -> list[Point]:
        points: list[Point] = [{}]
        for dim in self.dims:
            points = [{**p, dim.key: v} for p in points for v in dim.choices]
        return points

    def propose(self, tried: Sequence[Tried]) -> Point | None:
        seen = {point_key(t.point) for t in tried}
        return next((p for p in self.points() if point_key(p) not in seen), None)

    def estimate(self) -> int:
        return math.prod(len(d.choices) for d in self.dims)


class Bayesian:
    """Optuna's TPE sampler through ask and tell, the history replayed into a fresh study."""

    #: Proposals asked for in one go before the search counts as converged (every one measured).
    ASKS = 32

    def __init__(self, dims: Sequence[Dimension], maximize: bool, seed: int, budget_points: int) -> None:
        self.dims, self.maximize, self.seed = list(dims), maximize, seed
        self.budget_points = budget_points
        self.size = math.prod(len(d.choices) for d in self.dims)

    def _distributions(self) -> dict[str, Any]:
        from optuna.distributions import CategoricalDistribution, IntDistribution

        # Numbers are ordered: the sampler models their index, so neighbours inform each other.
        return {d.key: IntDistribution(0, len(d.choices) - 1)
                if all(isinstance(v, int) for v in d.choices) and len(d.choices) > 1
                else CategoricalDistribution(list(d.choices)) for d in self.dims}

    def _params(self, point: Point, dists: dict[str, Any]) -> dict[str, Any] | None:
        from optuna.distributions import IntDistribution

        out: dict[str, Any] = {}
        for d in self.dims:
            value = point.get(d.key)
            if value not in d.choices:
                return None  # a point off the grid (the baseline's own values): not in the model
            out[d.key] = d.choices.index(value) if isinstance(dists[d.key], IntDistribution) else value
        return out

    def _point(self, params: dict[str, Any], dists: dict[str, Any]) -> Point:
        from optuna.distributions import IntDistribution

        return {d.key: d.choices[int(params[d.key])] if isinstance(dists[d.key], IntDistribution)
                else params[d.key] for d in self.dims}

    def propose(self, tried: Sequence[Tried]) -> Point | None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        seen = {point_key(t.point) for t in tried}
        if len(seen) >= self.size or self.stalled(tried):
            return None
        dists = self._distributions()
        worst = [t.mean for t in tried if t.mean is not None]
        penalty = (min(worst) if self.maximize else max(worst)) if worst else 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # A fresh study per proposal, seeded by the history's length: the same history
            # gives the same proposal, in this process or after a restart.
            sampler = optuna.samplers.TPESampler(
                seed=(self.seed * 1_000_003 + len(tried)) % 2**32, n_startup_trials=self.startup(),
                multivariate=True)
            study = optuna.create_study(direction="maximize" if self.maximize else "minimize",
                                        sampler=sampler)
            for t in tried:
                params = self._params(t.point, dists)
                if params is None:
                    continue
                # An infeasible or failed point stays in the model as infeasible (> 0).
                study.add_trial(optuna.trial.create_trial(
                    params=params, distributions=dists, value=t.mean if t.mean is not None else penalty,
                    constraints={"violation": 0.0 if t.feasible and t.mean is not None else 1.0}))
            for _ in range(self.ASKS):
                point = self._point(study.ask(dists).params, dists)
                if point_key(point) not in seen:
                    return point
        return None

    def patience(self) -> int:
        """Points without a new best after which the search has converged."""
        return max(8, min(20, self.size // 5))

    def stalled(self, tried: Sequence[Tried]) -> bool:
        best: float | None = None
        since = 0
        for t in tried:
            if t.feasible and t.mean is not None and (
                    best is None or (t.mean > best if self.maximize else t.mean < best)):
                best, since = t.mean, 0
            else:
                since += 1
        return len(tried) > self.startup() and since >= self.patience()

    def startup(self) -> int:
        """Random points before the model leads: a few, fewer on a small space."""
        return max(3, min(6, self.size // 8, self.budget_points // 3))

    def estimate(self) -> int:
        return min(self.size, self.budget_points)
