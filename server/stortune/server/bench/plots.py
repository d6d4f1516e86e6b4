"""Charts of benchmark results, PNG or SVG, for people who would rather look than read.

* ``threads_chart``: bandwidth against thread count, one panel per workload and one line per
  phase (iozone's write, rewrite, read, re-read), error bars one standard deviation;
* ``latency_chart``: completion-latency percentiles (p50, p95, p99, p99.9) per step and direction;
* ``compare_chart``: before/after bars per step with error bars, each pair labelled with the
  change, the noise it is judged against and the verdict; under them, what changed between
  the two runs (spec, tunables in effect, kernel ...).

matplotlib is imported inside ``_render`` (with the Agg backend, no display), so the server
starts and idles without it; the first chart pays the import. SVG keeps its text as text
(``svg.fonttype: none``): labels stay searchable and selectable. Rendering holds a lock,
because matplotlib's settings are process-wide.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.bench.stats import MetricDelta, Summary
from stortune.schemas.bench.steps import WorkloadStep

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Format = Literal["png", "svg"]
MetricFamily = Literal["bandwidth", "iops", "lat_p99", "lat_mean"]
FORMATS: Final = ("png", "svg")
MEDIA_TYPES: Final = {"png": "image/png", "svg": "image/svg+xml"}
PERCENTILES: Final = (("p50", "p50"), ("p95", "p95"), ("p99", "p99"), ("p999", "p99.9"))
_READS: Final = frozenset({"read", "randread"})
_WRITES: Final = frozenset({"write", "randwrite"})
_LOCK = threading.Lock()
_SIZE = (8.0, 4.5)


class NoData(ValueError):
    """The result holds nothing this chart shows; the message says what is missing."""


@dataclass(frozen=True)
class _Scale:
    label: str
    factor: float


_SCALES: Final = {
    "bandwidth": _Scale("bandwidth (MB/s)", 1e-6),
    "iops": _Scale("I/O per second", 1.0),
    "lat_p99": _Scale("p99 completion latency (µs)", 1.0),
    "lat_mean": _Scale("mean latency (µs)", 1.0),
}


def step_metric(step: WorkloadStep, family: MetricFamily) -> str:
    """The metric of ``family`` that describes ``step``: reads by their read figure, writes by their
    write figure, mixed steps by the total (latency: the reads')."""
    direction = "read" if step.pattern in _READS else "write" if step.pattern in _WRITES else "total"
    if family == "bandwidth":
        return f"{direction}_bandwidth"
    if family == "iops":
        return f"{direction}_iops"
    return f"{'write' if direction == 'write' else 'read'}_{family}"


def _width(groups: int) -> float:
    """Wide enough for every group of bars to keep its label apart."""
    return max(_SIZE[0], 0.8 * groups + 1.5)


def _render(build: Callable[[Figure], None], fmt: Format, width: float = _SIZE[0],
            height: float = _SIZE[1]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    with _LOCK, matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "stortune",
                                       "font.size": 9}):
        figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
        build(figure)
        out = io.BytesIO()
        metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {}
        figure.savefig(out, format=fmt, metadata=metadata)
        return out.getvalue()


def _title(result: BenchmarkResult, what: str) -> str:
    host = result.context.hostname if result.context is not None and result.context.hostname else ""
    return f"{result.name}{' on ' + host if host else ''}: {what} (run {result.run_id})"


# -- bandwidth by threads --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Point:
    threads: int
    mean: float
    stdev: float


def thread_series(result: BenchmarkResult) -> dict[str, dict[str, list[_Point]]]:
    """workload -> phase -> points by thread count (mean and stdev of the step's bandwidth)."""
    summaries = result.summaries_by_step()
    out: dict[str, dict[str, list[_Point]]] = {}
    for step in result.steps:
        summary = summaries.get(step.name, {}).get(step_metric(step, "bandwidth"))
        if summary is None:
            continue
        phase = step.phase or step.pattern
        out.setdefault(step.workload, {}).setdefault(phase, []).append(
            _Point(step.threads, summary.mean, summary.stdev))
    for phases in out.values():
        for points in phases.values():
            points.sort(key=lambda p: p.threads)
    return out


def threads_chart(result: BenchmarkResult, fmt: Format) -> bytes:
    series = thread_series(result)
    if not series:
        raise NoData(f"run {result.run_id} measured no bandwidth (state {result.state})")
    scale = _SCALES["bandwidth"]

    def build(figure: Figure) -> None:
        axes = figure.subplots(len(series), 1, squeeze=False)[:, 0]
        for ax, (workload, phases) in zip(axes, series.items(), strict=True):
            ticks: set[int] = set()
            for phase, points in phases.items():
                ticks.update(p.threads for p in points)
                ax.errorbar([p.threads for p in points], [p.mean * scale.factor for p in points],
                            yerr=[p.stdev * scale.factor for p in points], marker="o", capsize=3,
                            label=phase)
            ax.set_title(workload)
            ax.set_xlabel("threads")
            ax.set_ylabel(scale.label)
            ax.set_xticks(sorted(ticks))
            top = max(p.mean + p.stdev for points in phases.values() for p in points) * scale.factor
            ax.set_ylim(0, top * 1.15 if top > 0 else 1)
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best")
        figure.suptitle(_title(result, "bandwidth by threads"))

    return _render(build, fmt)


# -- latency percentiles -----------------------------------------------------------------------------
def latency_series(result: BenchmarkResult) -> list[tuple[str, dict[str, float]]]:
    """(step (direction), {percentile label: mean µs}) for every step and direction with percentiles."""
    out = []
    for step, by_metric in result.summaries_by_step().items():
        for direction in ("read", "write"):
            values = {label: by_metric[f"{direction}_lat_{key}"].mean
                      for key, label in PERCENTILES if f"{direction}_lat_{key}" in by_metric}
            if values:
                out.append((f"{step} ({direction})", values))
    return out


