"""A simulated device for the engine: a response surface with measured noise, optional drift.

Tests and ``bench/tuning_search.py`` drive ``Engine`` with it in place of the fio runner:
each trial's metrics are the surface's true values times lognormal noise of coefficient of
variation ``NOISE_CV`` (multiplicative, as storage noise is), times a drift that grows with
the trial number when asked for (a device whose load changes during the run).

``NOISE_CV`` is measured on this machine: repeats of a buffered 32 KiB sequential-read
stream (the stream-32k preset, psync, 10 s each) on a direct-I/O loop device over a file
on disk, read_ahead_kb 128; see ``MEASURED`` for the figures.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stortune.schemas.catalog import Value
from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.evidence import Outcome
from stortune.schemas.tuning.space import Measurement, TrialRequest

#: Coefficient of variation of one run's bandwidth (see the module's docstring and MEASURED).
NOISE_CV = 0.03
MEASURED = "placeholder until the loop measurement lands"

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
    """Buffered sequential reads: read-ahead dominates (none is poor, a plateau from ~1 MiB and a
    slight loss beyond 4 MiB), deeper queues help a little, the scheduler barely matters."""
    ra = float(point.get("read_ahead_kb", 128) or 0)
    nr = float(point.get("nr_requests", 64) or 64)
    mib = 1 << 20
    bandwidth = 120 * mib + 380 * mib * (1 - math.exp(-ra / 600)) - 30 * mib * max(0.0, math.log2(
        max(ra, 1) / 4096)) / 2 + 12 * mib * math.log2(nr / 32) / 5
    if point.get("scheduler") == "none" or point.get("scheduler@beneath") == "none":
        bandwidth *= 1.01
    latency = 2000 + 8 * ra  # µs: a large window makes each request longer
    return {"read_bandwidth": bandwidth, "read_lat_p99": latency}


def flat(point: Mapping[str, Value]) -> dict[str, float]:
    """A device no parameter changes."""
    return {"read_bandwidth": 400.0 * (1 << 20), "read_lat_p99": 3000.0}

