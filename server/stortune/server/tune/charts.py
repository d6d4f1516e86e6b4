"""Charts of an experiment, PNG or SVG, with the benchmark charts' plotting (``bench.plots``).

* ``values``: the objective against each parameter's values, one panel per parameter, the other
  parameters at the leader's values where that point was measured; error bars the 95% interval;
  the baseline value marked;
* ``progress``: the best feasible mean so far against the trial, every trial's own value beside
  it (one line per host for a fleet);
* ``heatmap``: the mean over the first two parameters (the best point measured per cell);
* ``fairness``: the per-job bandwidth CV of every trial against the constraint's bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from stortune.schemas.bench import metrics
from stortune.server.bench.plots import MEDIA_TYPES, Format, NoData
from stortune.server.bench.plots import render_figure as _render
from stortune.server.models.experiments import ExperimentDocument

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Kind = Literal["values", "progress", "heatmap", "fairness"]
KINDS: Final = ("values", "progress", "heatmap", "fairness")
__all__ = ["KINDS", "MEDIA_TYPES", "NoData", "render"]


def _scale(metric: str) -> tuple[float, str]:
    """A factor and axis label that make the metric readable (MB/s, µs ...)."""
    if metric.endswith("bandwidth"):
        return 1e-6, f"{metric} (MB/s)"
    if "_lat_" in metric:
        return 1.0, f"{metric} (µs)"
    return 1.0, metric


def _outcome(doc: ExperimentDocument) -> dict[str, Any]:
    outcome = doc.status.outcome
    if not outcome or not outcome.get("trials"):
        raise NoData(f"experiment {doc.metadata.uid} has no recorded trial yet (state {doc.status.state})")
    return outcome


def _title(doc: ExperimentDocument, what: str) -> str:
    outcome = doc.status.outcome or {}
    where = f" on {outcome['trialsHost']} (of {len(outcome.get('hosts') or [])} hosts)" if outcome.get(
        "trialsHost") else ""
    return f"{doc.metadata.name}: {what}{where} (experiment {doc.metadata.uid})"


def _label(value: Any) -> str:
    return str(value)


def _keys(doc: ExperimentDocument) -> list[str]:
    keys = []
    for p in doc.spec.get("parameters") or []:
        key = str(p.get("tunable")) + ("@beneath" if p.get("at") == "beneath" else "")
        keys.append(key)
    return keys


def _usable(trials: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [t for t in trials if isinstance(t.get("mean"), int | float)]


def _pick(trials: Sequence[Mapping[str, Any]], key: str, value: Any, leader: Mapping[str, Any] | None,
          maximize: bool) -> Mapping[str, Any] | None:
    """The trial with ``key`` = value and the others at the leader's values, else the best one."""
    with_value = [t for t in trials if t["point"].get(key) == value]
    if not with_value:
        return None
    if leader is not None:
        same = [t for t in with_value if all(t["point"].get(k) == v for k, v in leader.items() if k != key)]
        if same:
            return same[0]
    return (max if maximize else min)(with_value, key=lambda t: float(t["mean"]))


def _bound(trial: Mapping[str, Any], key: str) -> float:
    """An end of the trial's 95% interval; its mean when it has none (one run)."""
    value = trial.get(key)
    return float(value if isinstance(value, int | float) else trial["mean"])


def values_chart(doc: ExperimentDocument, fmt: Format) -> bytes:
    outcome = _outcome(doc)
    trials = _usable(outcome["trials"])
    if not trials:
        raise NoData(f"experiment {doc.metadata.uid} has no point with a mean yet")
    metric = str(outcome.get("metric"))
    factor, label = _scale(metric)
    maximize = outcome.get("goal") != "minimize"
    leader = (outcome.get("recommendation") or {}).get("values")
    baseline = doc.status.hosts[0].baseline if doc.status.hosts and doc.status.hosts[0].baseline else {}
    keys = _keys(doc)
    spaces = {p_key: [v for v in (p.get("values") or [])] for p_key, p in zip(keys, doc.spec.get("parameters")
                                                                           or [], strict=False)}

    def build(figure: Figure) -> None:
        axes = figure.subplots(1, len(keys), squeeze=False)[0]
        for ax, key in zip(axes, keys, strict=True):
            seen = sorted({t["point"].get(key) for t in trials if key in t["point"]},
                          key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0, str(v)))
            order = [v for v in spaces.get(key, []) if v in seen] or seen
            picked = [(v, _pick(trials, key, v, leader, maximize)) for v in order]
            shown = [(v, t) for v, t in picked if t is not None]
            xs = list(range(len(shown)))
            means = [float(t["mean"]) * factor for _, t in shown]
            pairs = list(zip(means, [t for _, t in shown], strict=True))
            low = [max(0.0, m - _bound(t, "ci95_low") * factor) for m, t in pairs]
            high = [max(0.0, _bound(t, "ci95_high") * factor - m) for m, t in pairs]
            colours = ["tab:green" if leader and t["point"] == leader else
                       "0.5" if not t.get("feasible", True) else "tab:blue" for _, t in shown]
            ax.bar(xs, means, color=colours, yerr=[low, high], capsize=3)
            ax.set_xticks(xs, [_label(v) + (" (now)" if baseline.get(key) == v else "") for v, _ in shown],
                          rotation=30, ha="right")
            ax.set_xlabel(key)
            ax.set_ylabel(label)
            ax.grid(True, axis="y", alpha=0.3)
        figure.suptitle(_title(doc, f"{metric} by value (error bars: 95% interval; green: recommended)"))

    return _render(build, fmt, max(8.0, 3.2 * len(keys)), 4.5)


