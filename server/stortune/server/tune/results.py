"""Small pure pieces of the driver: the baseline a host starts from, whether a run measured the
trial's values, and the words a host's end is recorded with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas import catalog
from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.catalog import Value
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device
from stortune.schemas.tuning.evidence import Outcome
from stortune.schemas.tuning.experiment import TuningExperiment, baseline_point
from stortune.schemas.tuning.recommend import recommended_profile
from stortune.schemas.tuning.timing import DEADLINE
from stortune.server.services import experiment_results

#: Marks the profiles an experiment stored (applyResult), as `stortune apply` marks its own.
MANAGED_BY = "stortune.dev/managed-by"


def _value(device: Device, tunable: str) -> Value | None:
    state = device.tunables.get(tunable)
    return None if state is None else state.value


def baseline_of(exp: TuningExperiment, device: Device, beneath: Sequence[Device]
                ) -> tuple[dict[str, Value], dict[str, dict[str, Value | None]], list[list[str]]]:
    """(the baseline point, {device: {tunable: value}} of every setting the trials change, and
    the (device id, tunable) keys the experiment owns while it runs); ValueError when a value
    in effect is unknown (baseline_point says which)."""
    point = baseline_point(exp, device, beneath)
    settings: dict[str, dict[str, Value | None]] = {}
    owned: list[list[str]] = []
    for parameter in exp.spec.parameters:
        tunable = catalog.get(parameter.tunable)
        devices = ([device] if parameter.at == "target" else
                   [d for d in beneath if d.kind in tunable.applies_to])
        for dev in devices:
            settings.setdefault(dev.name, {})[parameter.tunable] = _value(dev, parameter.tunable)
            owned.append([dev.id, parameter.tunable])
    return point, settings, owned


def values_not_in_effect(result: BenchmarkResult, point: Mapping[str, Value], device: Device,
                         beneath: Sequence[Device]) -> str:
    """'' when the run's context shows every value of ``point`` in effect, else what differed.

    Something outside the experiment (a hand, another tool) may have changed a setting between
    the apply and the run: such a measurement does not measure the point."""
    context = result.context
    if context is None:
        return ""
    wrong = []
    for key, want in point.items():
        tunable, _, where = key.partition("@")
        # The target under its name at the run (the overlay followed its id, not its old name).
        names = [context.target.device or device.name] if not where else [d.name for d in beneath]
        for name in names:
            seen = context.settings.get(name, {}).get(tunable)
            if seen is not None and str(seen) != str(want):
                wrong.append(f"{name} {tunable} {seen}, wanted {want}")
    return "; ".join(wrong)


def deadline_of(exp: TuningExperiment, started: datetime) -> datetime:
    """When the host must be given back: budget.duration after it was taken."""
    return started + timedelta(seconds=exp.spec.budget.duration)


def report_text(report: Mapping[str, Any]) -> str:
    messages = [str(m) for m in report.get("messages", [])]
    title = str(report.get("title", "apply failed"))
    return f"{title}: {'; '.join(messages[:3])}" if messages else title


_ENDINGS = {
    "done": "done: the search is complete",
    "budget-trials": "done: the trial budget is spent",
    "budget-duration": "done: the time budget is spent",
    DEADLINE: "done: the time budget ran out (spec.budget.duration): the trial running was stopped and"
              " the host put back",
    "cancelled": "cancelled",
}


def ending_message(state: str, why: str) -> str:
    if state == "failed":
        return f"failed: {why}"
    return _ENDINGS.get(why, f"{state}: {why}" if why else state)


def keep_recommendation(sessions: sessionmaker[Session], exp: TuningExperiment, outcome: Mapping[str, Any],
                        *, experiment_id: str, device: Device, beneath: Sequence[Device], now: datetime
                        ) -> experiment_results.Stored | None:
    """Store the recommended profile as the experiment's creator (experiment_results.store: never
    over a profile the document does not name knowingly); None when there is nothing to keep."""
    if outcome.get("holdsEverywhere") is False:
        return None
    core = Outcome.model_validate({k: v for k, v in outcome.items() if k in Outcome.model_fields})
    if core.recommendation.keepCurrent:
        return None
    profile = recommended_profile(exp, core, device, beneath=beneath)
    profile = profile.model_copy(update={"metadata": profile.metadata.model_copy(update={
        "annotations": {**profile.metadata.annotations, MANAGED_BY: "stortune-experiment"}})})
    with sessions() as session:
        return experiment_results.store(session, exp, experiment_id, profile, now)


def profile_of(exp: TuningExperiment, outcome: Mapping[str, Any] | None, host_rows: Sequence[Any]
               ) -> StorageProfile:
    """The recommended StorageProfile of an experiment's (pooled) outcome, its rule matching the
    class of the device tuned on the first host; ValueError when there is none yet."""
    if not outcome:
        raise ValueError("no trial has been recorded yet: there is no recommendation")
    taken = next((h for h in host_rows if h.originals and h.originals.get("device")), None)
    if taken is None:
        raise ValueError("no host was taken yet: the device is not known")
    core = Outcome.model_validate({k: v for k, v in outcome.items() if k in Outcome.model_fields})
    device = Device.model_validate(taken.originals["device"])
    beneath = [Device.model_validate(d) for d in taken.originals.get("beneath") or []]
    return recommended_profile(exp, core, device, beneath=beneath)


def _tidy(value: Any) -> Any:
    """Empty lists and mappings left out: what a person would write in a GitOps repository."""
    if isinstance(value, dict):
        kept = {k: _tidy(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


def profile_document(profile: StorageProfile) -> dict[str, Any]:
    """The profile as a file to commit: canonical, without empty fields (it parses back the same)."""
    document: dict[str, Any] = _tidy(profile.document())
    return document
