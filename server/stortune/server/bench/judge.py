"""Judging runs: one run against another, and a run against the baseline of its host class. Pure.

The numbers come from ``stortune.schemas.bench.stats.compare`` (the noise rule
of docs/benchmarks.md): per step both runs measured and per metric, the change
in % and whether it exceeds the noise. Next to them, what differed between the
two runs' contexts (a tunable, the kernel, fio, the device graph), because a
change is only evidence when its cause is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stortune.schemas.bench import metrics
from stortune.schemas.bench.results import BenchmarkResult, RunContext
from stortune.schemas.bench.stats import MetricDelta, compare


@dataclass(frozen=True)
class Comparison:
    deltas: list[MetricDelta]
    #: What differed in the context, as "what: A -> B" lines.
    context: list[str] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(d.verdict == verdict for d in self.deltas)

    @property
    def regressed(self) -> bool:
        return any(d.verdict == "worse" for d in self.deltas)


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


def judge(a: BenchmarkResult, b: BenchmarkResult, *, metric_names: Sequence[str] | None = None) -> Comparison:
    """B judged against A (the baseline, or the "before" run)."""
    deltas = compare(a.summaries_by_step(), b.summaries_by_step())
    if metric_names is not None:
        wanted = set(metric_names)
        deltas = [d for d in deltas if d.metric in wanted]
    return Comparison(deltas, context_changes(a.context, b.context))


def headline(delta: MetricDelta) -> str:
    """'+12.3% (noise ±5.0%): better' for one row."""
    pct = "n/a" if delta.delta_pct is None else f"{delta.delta_pct:+.1f}%"
    noise = "" if delta.noise_pct is None else f" (noise ±{delta.noise_pct:.1f}%)"
    return f"{pct}{noise}: {delta.verdict}"


def unit(metric: str) -> str:
    return metrics.get(metric).unit
