"""Benchmark runs, comparisons, baselines and schedules as the API shows them.

Runs follow the Kubernetes shape (metadata, spec, status). The BenchmarkSpec and
the BenchmarkResult travel as the documents of ``stortune.schemas.bench``
(snake_case inside, as the agents write them); the envelopes are camelCase
like every other API object.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, field_validator

from stortune.schemas.bench import metrics
from stortune.schemas.bench.stats import MetricDelta
from stortune.schemas.bench.steps import WorkloadStep
from stortune.schemas.profile import LabelSelector
from stortune.server.api.label_selector import MAX_SELECTOR_TEXT, parse_text
from stortune.server.db.tables import BenchmarkBaseline, BenchmarkRawFile, BenchmarkRun, BenchmarkSchedule
from stortune.server.models.common import API_VERSION, RequestModel
from stortune.server.models.meta import ObjectMeta

if TYPE_CHECKING:
    from stortune.server.bench.judge import Comparison


# -- runs ---------------------------------------------------------------------------------------
class RunSpecView(BaseModel):
    host: str
    benchmark: dict[str, Any] = Field(description="The BenchmarkSpec document (canonical units)")
    schedule: str | None = None
    requestedBy: str


class RunContextView(BaseModel):
    """The versions and profile generations the run was measured under (the full context,
    every tunable value included, is in the result)."""

    kernel: str | None = None
    fioVersion: str | None = None
    topologyHash: str | None = None
    profiles: dict[str, int] = Field(default_factory=dict,
                                     description="Profile -> generation in effect on the host")


class RunStatusView(BaseModel):
    state: Literal["queued", "running", "done", "failed", "cancelled"]
    message: str
    progress: dict[str, Any] = Field(default_factory=dict, description=(
        "The latest progress: percent, readBytesPerSecond, writeBytesPerSecond, readIops, "
        "writeIops, etaSeconds, message (the step), updatedAt"))
    startedAt: datetime | None = None
    finishedAt: datetime | None = None
    cancelRequested: bool = False
    attempts: int = Field(default=0, description="Starts refused so far (agent busy or unreachable)")
    nextAttemptAt: datetime | None = None
    context: RunContextView
    passed: bool | None = Field(default=None, description="The thresholds' verdict; null without thresholds")
    result: dict[str, Any] | None = Field(default=None, description=(
        "The BenchmarkResult document: steps, every step run (normalised fio result, metrics, device "
        "figures), summaries over repeats, verdict, iozone tables and the full context. Only on "
        "GET of one run."))


class BenchmarkRunDocument(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkRun"] = "BenchmarkRun"
    metadata: ObjectMeta
    spec: RunSpecView
    status: RunStatusView

    @classmethod
    def from_row(cls, row: BenchmarkRun, *, with_result: bool = False) -> BenchmarkRunDocument:
        return cls(
            metadata=ObjectMeta(name=row.id, creationTimestamp=row.created_at),
            spec=RunSpecView(host=row.host, benchmark=row.spec, schedule=row.schedule,
                             requestedBy=row.requested_by),
            status=RunStatusView(
                state=row.state,
                message=row.message, progress=row.progress, startedAt=row.started_at,
                finishedAt=row.finished_at, cancelRequested=row.cancel_requested_at is not None,
                attempts=row.attempts, nextAttemptAt=row.not_before if row.state == "queued" else None,
                context=RunContextView(kernel=row.kernel, fioVersion=row.fio_version,
                                       topologyHash=row.topology_hash, profiles=row.profiles),
                passed=row.passed, result=row.result if with_result else None,
            ),
        )


class BenchmarkRunList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkRunList"] = "BenchmarkRunList"
    items: list[BenchmarkRunDocument]


class HostSteps(BaseModel):
    host: str
    target: str | None = Field(description="The device (or file) found in the host's last topology")
    steps: list[WorkloadStep]
    problems: list[str] = Field(default_factory=list)
    refusals: list[str] = Field(default_factory=list, description=(
        "Why the agent would refuse the run, as far as the host's last topology tells: a protected"
        " device (holding /, /boot or /var), an unsafe write. The agent checks again, with its own"
        " flags and wipefs, when the run starts"))


class RunDryRun(BaseModel):
    """What a run request would do: the hosts and each one's expanded steps. Nothing is queued."""

    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkRunDryRun"] = "BenchmarkRunDryRun"
    benchmark: dict[str, Any]
    hosts: list[HostSteps]


class RawFileView(BaseModel):
    path: str = Field(description="Relative to the run: steps/NNN-<step>-rR/{job.fio,fio.json,stderr.txt}")
    text: str


class RawFileList(BaseModel):
    run: str
    items: list[RawFileView]

    @classmethod
    def from_rows(cls, run_id: str, rows: list[BenchmarkRawFile]) -> RawFileList:
        return cls(run=run_id, items=[RawFileView(path=r.path, text=r.text) for r in rows])


# -- comparisons --------------------------------------------------------------------------------
class RunRef(BaseModel):
    id: str
    name: str
    host: str
    state: str
    finishedAt: datetime | None = None

    @classmethod
    def from_row(cls, row: BenchmarkRun) -> RunRef:
        return cls(id=row.id, name=row.name, host=row.host, state=row.state, finishedAt=row.finished_at)


class SideView(BaseModel):
    n: int
    mean: float
    stdev: float
    cv: float | None
    noisy: bool


