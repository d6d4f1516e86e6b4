"""Tuning experiments for the control-plane tests: documents, and an agent whose benchmarks
measure a response surface of the values its last Apply set.

``SurfaceAgent`` is the FakeAgentClient (the seam the server's tests fake): Apply sets values in
its topology as the real agent does; each benchmark run measures ``surface(read_ahead_kb)`` with
multiplicative lognormal noise of a fixed CV, so an experiment through the real driver has a
known optimum and real noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stortune.schemas.bench.fioresult import DirectionResult, FioResult, JobResult
from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.bench.steps import WorkloadStep
from stortune.server.agentclient import BenchmarkOutcome, BenchmarkProgress
from tests.server.benchfakes import BenchAgent, Values, steady

EXPERIMENTS = "/api/v1/experiments"
#: Bytes/s of buffered 32K streams by read_ahead_kb: 0 starves the streams, 1024 is best.
SURFACE: dict[int, float] = {0: 90e6, 128: 300e6, 1024: 420e6, 4096: 400e6, 16384: 330e6}


def experiment_doc(name: str = "ra-sweep", *, values: list[Any] | None = None,
                   parameters: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "hostSelector": {"matchLabels": {"role": "streamer"}},
        "target": {"device": {"kind": ["loop"]}},
        "workloads": [{"preset": "stream-32k", "runtime": "1s"}],
        "objective": {"metric": "read_bandwidth"},
        "parameters": parameters if parameters is not None else [
            {"tunable": "read_ahead_kb", "values": values or [0, 128, 1024, 4096]}],
        "repeats": {"min": 2, "max": 3},
        "budget": {"trials": 30},
    }
    body.update(spec)
    return {"apiVersion": "stortune/v1", "kind": "TuningExperiment", "metadata": {"name": name}, "spec": body}


def surface_values(read_ahead: Callable[[], int], cv: float = 0.02, seed: int = 7) -> Values:
    rng = random.Random(seed)
    sigma = math.sqrt(math.log(1 + cv * cv))

    def values(step: WorkloadStep, repeat: int) -> dict[str, float]:
        ra = read_ahead()
        base = SURFACE.get(ra, 250e6)
        scale = base / 400e6 * math.exp(rng.gauss(-sigma * sigma / 2, sigma))
        return steady(scale, spread=0.0)(step, repeat)

    return values


@dataclass
class SurfaceAgent(BenchAgent):
    """Benchmarks measure the surface at the loop device's read_ahead_kb in effect when they start."""

    cv: float = 0.02
    hold: bool = False  # runs stay 'running' until finish() (for cancel and restart tests)
    settings_seen: list[dict[str, dict[str, int | str | None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.values = surface_values(self.read_ahead, self.cv)
        self.auto = not self.hold

    def read_ahead(self) -> int:
        device = self.topology.device("loop0")
        assert device is not None
        value = device.tunables["read_ahead_kb"].value
        return int(value) if isinstance(value, int) else 0

    def current(self) -> dict[str, dict[str, int | str | None]]:
        device = self.topology.device("loop0")
        assert device is not None
        return {"loop0": {k: s.value for k, s in device.tunables.items()}}

    def finish(self, run_id: str, state: str = "done", **kwargs: Any) -> BenchmarkResult:
        """The run's result, each step run with two jobs whose bandwidths drift apart as
        read-ahead grows (a big read-ahead starves concurrent streams): fairness to measure."""
        result = super().finish(run_id, state, **kwargs)
        unfair = {0: 0.02, 128: 0.04, 1024: 0.25, 4096: 0.35}.get(self.read_ahead(), 0.3)
        runs = []
        for run in result.runs:
            total = run.metrics.get("read_bandwidth", 0.0)
            jobs = [JobResult(name=f"job{i}", read=DirectionResult(bandwidth=total / 2 * (1 + sign * unfair)))
                    for i, sign in enumerate((-1, 1))]
            runs.append(run.model_copy(update={"fio": FioResult(jobs=jobs)}))
        stored = result.model_copy(update={"runs": runs})
        outcome = self.outcomes[run_id]
        self.outcomes[run_id] = BenchmarkOutcome(progress=outcome.progress, result=stored,
                                                 raw_files=outcome.raw_files, info=outcome.info)
        return stored

    async def start_benchmark(self, run_id: str, spec: Any) -> BenchmarkProgress:
        self.settings = self.current()
        if run_id not in self.started:
            self.settings_seen.append(self.current())
        return await super().start_benchmark(run_id, spec)
