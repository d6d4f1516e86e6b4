"""Tuning experiments as the API shows them: the submitted document with its status.

The status carries per host the live progress (trial k of n, the values under test, the
metric so far, the leader and its margin) and, as trials are recorded, the evidence: per
trial every repeat's metrics, mean and confidence interval, the baseline check, the
recommendation with its gain and interval, the effect of each parameter; for a fleet per
host and pooled. The Outcome documents are ``stortune.schemas.tuning.evidence``'s, as stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from stortune.server.db.tables import Experiment, ExperimentHost, ExperimentTrial
from stortune.server.models.common import API_VERSION
from stortune.server.models.meta import ObjectMeta

ExperimentState = Literal["queued", "running", "done", "cancelled", "failed"]


class TrialView(BaseModel):
    host: str
    index: int = Field(description="0-based; trial index + 1 is 'trial k'")
    point: dict[str, int | str] = Field(description="The values under test, by parameter key")
    purpose: str = Field(description="baseline | explore | repeat | baseline-end")
    state: Literal["queued", "running", "done", "failed"]
    runId: str = Field(description="The benchmark run (GET /benchmarks/runs/{runId})")
    measurement: dict[str, Any] | None = Field(
        default=None, description="Objective and constrained metrics, job CV, ok, message")
    message: str
    startedAt: datetime | None = None
    finishedAt: datetime | None = None

    @classmethod
    def from_row(cls, row: ExperimentTrial) -> TrialView:
        return cls(host=row.host, index=row.index, point=row.point, purpose=row.purpose,
                   state=row.state,
                   runId=row.run_id, measurement=row.measurement, message=row.message,
                   startedAt=row.started_at, finishedAt=row.finished_at)


class HostStatus(BaseModel):
    host: str
    state: Literal["queued", "running", "restoring", "done", "failed", "cancelled"]
    message: str
    device: str | None = Field(default=None, description="The target device chosen on this host")
    baseline: dict[str, int | str] | None = Field(default=None, description="The values in effect before")
    currentTrial: int | None = Field(default=None, description="0-based index of the trial running")
    progress: dict[str, Any] = Field(default_factory=dict, description=(
        "trial, total (estimate), testing (values under test), metric, last (the latest measurement), "
        "leader, leaderMean, marginPct, bestSoFar"))
    startedAt: datetime | None = None
    finishedAt: datetime | None = None

    @classmethod
    def from_row(cls, row: ExperimentHost) -> HostStatus:
        return cls(host=row.host, state=row.state,
                   message=row.message, device=row.device, baseline=row.baseline,
                   currentTrial=row.current_trial, progress=row.progress, startedAt=row.started_at,
                   finishedAt=row.finished_at)


class ExperimentStatus(BaseModel):
    state: ExperimentState
    reason: str = Field(description="Why it ended (done, budget, cancelled, the failure), or what it "
                                    "waits on")
    createdBy: str
    startedAt: datetime | None = None
    finishedAt: datetime | None = None
    cancelRequested: bool = False
    hosts: list[HostStatus] = Field(default_factory=list)
    outcome: dict[str, Any] | None = Field(default=None, description=(
        "The evidence so far: trials (point, n, mean, ci95, every repeat's metrics, feasibility), "
        "baseline (start, end, moved, reliable), recommendation (values, keepCurrent, gain with its 95% "
        "interval, significant, reason), effects per parameter; perHost and holdsEverywhere for fleets"))
    trials: list[TrialView] | None = Field(default=None, description="Every trial (GET of one experiment)")


class ExperimentDocument(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["TuningExperiment"] = "TuningExperiment"
    metadata: ObjectMeta = Field(description="name: the experiment's name; uid: its id (the API's key)")
    spec: dict[str, Any]
    status: ExperimentStatus

    @classmethod
    def of(cls, row: Experiment, host_rows: list[ExperimentHost], *, outcome: dict[str, Any] | None = None,
           trials: list[ExperimentTrial] | None = None) -> ExperimentDocument:
        meta = row.document.get("metadata") or {}
        return cls(
            metadata=ObjectMeta(name=row.name, uid=row.id, creationTimestamp=row.created_at,
                                labels=meta.get("labels") or {}, annotations=meta.get("annotations") or {}),
            spec=row.document.get("spec") or {},
            status=ExperimentStatus(
                state=row.state,
                reason=row.reason, createdBy=row.created_by, startedAt=row.started_at,
                finishedAt=row.finished_at, cancelRequested=row.cancel_requested_at is not None,
                hosts=[HostStatus.from_row(h) for h in host_rows],
                outcome=outcome if outcome is not None else row.outcome,
                trials=None if trials is None else [TrialView.from_row(t) for t in trials]))


class ExperimentList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["TuningExperimentList"] = "TuningExperimentList"
    items: list[ExperimentDocument]


class PlannedTrial(BaseModel):
    index: int
    point: dict[str, int | str]
    purpose: str
    reason: str


class ParameterSpace(BaseModel):
    key: str = Field(description="tunable, or tunable@beneath")
    values: list[int | str]


class HostPlan(BaseModel):
    host: str
    device: str = Field(description="The target device found in the host's last topology")
    beneath: list[str] = Field(default_factory=list, description="Devices beneath it (md members ...)")
    baseline: dict[str, int | str] = Field(description="The values in effect now: the baseline point")
    parameters: list[ParameterSpace]
    gridSize: int = Field(description="Points of the full grid")
    estimatedTrials: int = Field(description="Trials the search will probably take (budget included)")
    trialSeconds: float = Field(description="One trial's benchmark: the workloads' runtime and rampTime")
    estimatedSeconds: float = Field(description=(
        "About how long the experiment holds the host: estimatedTrials x trialSeconds, at most"
        " durationSeconds"))
    durationSeconds: float = Field(description=(
        "spec.budget.duration: the host is given back by then at the latest, a trial still running"
        " stopped"))
    trials: list[PlannedTrial] = Field(description=(
        "The order of trials if every point measured the same: the search adapts to what it measures"))


class ExperimentDryRun(BaseModel):
    """What a submission would do: the hosts, each one's device and trial plan. Nothing runs."""

    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["TuningExperimentDryRun"] = "TuningExperimentDryRun"
    experiment: dict[str, Any]
    hosts: list[HostPlan]
