"""A simulated device for the engine: a response surface with measured noise, optional drift.

Tests and ``bench/tuning_search.py`` drive ``Engine`` with it in place of the fio runner:
each trial's metrics are the surface's true values times lognormal noise of coefficient of
variation ``NOISE_CV`` (multiplicative, as storage noise is), times a drift that grows with
the trial number when asked for (a device whose load changes during the run).

``NOISE_CV`` is measured on this machine with bench/tuning_noise.py: repeats of the
stream-32k preset (8 buffered psync readers of 32 KiB, each through its own 256 MiB region)
on a direct-I/O loop device (``losetup --direct-io=on``) over a 2 GiB file written on the
root disk (virtio, 2 vCPUs shared with other work); see ``MEASURED``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stortune.schemas.bench.stats import NOISE_FLOOR
from stortune.schemas.catalog import Value
from stortune.schemas.tuning import evidence
from stortune.schemas.tuning.engine import Engine, dimensions
from stortune.schemas.tuning.evidence import Outcome
from stortune.schemas.tuning.experiment import TuningSpec
from stortune.schemas.tuning.space import Measurement, Point, TrialRequest
from stortune.schemas.tuning.strategies import Grid

#: Coefficient of variation of one run's bandwidth (see the module's docstring and MEASURED).
NOISE_CV = 0.11
MEASURED = (
    "2026-11-25, bench/tuning_noise.py --size 2G, two sessions on a fresh loop device each."
    " read_ahead_kb 128: 10 runs 985..2105 MB/s and 12 runs 640..2347 MB/s; the first run of a"
    " new device is the slow one (the host's cache of the new file warming), without it the CV"
    " is 10.9% (9 runs) and 12.0% (11 runs), with it 17.7% and 24.3%. read_ahead_kb 0: 10 runs"
    " 175..214 MB/s, CV 7.7%. NOISE_CV takes the steady state at 128: 11%."
)

Response = Callable[[Mapping[str, Value]], dict[str, float]]


@dataclass
class Surface:
    """True metrics per point, measured with noise; ``drift`` multiplies every metric by
    (1 + drift x trial index), a device slowly changing under the experiment."""

    response: Response
    cv: float = NOISE_CV
    drift: float = 0.0
    seed: int = 0
    fail: Callable[[TrialRequest], str | None] = field(default=lambda _req: None)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)  # noqa: S311 (noise, not secrets)
        # lognormal with this CV: sigma^2 = ln(1 + cv^2), mean 1
        self._sigma = math.sqrt(math.log1p(self.cv**2))

    def run(self, req: TrialRequest) -> Measurement:
        why = self.fail(req)
        if why is not None:
            return Measurement(index=req.index, point=req.point, purpose=req.purpose, ok=False, message=why)
        factor = (1 + self.drift * req.index)
        out: dict[str, float] = {}
        job_cv: float | None = None
        for name, value in self.response(req.point).items():
            noisy = value * factor * math.exp(self._rng.gauss(-self._sigma**2 / 2, self._sigma))
            if name == "job_cv":
                job_cv = noisy
            else:
                out[name] = noisy
        return Measurement(index=req.index, point=req.point, purpose=req.purpose, metrics=out, job_cv=job_cv)


def drive(engine: Engine, surface: Surface, limit: int = 100_000) -> Outcome:
    """Run the engine to its end against the surface."""
    for _ in range(limit):
        req = engine.next()
        if req is None:
            break
        engine.record(surface.run(req))
    return engine.outcome()


def streaming(point: Mapping[str, Value]) -> dict[str, float]:
    """Buffered sequential reads, shaped like the field's stories: read-ahead dominates (none is
    poor; a peak at 2 MiB, more starves the page cache), the queue depth has its own best
    (256), the scheduler matters a little (none is 3% better). About one point in twenty is
    within 11% of the best, so finding it takes a search."""
    ra = float(point.get("read_ahead_kb", 128) or 0)
    nr = float(point.get("nr_requests", 64) or 64)
    mib = 1 << 20
    bandwidth = 120 * mib + 380 * mib * (1 - math.exp(-ra / 600))
    if ra > 2048:
        bandwidth -= 60 * mib * math.log2(ra / 2048)
    bandwidth *= 1 - 0.06 * abs(math.log2(nr / 256))
    scheduler = point.get("scheduler", point.get("scheduler@beneath"))
    bandwidth *= 1.0 if scheduler == "none" else 0.97
    latency = 2000 + 8 * ra  # µs: a large window makes each request longer
    return {"read_bandwidth": bandwidth, "read_lat_p99": latency}


def flat(point: Mapping[str, Value]) -> dict[str, float]:
    """A device no parameter changes."""
    return {"read_bandwidth": 400.0 * (1 << 20), "read_lat_p99": 3000.0}



@dataclass(frozen=True)
class SearchCost:
    """How one search went against the surface's truth."""

    trials: int  # every trial the engine ran, both baselines included
    points: int  # distinct points measured
    to_within_noise: int | None  # trials until the leader's true value was within the noise of the best
    best: float  # the best true value over the grid (feasible points)
    found: float  # the true value of the recommended point
    recommended: Point


def true_best(spec: TuningSpec, response: Response, metric: str, members: int = 1) -> tuple[Point, float]:
    """The best feasible point of the whole grid by the surface's true values."""
    values = [(p, response(p)[metric]) for p in Grid(dimensions(spec, members)).points()]
    pick = max if spec.objective.maximize else min
    return pick(values, key=lambda pv: pv[1])


def within_noise(spec: TuningSpec, value: float, best: float, tolerance: float = NOISE_FLOOR) -> bool:
    """``value`` is as good as ``best`` within ``tolerance`` (a ratio)."""
    return value >= best / (1 + tolerance) if spec.objective.maximize else value <= best * (1 + tolerance)


def search_cost(spec: TuningSpec, baseline: Point, surface: Surface, seed: int = 0) -> SearchCost:
    """Run a whole experiment and measure, trial by trial, how soon its leader was good enough."""
    metric = spec.objective.metric
    _, best = true_best(spec, surface.response, metric)
    engine = Engine(spec, baseline, seed=seed)
    outcome = drive(engine, surface)
    # From which trial on the leader stayed good enough (a lucky early leader that falls back
    # does not count).
    reached: int | None = None
    for i in range(len(engine.measurements), 0, -1):
        order = evidence.ranked(spec, evidence.by_point(spec, engine.measurements[:i]))
        # Within the noise: one run's CV (at least the noise rule's 5% floor); closer than
        # that, one run of each cannot tell two points apart.
        true = surface.response(order[0].point)[metric] if order else None
        if true is None or not within_noise(spec, true, best, max(NOISE_FLOOR, surface.cv)):
            break
        reached = i
    points = {tuple(sorted(m.point.items())) for m in engine.measurements}
    recommended = outcome.recommendation.values
    return SearchCost(trials=len(engine.measurements), points=len(points), to_within_noise=reached,
                      best=best, found=surface.response(recommended)[metric], recommended=recommended)