def progress_chart(doc: ExperimentDocument, fmt: Format) -> bytes:
    outcome = _outcome(doc)
    metric = str(outcome.get("metric"))
    factor, label = _scale(metric)
    per_host: Mapping[str, Any] = outcome.get("perHost") or {"": outcome}
    measured: dict[str, list[tuple[int, float]]] = {}
    for trial in doc.status.trials or []:
        m = trial.measurement or {}
        value = (m.get("metrics") or {}).get(metric)
        if m.get("ok") and isinstance(value, int | float):
            measured.setdefault(trial.host, []).append((trial.index + 1, float(value)))
    if not any((o or {}).get("bestSoFar") for o in per_host.values()) and not measured:
        raise NoData(f"experiment {doc.metadata.uid} has no successful trial yet")

    def build(figure: Figure) -> None:
        ax = figure.subplots()
        for host, own in per_host.items():
            best = [(i + 1, v * factor) for i, v in enumerate((own or {}).get("bestSoFar") or [])
                    if isinstance(v, int | float)]
            if best:
                ax.step([b[0] for b in best], [b[1] for b in best], where="post",
                        label=f"best so far{' on ' + host if host and len(per_host) > 1 else ''}")
        for host, points in measured.items():
            ax.scatter([p[0] for p in points], [p[1] * factor for p in points], s=12, alpha=0.6,
                       label=f"each trial{' on ' + host if len(measured) > 1 else ''}")
        ax.set_xlabel("trial")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        figure.suptitle(_title(doc, f"{metric}: best so far against trial"))

    return _render(build, fmt)


def heatmap_chart(doc: ExperimentDocument, fmt: Format) -> bytes:
    outcome = _outcome(doc)
    keys = _keys(doc)
    if len(keys) < 2:
        raise NoData(f"experiment {doc.metadata.uid} varies one parameter: a heatmap needs two")
    first, second = keys[0], keys[1]
    trials = _usable(outcome["trials"])
    maximize = outcome.get("goal") != "minimize"
    metric = str(outcome.get("metric"))
    factor, label = _scale(metric)
    xs = sorted({t["point"].get(first) for t in trials}, key=str)
    ys = sorted({t["point"].get(second) for t in trials}, key=str)
    if not trials or len(xs) < 1 or len(ys) < 1:
        raise NoData(f"experiment {doc.metadata.uid} has no point with a mean yet")
    grid = [[math.nan] * len(xs) for _ in ys]
    for t in trials:
        i, j = ys.index(t["point"].get(second)), xs.index(t["point"].get(first))
        value = float(t["mean"]) * factor
        current = grid[i][j]
        if math.isnan(current) or (value > current if maximize else value < current):
            grid[i][j] = value

    def build(figure: Figure) -> None:
        ax = figure.subplots()
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(xs)), [_label(x) for x in xs], rotation=30, ha="right")
        ax.set_yticks(range(len(ys)), [_label(y) for y in ys])
        ax.set_xlabel(first)
        ax.set_ylabel(second)
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    ax.text(j, i, f"{value:.3g}", ha="center", va="center", fontsize=7, color="white")
        figure.colorbar(image, ax=ax, label=label)
        figure.suptitle(_title(doc, f"{metric} over {first} and {second} (blank: not measured)"))

    return _render(build, fmt)


def fairness_chart(doc: ExperimentDocument, fmt: Format) -> bytes:
    bounds = [c for c in doc.spec.get("constraints") or [] if isinstance(c, dict) and "fairness" in c]
    points = [(t.index + 1, float((t.measurement or {})["job_cv"]), t.host) for t in doc.status.trials or []
              if isinstance((t.measurement or {}).get("job_cv"), int | float)]
    if not points:
        raise NoData(f"experiment {doc.metadata.uid} measured no per-job fairness (no fairness constraint, "
                     "or no trial yet)")

    def build(figure: Figure) -> None:
        ax = figure.subplots()
        hosts = sorted({p[2] for p in points})
        for host in hosts:
            mine = [p for p in points if p[2] == host]
            ax.plot([p[0] for p in mine], [p[1] for p in mine], marker="o", linestyle="",
                    label=f"per-job CV{' on ' + host if len(hosts) > 1 else ''}")
        for bound in bounds:
            cv = bound.get("maxCV")
            if isinstance(cv, int | float):
                ax.axhline(float(cv), color="tab:red", linestyle="--",
                           label=f"max CV {cv:g}% ({bound['fairness']})")
        ax.set_xlabel("trial")
        ax.set_ylabel("CV of per-job bandwidth (%)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        figure.suptitle(_title(doc, "fairness across concurrent jobs"))

    return _render(build, fmt)


def render(doc: ExperimentDocument, kind: Kind, fmt: Format) -> bytes:
    draw = {"values": values_chart, "progress": progress_chart, "heatmap": heatmap_chart,
            "fairness": fairness_chart}[kind]
    return draw(doc, fmt)


def metric_text(metric: str, value: float | None) -> str:
    return "-" if value is None else metrics.get(metric).human(value)
