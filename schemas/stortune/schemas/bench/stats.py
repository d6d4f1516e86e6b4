"""Repeats into numbers a storage engineer trusts, and comparisons that respect the noise.

``summarize``: mean, sample standard deviation, coefficient of variation and a
noisy flag (CV above ``NOISY_CV``).

``compare`` and the noise rule. The change from A to B in one metric of one
step is the ratio of the geometric means of their repeats, gm_B / gm_A, shown
in % (``delta_pct``). It *exceeds the noise* when both hold:

1. it is larger than the floor, 5% either way (NOISE_FLOOR), which covers what
   repeats of one sitting do not show (thermal state, background work, a
   lucky cache), and is the whole rule when each side ran once;
2. it is larger than both sides' spread: Welch's t-test at 95% confidence on the
   logarithms of the repeats, |ln(gm_B / gm_A)| > band = t(0.975, df) x
   sqrt(s_A^2/n_A + s_B^2/n_B). Logarithms because storage noise is proportional
   (a cache hit doubles a run, it does not add 5 MB/s), so the test is on the
   ratio; t rather than 2 because there are few repeats.

In % of gm_A the two make one interval, the noise: from
``noise_low_pct`` = min(-5%, e^-band - 1) to ``noise_high_pct`` = max(+5%, e^band - 1).
A change is significant exactly when ``delta_pct`` lies outside it, so what is
shown is what is judged; the band is even in ratios, not in %: a band of x4.6
is -78.5% .. +364.3%. ``noise_pct`` is the bound on the side the change went.

Metrics with a zero or negative value are judged the same way on the values
themselves: the change is of the arithmetic means, the interval ±max(5%,
band / |mean_A|); when mean_A is 0 no % exists and any change beyond the
band counts. Better or worse follows the metric (bandwidth up is better,
latency up is worse).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.bench import metrics
from stortune.schemas.bench.presets import IOZONE_PHASES
from stortune.schemas.bench.steps import WorkloadStep

NOISY_CV = 0.05
NOISE_FLOOR = 0.05
#: Two-sided 95% critical values of Student's t for 1..30 degrees of freedom.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042)


def t95(df: float) -> float:
    """Student's t for a two-sided 95% test; fractional df round down (the stricter value)."""
    whole = max(1, math.floor(df + 1e-9))  # 21.999999999 from rounding is 22: the same data, any unit
    if whole <= len(_T95):
        return _T95[whole - 1]
    return 2.021 if whole < 60 else 2.000 if whole < 120 else 1.960


#: {step name: {metric name: Summary}}
Summaries = Mapping[str, Mapping[str, "Summary"]]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Summary(_Model):
    n: int
    mean: float
    stdev: float = Field(description="Sample standard deviation (n - 1); 0 for one value")
    cv: float | None = Field(description="stdev / mean; None when the mean is 0")
    min: float
    max: float
    noisy: bool = Field(description=f"CV above {NOISY_CV:.0%} over at least two repeats")
    values: list[float]


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("no values to summarize")
    n = len(values)
    mean = math.fsum(values) / n
    stdev = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    cv = stdev / abs(mean) if mean else None
    return Summary(n=n, mean=mean, stdev=stdev, cv=cv, min=min(values), max=max(values),
                   noisy=n > 1 and ((cv is None and stdev > 0) or (cv is not None and cv > NOISY_CV)),
                   values=list(values))


def _spread(a: Sequence[float], b: Sequence[float]) -> float:
    """Half-width of Welch's 95% interval for mean(b) - mean(a); 0 when neither side has spread."""

    def var(xs: Sequence[float]) -> float:
        if len(xs) < 2:
            return 0.0
        m = math.fsum(xs) / len(xs)
        return math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)

    va, vb = var(a), var(b)
    if va + vb == 0:
        return 0.0
    parts = [v * v / (len(xs) - 1) for v, xs in ((va, a), (vb, b)) if len(xs) > 1]
    df = (va + vb) ** 2 / math.fsum(parts)
    return t95(df) * math.sqrt(va + vb)


Verdict = Literal["better", "worse", "within noise"]