class ComparisonRow(BaseModel):
    step: str
    metric: str
    unit: str
    a: SideView
    b: SideView
    objective: bool = Field(default=False, description=(
        "One of what the step is for (named by the spec's thresholds, or the step's throughput and "
        "p99 latency): objective rows lead, and only they make `stortune bench compare` exit 2"))
    delta: float = Field(description="mean(B) - mean(A), in the metric's unit")
    deltaPct: float | None = Field(description=(
        "The change the noise rule judges, in %: of the geometric means of the repeats (of the "
        "arithmetic means when a value is not positive)"))
    noiseLowPct: float | None = Field(default=None, description="The noise interval's lower end, in %")
    noiseHighPct: float | None = Field(default=None, description="The noise interval's upper end, in %")
    noisePct: float | None = Field(description=(
        "The noise interval's bound on the side of the change: significant when |deltaPct| exceeds it"))
    significant: bool
    verdict: Literal["better", "worse", "within noise"]

    @classmethod
    def of(cls, d: MetricDelta, *, objective: bool = False) -> ComparisonRow:
        def side(s: Any) -> SideView:
            return SideView(n=s.n, mean=s.mean, stdev=s.stdev, cv=s.cv, noisy=s.noisy)

        return cls(step=d.step, metric=d.metric, unit=metrics.get(d.metric).unit, a=side(d.a), b=side(d.b),
                   objective=objective, delta=d.delta, deltaPct=d.delta_pct, noiseLowPct=d.noise_low_pct,
                   noiseHighPct=d.noise_high_pct, noisePct=d.noise_pct, significant=d.significant,
                   verdict=d.verdict)


class ComparisonSummary(BaseModel):
    better: int
    worse: int
    withinNoise: int
    objectiveWorse: int = Field(default=0, description=(
        "Objective rows worse beyond the noise: the regressions `stortune bench compare` exits 2 for"))

    @classmethod
    def of(cls, comparison: Comparison) -> ComparisonSummary:
        return cls(better=comparison.count("better"), worse=comparison.count("worse"),
                   withinNoise=comparison.count("within noise"),
                   objectiveWorse=len(comparison.regressions))


class BenchmarkComparison(BaseModel):
    """B against A, per step both measured and per metric, by the noise rule (docs/benchmarks.md)."""

    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkComparison"] = "BenchmarkComparison"
    a: RunRef
    b: RunRef
    rows: list[ComparisonRow]
    summary: ComparisonSummary
    contextChanges: list[str] = Field(description="Settings, versions and topology that differ: A -> B")


class BenchmarkJudgement(BaseModel):
    """A run against the baseline of its host class, or why there is none."""

    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkJudgement"] = "BenchmarkJudgement"
    run: RunRef
    baseline: str | None = None
    baselineRun: RunRef | None = None
    message: str
    rows: list[ComparisonRow] = Field(default_factory=list)
    summary: ComparisonSummary | None = None
    contextChanges: list[str] = Field(default_factory=list)


# -- baselines ------------------------------------------------------------------------------------
class BaselineSet(RequestModel):
    run: str = Field(max_length=64, description="A finished run (state done): the reference")
    hostSelector: LabelSelector | str | None = Field(default=None, description=(
        "The class of hosts, as a selector document or in the query syntax (model=r750,raid=perc); "
        "default: the run's spec.hostSelector"))
    description: str = Field(default="", max_length=4096)

    @field_validator("hostSelector", mode="before")
    @classmethod
    def _selector(cls, value: Any) -> Any:
        if isinstance(value, str) and len(value) > MAX_SELECTOR_TEXT:
            raise ValueError(f"at most {MAX_SELECTOR_TEXT} characters, as every selector in the query syntax")
        return parse_text(value) if isinstance(value, str) else value


class BaselineSpecView(BaseModel):
    run: str
    hostSelector: dict[str, Any]
    benchmark: str = Field(description="Runs with this spec name are judged against the baseline")
    description: str = ""


class BenchmarkBaselineDocument(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkBaseline"] = "BenchmarkBaseline"
    metadata: ObjectMeta
    spec: BaselineSpecView
    setBy: str
    updatedAt: datetime

    @classmethod
    def from_row(cls, row: BenchmarkBaseline) -> BenchmarkBaselineDocument:
        return cls(metadata=ObjectMeta(name=row.name, creationTimestamp=row.created_at),
                   spec=BaselineSpecView(run=row.run_id, hostSelector=row.host_selector,
                                         benchmark=row.benchmark, description=row.description),
                   setBy=row.created_by, updatedAt=row.updated_at)


class BenchmarkBaselineList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkBaselineList"] = "BenchmarkBaselineList"
    items: list[BenchmarkBaselineDocument]


# -- schedules ------------------------------------------------------------------------------------
class ScheduleSpecView(BaseModel):
    schedule: str = Field(description="Cron expression, five fields, UTC")
    suspend: bool = False
    benchmark: dict[str, Any] = Field(description="The BenchmarkSpec document (spec.hostSelector chooses "
                                                   "the hosts)")


class ScheduleStatusView(BaseModel):
    nextRunAt: datetime | None = Field(default=None, description="null while suspended")
    lastFiredAt: datetime | None = None
    lastMessage: str = ""


class BenchmarkScheduleDocument(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkSchedule"] = "BenchmarkSchedule"
    metadata: ObjectMeta
    spec: ScheduleSpecView
    status: ScheduleStatusView

    @classmethod
    def from_row(cls, row: BenchmarkSchedule) -> BenchmarkScheduleDocument:
        return cls(
            metadata=ObjectMeta(name=row.name, creationTimestamp=row.created_at),
            spec=ScheduleSpecView(schedule=row.cron, suspend=row.suspended, benchmark=row.spec),
            status=ScheduleStatusView(nextRunAt=row.next_due_at, lastFiredAt=row.last_fired_at,
                                      lastMessage=row.last_message),
        )


class BenchmarkScheduleList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["BenchmarkScheduleList"] = "BenchmarkScheduleList"
    items: list[BenchmarkScheduleDocument]
