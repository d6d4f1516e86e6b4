"""How long an experiment holds a host, for the control plane's driver and ``stortune-agent tune``
alike: the dry run's estimate, the time the search is judged by, and the deadline's name.

``spec.budget.duration`` runs from the moment the host is taken; at it the trial in flight is
stopped and the host put back (the runner's job: this module only computes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from stortune.schemas.tuning.experiment import TuningSpec

#: How an experiment cut by its deadline ended (the trial in flight stopped, nothing confirmed).
DEADLINE = "budget-deadline"


@dataclass(frozen=True)
class HoldTime:
    """The dry run's figures, in seconds (the names are the API's)."""

    trialSeconds: float
    estimatedSeconds: float
    durationSeconds: float


def hold_line(trial_s: float | None, estimated_s: float | None, duration_s: float | None) -> str:
    """The sentence both dry runs print (`stortune tune run` reads the figures from JSON: None
    when one is missing)."""
    return (f"time: about {span(estimated_s)} ({span(trial_s)} a trial); the host is given back within"
            f" {span(duration_s)} (spec.budget.duration) at the latest")


def hold_time(spec: TuningSpec, estimated_trials: int) -> HoldTime:
    """One trial's benchmark time, the estimated trials' (at most the budget), and the budget."""
    trial_s, duration = spec.trial_seconds(), spec.budget.duration
    return HoldTime(trialSeconds=trial_s, estimatedSeconds=min(estimated_trials * trial_s, duration),
                    durationSeconds=duration)


def search_elapsed(spec: TuningSpec, elapsed_s: float, trials_done: int) -> float:
    """The elapsed time the engine judges budget.duration by: the time spent plus what the closing
    runs (confirmation and end baseline) will take at the pace so far (at least the workloads'
    runtime), so that the search stops in time for them to end before the deadline."""
    pace = max(spec.trial_seconds(), elapsed_s / trials_done if trials_done else 0.0)
    return elapsed_s + (spec.confirm_runs + spec.baseline_runs) * pace


def span(seconds: float | None) -> str:
    """Seconds as a person reads them: 45s, 12m, 6h05m; '?' when not a number."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    if whole < 120:
        return f"{seconds:.3g}s"
    hours, minutes = divmod(whole // 60, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"
