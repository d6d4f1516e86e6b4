"""What a benchmark run produces, with the context that makes it evidence.

A ``BenchmarkResult`` carries the spec, the concrete steps, every step run
(the normalised fio result, the per-device statistics sampled from
/proc/diskstats while it ran), the summaries over repeats, the verdict of the
thresholds, and the ``RunContext``: every tunable in effect on the target and
the devices beneath it, the topology hash, kernel, fio and agent versions and
the profile generations the agent had applied.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.analysis.model import Bottleneck, PathShare, SlowMember
from stortune.schemas.bench import metrics
from stortune.schemas.bench.fioresult import FioResult
from stortune.schemas.bench.spec import Threshold
from stortune.schemas.bench.stats import IozoneTable, Summary, iozone_tables, summarize
from stortune.schemas.bench.steps import TargetFacts, WorkloadStep
from stortune.schemas.patterns import glob_matches

RunState = Literal["queued", "running", "done", "failed", "cancelled"]
RUN_STATES: Final = ("queued", "running", "done", "failed", "cancelled")
TERMINAL_STATES: Final = frozenset({"done", "failed", "cancelled"})
#: A member stands out when its await (else utilisation) is this many times its siblings' median.
STANDOUT = 1.5


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunProgress(_Model):
    """Where a run is; the agent publishes it as the run goes (level-like: the latest wins)."""

    run_id: str
    state: RunState
    percent: float = 0.0
    step: str | None = None
    step_index: int = Field(default=0, description="1-based index of the step running")
    step_count: int = 0
    repeat: int = 0
    read_bytes_per_s: float = 0.0
    write_bytes_per_s: float = 0.0
    read_iops: float = 0.0
    write_iops: float = 0.0
    eta_seconds: int = 0
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


class DeviceStats(_Model):
    """One device over one step run, from two /proc/diskstats samples (iostat -x's figures)."""

    device: str
    relation: str = Field(description="target, md-member, mpath-path, lvm-pv, disk ...")
    above: str | None = None
    seconds: float
    read_ios: int
    write_ios: int
    read_bytes: int
    write_bytes: int
    read_iops: float
    write_iops: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    util_percent: float | None = Field(description="Time with I/O in flight; None if not counted")
    read_await_ms: float | None = None
    write_await_ms: float | None = None
    await_ms: float | None = None
    queue_depth: float | None = Field(default=None, description="Average I/Os in flight (aqu-sz)")
    slowest: bool = Field(default=False, description="Stands out among its array's members")


def _load(s: DeviceStats) -> float | None:
    return s.await_ms if s.await_ms is not None else s.util_percent


def mark_slowest(stats: Sequence[DeviceStats]) -> list[DeviceStats]:
    """Flag, among the members of each array (or paths of a multipath LUN), the one
    whose await (or utilisation) is at least STANDOUT x the median of the others."""
    out = [s.model_copy() for s in stats]
    groups: dict[tuple[str | None, str], list[DeviceStats]] = {}
    for s in out:
        if s.relation in ("md-member", "mpath-path", "lvm-pv", "slave"):
            groups.setdefault((s.above, s.relation), []).append(s)
    for members in groups.values():
        busy = [m for m in members if _load(m) is not None and m.read_ios + m.write_ios > 0]
        if len(busy) < 2:
            continue
        worst = max(busy, key=lambda m: _load(m) or 0.0)
        others = statistics.median(_load(m) or 0.0 for m in busy if m is not worst)
        value = _load(worst) or 0.0
        worst.slowest = value > 0 and value >= STANDOUT * others
    return out


class StepRun(_Model):
    step: str
    repeat: int = Field(description="0-based")
    state: Literal["done", "failed", "cancelled"]
    started_at: float
    finished_at: float
    fio: FioResult | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    devices: list[DeviceStats] = Field(default_factory=list)
    message: str = ""
    #: Files of this step run, relative to the run's directory (job, output, stderr).
    files: dict[str, str] = Field(default_factory=dict)


class TargetInfo(_Model):
    kind: Literal["device", "file"]
    path: str = Field(description="Device node or file fio used")
    device: str | None = Field(default=None, description="Kernel name of the device (holding the file)")
    device_id: str | None = None
    size_bytes: int
    facts: TargetFacts
    created_file: bool = False


class BeneathDevice(_Model):
    device: str
    relation: str
    above: str | None = None


class RunContext(_Model):
    hostname: str | None = None
    kernel: str | None = None
    boot_id: str | None = None
    agent_version: str | None = None
    fio_version: str | None = None
    topology_hash: str
    target: TargetInfo
    devices: list[BeneathDevice] = Field(default_factory=list, description="Target and all beneath it")
    #: device -> tunable -> value in effect when the run started ("host" for sysctls)
    settings: dict[str, dict[str, int | str | None]] = Field(default_factory=dict)
    #: profile name -> generation the agent had applied, when it knows
    profiles: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


class ThresholdOutcome(_Model):
    metric: str
    step_glob: str
    step: str | None = Field(description="The step measured; None when none matched")
    minimum: float | None = None
    maximum: float | None = None
    observed: float | None = Field(description="Mean over the step's repeats")
    passed: bool
    message: str


class Verdict(_Model):
    passed: bool
    outcomes: list[ThresholdOutcome]


def evaluate(thresholds: Sequence[Threshold], summaries: dict[str, dict[str, Summary]]) -> Verdict:
    """Each threshold against the mean of every matching step that measured its metric."""
    outcomes: list[ThresholdOutcome] = []
    for t in thresholds:
        metric = metrics.get(t.metric)
        matched = [(step, m[t.metric]) for step, m in summaries.items()
                   if glob_matches(t.step, step) and t.metric in m]
        if not matched:
            outcomes.append(ThresholdOutcome(
                metric=t.metric, step_glob=t.step, step=None, minimum=t.min, maximum=t.max,
                observed=None, passed=False,
                message=f"no step matching {t.step!r} measured {t.metric}"))
            continue
        for step, summary in matched:
            low = t.min is not None and summary.mean < t.min
            high = t.max is not None and summary.mean > t.max
            shown = metric.human(summary.mean)
            if low:
                message = f"{step}: {t.metric} {shown} is below {metric.human(t.min or 0)}"
            elif high:
                message = f"{step}: {t.metric} {shown} is above {metric.human(t.max or 0)}"
            else:
                message = f"{step}: {t.metric} {shown} meets {t.describe()}"
            outcomes.append(ThresholdOutcome(
                metric=t.metric, step_glob=t.step, step=step, minimum=t.min, maximum=t.max,
                observed=summary.mean, passed=not (low or high), message=message))
    return Verdict(passed=all(o.passed for o in outcomes), outcomes=outcomes)


class StepSummary(_Model):
    step: str
    runs: int = Field(description="Successful runs summarised")
    metrics: dict[str, Summary] = Field(default_factory=dict)


def summarize_runs(steps: Sequence[WorkloadStep], runs: Sequence[StepRun]) -> list[StepSummary]:
    """Per step, each metric over its successful repeats (failed runs are not averaged in)."""
    out = []
    for step in steps:
        good = [r for r in runs if r.step == step.name and r.state == "done"]
        values: dict[str, list[float]] = {}
        for run in good:
            for name, value in run.metrics.items():
                values.setdefault(name, []).append(value)
        out.append(StepSummary(step=step.name, runs=len(good),
                               metrics={k: summarize(v) for k, v in values.items()}))
    return out


class BenchmarkResult(_Model):
    run_id: str
    name: str = Field(description="The spec's metadata.name")
    state: RunState
    message: str = ""
    spec: dict[str, Any] = Field(description="The BenchmarkSpec document as run")
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    context: RunContext | None = None
    steps: list[WorkloadStep] = Field(default_factory=list)
    runs: list[StepRun] = Field(default_factory=list)
    summaries: list[StepSummary] = Field(default_factory=list)
    verdict: Verdict | None = None
    iozone: list[IozoneTable] = Field(default_factory=list)
    #: Per step, which layer was the limit (mean figures over the step's repeats); empty in
    #: results stored before the verdict existed, and when the target's layers are unknown.
    bottlenecks: list[Bottleneck] = Field(default_factory=list)
    #: Members and paths slower than their peers in most of the run's step runs.
    slow_members: list[SlowMember] = Field(default_factory=list)
    #: Each multipath path's and HBA port's share of the I/O over the whole run, idle ones included.
    balance: list[PathShare] = Field(default_factory=list)

    def summaries_by_step(self) -> dict[str, dict[str, Summary]]:
        return {s.step: dict(s.metrics) for s in self.summaries if s.metrics}

    def concluded(self, thresholds: Sequence[Threshold]) -> BenchmarkResult:
        """A copy with summaries, the iozone tables and (when thresholds exist) the verdict."""
        summaries = summarize_runs(self.steps, self.runs)
        by_step = {s.step: dict(s.metrics) for s in summaries if s.metrics}
        return self.model_copy(update={
            "summaries": summaries,
            "iozone": iozone_tables(self.steps, by_step),
            "verdict": evaluate(thresholds, by_step) if thresholds else None,
        })
