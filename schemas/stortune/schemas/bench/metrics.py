"""The metrics a benchmark step yields, their units and which way is better.

Results, thresholds and comparisons all key on these names. Latencies are
completion latencies (fio's clat, what its percentiles describe) except
``*_lat_mean``, the total latency (submission + completion).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from stortune.schemas.bench import units

Unit = Literal["bytes/s", "IO/s", "us", "%"]


@dataclass(frozen=True)
class Metric:
    name: str
    unit: Unit
    higher_is_better: bool
    description: str

    def parse(self, value: object) -> float:
        """A threshold value in this metric's unit ('386MB/s', '20ms', '25k')."""
        return _PARSERS[self.unit](value)

    def human(self, value: float) -> str:
        return _HUMAN[self.unit](value)


def _percent(value: object) -> float:
    if isinstance(value, str) and value.strip().endswith("%"):
        value = value.strip()[:-1]
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a percentage like 35 or 35%") from None
    if isinstance(value, bool) or not 0 <= number <= 100 * 1024:
        raise ValueError(f"{value!r} is not a percentage like 35 or 35%")
    return number


_PARSERS: dict[Unit, Callable[[object], float]] = {
    "bytes/s": units.parse_rate, "IO/s": units.parse_count_rate, "us": units.parse_latency,
    "%": _percent,
}
_HUMAN: dict[Unit, Callable[[float], str]] = {
    "bytes/s": units.human_bytes_per_s, "IO/s": lambda v: f"{units.human_count(v)} IOPS",
    "us": units.human_latency_us, "%": lambda v: f"{v:.1f}%",
}

PERCENTILES: dict[str, float] = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def _build() -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for d in ("read", "write", "total"):
        out[f"{d}_bandwidth"] = Metric(f"{d}_bandwidth", "bytes/s", True, f"{d} throughput")
        out[f"{d}_iops"] = Metric(f"{d}_iops", "IO/s", True, f"{d} I/O per second")
    for d in ("read", "write"):
        out[f"{d}_lat_mean"] = Metric(f"{d}_lat_mean", "us", False, f"mean total {d} latency")
        for key, pct in PERCENTILES.items():
            out[f"{d}_lat_{key}"] = Metric(f"{d}_lat_{key}", "us", False,
                                           f"{pct:g}th percentile {d} completion latency")
    out["cpu_usr"] = Metric("cpu_usr", "%", False, "fio's user CPU")
    out["cpu_sys"] = Metric("cpu_sys", "%", False, "fio's system CPU")
    return out


METRICS: dict[str, Metric] = _build()
MetricName = str


def get(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)}") from None
