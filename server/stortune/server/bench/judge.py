"""Judging runs: one run against another, and a run against the baseline of its host class. Pure.

The numbers come from ``stortune.schemas.bench.stats.compare`` (the noise rule
of docs/benchmarks.md): per step both runs measured and per metric, the change
in % and whether it exceeds the noise; the metrics each step is for
(``schemas.bench.objectives``) lead and alone count as a regression. Next to
them, what differed between the two runs (the spec, a tunable, the kernel,
fio, the device graph), because a change is only evidence when its cause is
known.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stortune.schemas.bench import metrics
from stortune.schemas.bench.objectives import objectives, threshold_globs
from stortune.schemas.bench.results import BenchmarkResult, RunContext
from stortune.schemas.bench.stats import MetricDelta, compare


@dataclass(frozen=True)
class Comparison:
    deltas: list[MetricDelta]
    #: What differed in the context, as "what: A -> B" lines.
    context: list[str] = field(default_factory=list)
    #: (step, metric) the benchmark is for (schemas.bench.objectives): what leads and what gates.
    objective: frozenset[tuple[str, str]] = frozenset()

    def count(self, verdict: str) -> int:
        return sum(d.verdict == verdict for d in self.deltas)

    def is_objective(self, delta: MetricDelta) -> bool:
        return (delta.step, delta.metric) in self.objective

    @property
    def regressions(self) -> list[MetricDelta]:
        """Objective metrics worse beyond the noise: what makes `bench compare` exit 2."""
        return [d for d in self.deltas if d.verdict == "worse" and self.is_objective(d)]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)


def _show(value: object) -> str:
    return "(unset)" if value is None else str(value)


def context_changes(a: RunContext | None, b: RunContext | None) -> list[str]:
    """Settings, versions and topology that differ between two runs' contexts.

    Devices are named by kernel name: comparing two hosts of one class (the
    vendor's reference and a new server) is the point, and those names match
    where it matters while device ids do not.
    """
    if a is None or b is None:
        return [] if a is b else ["context: recorded for only one of the runs"]
    out = []
    for what, before, after in (("hostname", a.hostname, b.hostname), ("kernel", a.kernel, b.kernel),
                                ("fio", a.fio_version, b.fio_version),
                                ("agent", a.agent_version, b.agent_version),
                                ("topology", a.topology_hash, b.topology_hash),
                                ("target", a.target.device or a.target.path,
                                 b.target.device or b.target.path)):
        if before != after:
            out.append(f"{what}: {_show(before)} -> {_show(after)}")
    for device in sorted(set(a.settings) | set(b.settings)):
        sa, sb = a.settings.get(device, {}), b.settings.get(device, {})
        for tunable in sorted(set(sa) | set(sb)):
            if sa.get(tunable) != sb.get(tunable):
                out.append(f"{device} {tunable}: {_show(sa.get(tunable))} -> {_show(sb.get(tunable))}")
    for profile in sorted(set(a.profiles) | set(b.profiles)):
        ga, gb = a.profiles.get(profile), b.profiles.get(profile)
        if ga != gb:
            out.append(f"profile {profile}: generation {_show(ga)} -> {_show(gb)}")
    return out


def _brief(value: object, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":")) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit - 3] + "..."


def spec_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two runs' BenchmarkSpec documents, one line per field of spec."""
    out = []
    name_a, name_b = (_dict(_dict(d).get("metadata")).get("name") for d in (a, b))
    if name_a != name_b:
        out.append(f"benchmark: {_show(name_a)} -> {_show(name_b)}")
    body_a, body_b = _dict(a.get("spec")), _dict(b.get("spec"))
    for key in sorted(set(body_a) | set(body_b)):
        if body_a.get(key) != body_b.get(key):
            before, after = body_a.get(key, "(unset)"), body_b.get(key, "(unset)")
            out.append(f"spec.{key}: {_brief(before)} -> {_brief(after)}")
    return out


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def objective_metrics(a: BenchmarkResult, b: BenchmarkResult) -> frozenset[tuple[str, str]]:
    """(step, metric) pairs either run's spec makes an objective (its thresholds, its steps' figures)."""
    globs = [*threshold_globs(a.spec), *threshold_globs(b.spec)]
    found: set[tuple[str, str]] = set()
    for result in (a, b):
        for step, names in objectives(result.steps, globs).items():
            found.update((step, name) for name in names)
    return frozenset(found)


def judge(a: BenchmarkResult, b: BenchmarkResult, *, metric_names: Sequence[str] | None = None) -> Comparison:
    """B judged against A (the baseline, or the "before" run)."""
    deltas = compare(a.summaries_by_step(), b.summaries_by_step())
    if metric_names is not None:
        wanted = set(metric_names)
        deltas = [d for d in deltas if d.metric in wanted]
    return Comparison(deltas, [*spec_changes(a.spec, b.spec), *context_changes(a.context, b.context)],
                      objective_metrics(a, b))


def noise_text(delta: MetricDelta) -> str:
    """'-5.0%..+5.2%': the interval a change must leave to count; '-' when no % exists."""
    if delta.noise_low_pct is None or delta.noise_high_pct is None:
        return "-"
    return f"{delta.noise_low_pct:+.1f}%..{delta.noise_high_pct:+.1f}%"


def headline(delta: MetricDelta) -> str:
    """'+12.3% (noise -5.0%..+5.2%): better' for one row."""
    pct = "n/a" if delta.delta_pct is None else f"{delta.delta_pct:+.1f}%"
    noise = "" if delta.noise_pct is None else f" (noise {noise_text(delta)})"
    return f"{pct}{noise}: {delta.verdict}"


def unit(metric: str) -> str:
    return metrics.get(metric).unit