def latency_chart(result: BenchmarkResult, fmt: Format) -> bytes:
    groups = latency_series(result)
    if not groups:
        raise NoData(f"run {result.run_id} has no latency percentiles (state {result.state})")

    def build(figure: Figure) -> None:
        ax = figure.subplots()
        width = 0.8 / len(PERCENTILES)
        for index, (_, label) in enumerate(PERCENTILES):
            xs = [g + (index - (len(PERCENTILES) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, [values.get(label, 0.0) for _, values in groups], width, label=label)
        ax.set_xticks(range(len(groups)), [name for name, _ in groups], rotation=20, ha="right")
        ax.set_yscale("log")
        lowest = min((v for _, values in groups for v in values.values() if v > 0), default=1.0)
        ax.set_ylim(bottom=lowest / 3)  # every bar shows, p50 included
        ax.set_ylabel("completion latency (µs)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(title="percentile", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        figure.suptitle(_title(result, "latency percentiles"))

    return _render(build, fmt, _width(len(groups)))


# -- before/after ---------------------------------------------------------------------------------------
def compare_rows(a: BenchmarkResult, deltas: Sequence[MetricDelta],
                 family: MetricFamily) -> list[MetricDelta]:
    """Per step, the delta of the metric of ``family`` that describes the step."""
    wanted = {s.name: step_metric(s, family) for s in a.steps}
    return [d for d in deltas if wanted.get(d.step) == d.metric]


def _verdict_text(delta: MetricDelta) -> str:
    """'-30.1% (noise -18%..+22%)' over 'worse': the change with what it was judged against."""
    change = "n/a" if delta.delta_pct is None else f"{delta.delta_pct:+.1f}%"
    if delta.noise_low_pct is not None and delta.noise_high_pct is not None:
        change += f"\n(noise {delta.noise_low_pct:+.0f}%..{delta.noise_high_pct:+.0f}%)"
    return f"{change}\n{delta.verdict}"


#: Lines of "what changed" under a comparison chart; the rest is counted.
CHANGES_SHOWN: Final = 12


def _run_label(side: str, result: BenchmarkResult) -> str:
    context = result.context
    where = f" on {context.hostname}" if context is not None and context.hostname else ""
    kernel = f", kernel {context.kernel}" if context is not None and context.kernel else ""
    return f"{side}: {result.run_id}{where}{kernel}"


def compare_chart(a: BenchmarkResult, b: BenchmarkResult, deltas: Sequence[MetricDelta], fmt: Format,
                  family: MetricFamily = "bandwidth", *, changes: Sequence[str] = ()) -> bytes:
    """Before/after bars; under them, ``changes``: what differed between the runs (judge.judge's
    context lines: the spec, tunables in effect, kernel, fio ...), or that nothing did."""
    rows = compare_rows(a, deltas, family)
    if not rows:
        raise NoData(f"runs {a.run_id} and {b.run_id} have no step in common with a {family} figure")
    scale = _SCALES[family]
    shown = list(changes[:CHANGES_SHOWN])
    if len(changes) > CHANGES_SHOWN:
        shown.append(f"... and {len(changes) - CHANGES_SHOWN} more (stortune bench compare {a.run_id} "
                     f"{b.run_id})")
    caption = (["What changed from before to after:", *(f"  {line}" for line in shown)] if shown else
               ["Nothing changed between the runs: same spec, settings, versions and topology."])

    def bar(ax: Any, offset: float, summaries: list[Summary], label: str) -> None:
        ax.bar([i + offset for i in range(len(summaries))], [s.mean * scale.factor for s in summaries], 0.38,
               yerr=[s.stdev * scale.factor for s in summaries], capsize=3, label=label)

    def build(figure: Figure) -> None:
        ax, notes = figure.subplots(2, 1, height_ratios=[_SIZE[1], 0.35 + 0.17 * len(caption)])
        bar(ax, -0.2, [d.a for d in rows], _run_label("before", a))
        bar(ax, 0.2, [d.b for d in rows], _run_label("after", b))
        top = max(max(d.a.mean + d.a.stdev, d.b.mean + d.b.stdev) for d in rows) * scale.factor
        for i, delta in enumerate(rows):
            height = max(delta.a.mean + delta.a.stdev, delta.b.mean + delta.b.stdev) * scale.factor
            ax.annotate(_verdict_text(delta), (i, height), xytext=(0, 4), textcoords="offset points",
                        ha="center", fontsize=7,
                        color={"better": "tab:green", "worse": "tab:red"}.get(delta.verdict, "0.3"))
        ax.set_xticks(range(len(rows)), [d.step for d in rows], rotation=20, ha="right")
        ax.set_ylabel(scale.label)
        ax.set_ylim(0, top * 1.6 if top > 0 else 1)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(loc="upper left", ncol=1, fontsize=8)
        notes.axis("off")
        for index, line in enumerate(caption):
            notes.text(0, 1 - index / max(len(caption), 1), line, transform=notes.transAxes, va="top",
                       fontsize=8, family="monospace", fontweight="bold" if index == 0 else "normal")
        figure.suptitle(f"{a.name} -> {b.name}: {family} before and after (error bars: 1 stdev)")

    return _render(build, fmt, _width(len(rows)), _SIZE[1] + 0.35 + 0.17 * len(caption))


#: The one entry point for charts drawn elsewhere (experiment charts): the same backend, lock and style.
render_figure = _render
