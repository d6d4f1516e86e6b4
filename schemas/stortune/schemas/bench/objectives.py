"""What each step of a benchmark is for: the metrics a comparison leads with and gates on.

A step has twenty metrics, and at 95% each some of them move by chance in
every comparison; the ones that say whether the workload got better are few.
They are, per step:

* the metrics the spec's thresholds name for it (``thresholds[].metric`` where
  ``thresholds[].step`` matches the step's name): the spec says what matters;
* and the step's own figure: bandwidth for a sequential pattern, IOPS and p99
  completion latency for a random one, in each direction the pattern moves
  data (both for a mix).

Pure; thresholds are read from the spec document as a result stores it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stortune.schemas.bench import metrics
from stortune.schemas.bench.steps import SEQUENTIAL_PATTERNS, WorkloadStep
from stortune.schemas.patterns import PatternError, glob_matches

_READS = frozenset({"read", "randread", "rw", "randrw"})
_WRITES = frozenset({"write", "randwrite", "rw", "randrw"})


def own_metrics(step: WorkloadStep) -> list[str]:
    """The figures that describe ``step`` whatever the spec says."""
    directions = [d for d, patterns in (("read", _READS), ("write", _WRITES)) if step.pattern in patterns]
    if step.pattern in SEQUENTIAL_PATTERNS:
        return [f"{d}_bandwidth" for d in directions]
    return [m for d in directions for m in (f"{d}_iops", f"{d}_lat_p99")]


def threshold_globs(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(metric, step glob) of each threshold of a BenchmarkSpec document; unknown metrics are skipped."""
    body = spec.get("spec")
    found = body.get("thresholds") if isinstance(body, Mapping) else None
    out: list[tuple[str, str]] = []
    for item in found if isinstance(found, list) else []:
        metric = item.get("metric") if isinstance(item, Mapping) else None
        if isinstance(metric, str) and metric in metrics.METRICS:
            glob = item.get("step", "*")
            out.append((metric, glob if isinstance(glob, str) else "*"))
    return out


def _names(glob: str, step: str) -> bool:
    """Whether a threshold's step glob names ``step``, matched as the spec's own check matches it
    (RE2, bounded); a glob no spec could hold (the result's spec comes from the agent) names none."""
    try:
        return glob_matches(glob, step)
    except PatternError:
        return False


def objectives(steps: Iterable[WorkloadStep], thresholds: Sequence[tuple[str, str]] = ()
               ) -> dict[str, list[str]]:
    """Step name -> its objective metrics, in the catalog's order (bandwidth, IOPS, latency, CPU)."""
    out: dict[str, list[str]] = {}
    for step in steps:
        wanted = set(own_metrics(step))
        wanted.update(m for m, glob in thresholds if _names(glob, step.name))
        out[step.name] = [m for m in metrics.METRICS if m in wanted]
    return out
