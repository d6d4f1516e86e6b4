"""Points of an experiment's space, the trials asked for, and what one benchmark run measured.

A point gives each parameter a value, keyed ``tunable`` (on the target) or
``tunable@beneath`` (on every device beneath it) in the order of the parameters.
One trial is one benchmark run of one point; ``measure`` turns its result into the
figures the engine judges: the objective, the constrained metrics, and the fairness
across concurrent jobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.schemas.catalog import Value
from stortune.schemas.patterns import glob_matches
from stortune.schemas.profile import Metadata
from stortune.schemas.tuning.experiment import Fairness, MetricBound, TuningExperiment, TuningSpec

Point = dict[str, Value]
Purpose = Literal["baseline", "explore", "repeat", "confirm", "baseline-end"]
PURPOSES: tuple[Purpose, ...] = ("baseline", "explore", "repeat", "confirm", "baseline-end")
#: The metric under which a measurement carries the fairness figure (CV of per-job bandwidth, %).
JOB_CV = "job_cv"
#: Above any figure a block device gives (bytes/s, IOPS, microseconds): a run reporting more, a
#: negative figure, NaN or infinity measured nothing (and a square of it would overflow the stats).
MAX_FIGURE = 1e15
#: The longest message kept with a measurement (a failed run's fio error can be long).
MESSAGE_MAX = 2000


def figure(value: float | None) -> float | None:
    """``value`` if a device could have measured it, else None."""
    return value if value is not None and math.isfinite(value) and 0 <= value <= MAX_FIGURE else None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def point_key(point: Mapping[str, Value]) -> tuple[tuple[str, Value], ...]:
    """A hashable form of a point; equal points have equal keys whatever their order."""
    return tuple(sorted(point.items()))


def describe(point: Mapping[str, Value]) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items()) or "(no parameters)"


class TrialRequest(_Model):
    """What the engine wants measured next: one benchmark run of ``point``."""

    index: int = Field(ge=0, description="0-based; the measurement of this trial carries it")
    point: Point
    purpose: Purpose
    total_estimate: int = Field(description="Trials the experiment will probably take in all")
    reason: str = Field(description="Why this trial, in words")


class Measurement(_Model):
    """One trial's outcome: the figures of one benchmark run of a point (or why there are none)."""

    index: int = Field(ge=0)
    point: Point
    purpose: Purpose
    ok: bool = True
    metrics: dict[Annotated[str, StringConstraints(max_length=64)], float] = Field(
        default_factory=dict, max_length=32, description="The objective's and the constrained metrics'"
                                                        " values (none negative, NaN or infinite)")
    job_cv: float | None = Field(default=None, description="Largest CV of per-job bandwidth (%), for"
                                                           " a fairness constraint")
    message: str = ""
    run_id: str | None = Field(default=None, max_length=256)
    started_at: float | None = None
    finished_at: float | None = None
    host: str | None = Field(default=None, max_length=253)

    @field_validator("metrics")
    @classmethod
    def _measurable(cls, v: dict[str, float]) -> dict[str, float]:
        # Dropped, not refused: a stored history replays whatever a broken run reported, and
        # a run without its objective counts as failed.
        return {k: x for k, x in v.items() if figure(x) is not None}

    @field_validator("job_cv")
    @classmethod
    def _cv(cls, v: float | None) -> float | None:
        return figure(v)

    @field_validator("message")
    @classmethod
    def _short(cls, v: str) -> str:
        return v if len(v) <= MESSAGE_MAX else v[:MESSAGE_MAX - 3] + "..."


def _spec(exp: TuningExperiment | TuningSpec) -> TuningSpec:
    return exp.spec if isinstance(exp, TuningExperiment) else exp


def benchmark_for(exp: TuningExperiment, name: str) -> BenchmarkSpec:
    """The BenchmarkSpec every trial of ``exp`` runs: its target and workloads, one repeat
    (repeats are the engine's), each job reported apart when fairness is constrained."""
    body = exp.spec.bench_body(per_job=bool(exp.spec.fairness))
    return BenchmarkSpec(metadata=Metadata(name=name, labels={"stortune.io/experiment": exp.name[:63]}
                                           if len(exp.name) <= 63 else {}), spec=body)


def _mean_over_steps(result: BenchmarkResult, glob: str, metric: str) -> float | None:
    values = [s.metrics[metric].mean for s in result.summaries
              if glob_matches(glob, s.step) and metric in s.metrics]
    return math.fsum(values) / len(values) if values else None


def _cv(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = math.fsum(values) / len(values)
    if mean <= 0:
        return None
    var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return 100 * math.sqrt(var) / mean


def job_cv(result: BenchmarkResult, fairness: Fairness) -> float | None:
    """The largest CV (%) of per-job bandwidth over the step runs the constraint names."""
    direction = fairness.fairness.removesuffix("_bandwidth")
    worst: float | None = None
    for run in result.runs:
        if run.state != "done" or run.fio is None or not glob_matches(fairness.step, run.step):
            continue
        if direction == "total":
            per_job = [j.read.bandwidth + j.write.bandwidth for j in run.fio.jobs]
        else:
            per_job = [getattr(j, direction).bandwidth for j in run.fio.jobs]
        cv = _cv(per_job)
        if cv is not None:
            worst = cv if worst is None else max(worst, cv)
    return worst


def measure(result: BenchmarkResult, exp: TuningExperiment | TuningSpec, request: TrialRequest,
            host: str | None = None) -> Measurement:
    """The figures of one run for the engine; a run that failed or lacks the objective is not ok."""
    spec = _spec(exp)
    base = Measurement(index=request.index, point=dict(request.point), purpose=request.purpose,
                       run_id=result.run_id, started_at=result.started_at,
                       finished_at=result.finished_at, host=host, ok=False)
    if result.state != "done":
        return base.model_copy(update={"message": result.message or f"the benchmark run {result.state}"})
    found: dict[str, float] = {}
    wanted = [(spec.objective.step, spec.objective.metric)]
    wanted += [(c.step, c.metric) for c in spec.constraints if isinstance(c, MetricBound)]
    for glob, metric in wanted:
        value = _mean_over_steps(result, glob, metric)
        if value is not None and math.isfinite(value):  # a NaN would poison every mean after it
            found[metric] = value
    if spec.objective.metric not in found:
        return base.model_copy(update={
            "metrics": found,
            "message": f"no step matching {spec.objective.step!r} measured {spec.objective.metric}"})
    cvs = [cv for f in spec.fairness if (cv := job_cv(result, f)) is not None]
    return base.model_copy(update={"ok": True, "metrics": found, "job_cv": max(cvs) if cvs else None,
                                   "message": result.message})


def failed(request: TrialRequest, message: str, host: str | None = None,
           run_id: str | None = None) -> Measurement:
    """A trial that produced no figures (apply refused, agent lost, fio failed)."""
    return Measurement(index=request.index, point=dict(request.point), purpose=request.purpose, ok=False,
                       message=message, host=host, run_id=run_id)