class MetricDelta(_Model):
    step: str
    metric: str
    a: Summary
    b: Summary
    delta: float = Field(description="mean_B - mean_A, in the metric's unit")
    delta_pct: float | None = Field(description=(
        "The change the noise rule judges, in %: of the geometric means (of the arithmetic means "
        "when a value is not positive); None when A's mean is 0"))
    noise_low_pct: float | None = Field(default=None, description=(
        "The noise interval's lower end in % (negative): a change below it is significant"))
    noise_high_pct: float | None = Field(default=None, description=(
        "The noise interval's upper end in %: a change above it is significant"))
    noise_pct: float | None = Field(description=(
        "The interval's bound on the side of the change, as a magnitude: significant when "
        "|delta_pct| exceeds it"))
    significant: bool
    verdict: Verdict

    def noise_text(self) -> str:
        return noise_interval(self.noise_low_pct, self.noise_high_pct)


def noise_interval(low: float | None, high: float | None) -> str:
    """The interval a change must leave to count, as shown everywhere: '-5.0%..+5.2%'."""
    if low is None or high is None:
        return "-"
    return f"{low:+.1f}%..{high:+.1f}%"


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def delta(step: str, metric: str, a: Summary, b: Summary, *, floor: float = NOISE_FLOOR) -> MetricDelta:
    """A's and B's repeats of one metric, judged by the noise rule."""
    diff = b.mean - a.mean
    change: float | None
    low: float | None
    high: float | None
    if all(v > 0 for v in (*a.values, *b.values)):
        la, lb = [math.log(v) for v in a.values], [math.log(v) for v in b.values]
        band = _spread(la, lb)
        change = 100 * math.expm1(_mean(lb) - _mean(la))
        low, high = 100 * math.expm1(-band), 100 * math.expm1(band)
    elif a.mean:
        band = _spread(a.values, b.values)
        change = 100 * diff / abs(a.mean)
        high = 100 * band / abs(a.mean)
        low = -high
    else:  # nothing to take a % of: any change beyond the spread of the values counts
        band = _spread(a.values, b.values)
        change = low = high = None
    if change is not None and low is not None and high is not None:
        low, high = min(low, -100 * floor), max(high, 100 * floor)
        significant = change < low or change > high
        noise: float | None = high if change >= 0 else -low
        went_up = change > 0
    else:
        significant = diff != 0 and abs(diff) > band
        noise = None
        went_up = diff > 0
    higher_better = metrics.get(metric).higher_is_better
    verdict: Verdict = "within noise"
    if significant:
        verdict = "better" if went_up == higher_better else "worse"
    return MetricDelta(
        step=step, metric=metric, a=a, b=b, delta=diff, delta_pct=change, noise_low_pct=low,
        noise_high_pct=high, noise_pct=noise, significant=significant, verdict=verdict,
    )


def compare(a: Summaries, b: Summaries, *, floor: float = NOISE_FLOOR) -> list[MetricDelta]:
    """Per step present in both, per metric present in both: the delta and its verdict."""
    out: list[MetricDelta] = []
    for step, a_metrics in a.items():
        b_metrics = b.get(step)
        if b_metrics is None:
            continue
        for metric in metrics.METRICS:  # catalog order: bandwidth, IOPS, latency, CPU
            if metric in a_metrics and metric in b_metrics:
                out.append(delta(step, metric, a_metrics[metric], b_metrics[metric], floor=floor))
    return out


# -- iozone-style tables -------------------------------------------------------------------
class IozoneRow(_Model):
    threads: int
    #: phase -> mean bandwidth in bytes/s (write, rewrite, read, reread)
    bandwidth: dict[str, float]
    noisy: list[str] = Field(default_factory=list, description="Phases whose repeats were noisy")


class IozoneTable(_Model):
    workload: str
    phases: list[str] = Field(default_factory=lambda: list(IOZONE_PHASES))
    rows: list[IozoneRow]


def iozone_tables(steps: Sequence[WorkloadStep], summaries: Summaries) -> list[IozoneTable]:
    """Throughput by thread count (rows) and phase (columns), one table per iozone workload."""
    tables: dict[str, dict[int, IozoneRow]] = {}
    for step in steps:
        if step.preset != "iozone-seq" or step.phase is None:
            continue
        metric = "read_bandwidth" if step.pattern == "read" else "write_bandwidth"
        summary = summaries.get(step.name, {}).get(metric)
        rows = tables.setdefault(step.workload, {})
        row = rows.setdefault(step.threads, IozoneRow(threads=step.threads, bandwidth={}))
        if summary is not None:
            row.bandwidth[step.phase] = summary.mean
            if summary.noisy:
                row.noisy.append(step.phase)
    return [IozoneTable(workload=w, rows=[rows[t] for t in sorted(rows)]) for w, rows in tables.items()]
