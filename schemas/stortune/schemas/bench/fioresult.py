"""Parse what fio writes with ``--output-format=json`` into one normalised result.

Robust to what fio really prints, across versions:

* text before the JSON (``fio: ...`` warnings, a setup error, ``note: ...``)
  is kept as ``preamble``, not a parse failure;
* fio >= 3.0 reports ``*_ns`` latencies, ``bw_bytes`` and ``io_bytes`` in
  bytes; fio 2.x reports ``clat``/``lat`` in microseconds, ``bw`` in KiB/s
  and ``io_bytes`` in KiB (there is no ``io_kbytes``); this is told apart by
  the fields present, never by the version string;
* a direction without I/O has no percentiles (fio 3.x leaves them out when
  N is 0; fio 2.x prints zeros): they are absent here too, never zero;
* several jobs (no group_reporting) add up: bandwidth and IOPS sum, mean
  latencies are weighted by I/O count, percentiles take the worst job's
  (percentiles of separate jobs cannot be merged exactly; this never flatters);
* a job with a non-zero ``error`` makes the result not ``ok`` and says which.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.bench.metrics import PERCENTILES

_JSON_START = re.compile(r"^\s*\{", re.MULTILINE)


class FioOutputError(ValueError):
    """fio's output holds no result; the message quotes what it holds instead."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DirectionResult(_Model):
    io_bytes: int = 0
    bandwidth: float = Field(default=0.0, description="bytes/s")
    iops: float = 0.0
    total_ios: int | None = None
    runtime_ms: float = 0.0
    lat_mean_us: float | None = Field(default=None, description="Total latency (slat + clat)")
    clat_mean_us: float | None = None
    clat_max_us: float | None = None
    percentiles_us: dict[str, float] = Field(
        default_factory=dict, description="Completion latency: p50, p95, p99, p999")

    @property
    def has_io(self) -> bool:
        return self.io_bytes > 0 or bool(self.total_ios)


class JobResult(_Model):
    name: str
    groupid: int = 0
    error: int = 0
    read: DirectionResult = Field(default_factory=DirectionResult)
    write: DirectionResult = Field(default_factory=DirectionResult)
    usr_cpu: float | None = None
    sys_cpu: float | None = None


class FioResult(_Model):
    fio_version: str | None = None
    jobs: list[JobResult] = Field(default_factory=list)
    read: DirectionResult = Field(default_factory=DirectionResult)
    write: DirectionResult = Field(default_factory=DirectionResult)
    usr_cpu: float | None = None
    sys_cpu: float | None = None
    errors: list[str] = Field(default_factory=list)
    preamble: list[str] = Field(default_factory=list, description="Text fio printed before the JSON")

    @property
    def ok(self) -> bool:
        return not self.errors

    def metrics(self) -> dict[str, float]:
        """Values by metric name (see ``metrics.METRICS``); directions without I/O are left out."""
        out: dict[str, float] = {}
        for name, d in (("read", self.read), ("write", self.write)):
            if not d.has_io:
                continue
            out[f"{name}_bandwidth"] = d.bandwidth
            out[f"{name}_iops"] = d.iops
            mean = d.lat_mean_us if d.lat_mean_us is not None else d.clat_mean_us
            if mean is not None:
                out[f"{name}_lat_mean"] = mean
            for key, value in d.percentiles_us.items():
                out[f"{name}_lat_{key}"] = value
        if not out:
            return out  # nothing measured: no totals, and CPU figures of nothing
        out["total_bandwidth"] = self.read.bandwidth + self.write.bandwidth
        out["total_iops"] = self.read.iops + self.write.iops
        if self.usr_cpu is not None:
            out["cpu_usr"] = self.usr_cpu
        if self.sys_cpu is not None:
            out["cpu_sys"] = self.sys_cpu
        return out


# -- parsing -----------------------------------------------------------------------------
def _num(obj: Mapping[str, Any] | None, key: str) -> float | None:
    if not isinstance(obj, Mapping):
        return None
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _latency(d: Mapping[str, Any], name: str) -> tuple[Mapping[str, Any] | None, float]:
    """(stats object, factor to microseconds): ``clat_ns`` (3.x) or ``clat`` (2.x, in µs)."""
    obj = d.get(f"{name}_ns")
    if isinstance(obj, Mapping):
        return obj, 1e-3
    obj = d.get(name)
    if isinstance(obj, Mapping):
        # fio 2.x: usec; some 2.x builds flag msec with "unit" (very long latencies)
        return obj, 1e3 if obj.get("unit") == "msec" else 1.0
    return None, 1.0


def _percentiles(stats: Mapping[str, Any] | None, factor: float) -> dict[str, float]:
    table = stats.get("percentile") if isinstance(stats, Mapping) else None
    if not isinstance(table, Mapping):
        return {}
    by_pct: dict[float, float] = {}
    for key, value in table.items():
        try:
            by_pct[round(float(key), 3)] = float(value)
        except (TypeError, ValueError):
            continue
    return {name: by_pct[pct] * factor for name, pct in PERCENTILES.items() if pct in by_pct}


def _direction(d: Any) -> DirectionResult:
    if not isinstance(d, Mapping):
        return DirectionResult()
    io = _num(d, "io_bytes") or 0.0
    io_bytes = int(io if "io_kbytes" in d else io * 1024)
    bw = _num(d, "bw_bytes")
    bandwidth = bw if bw is not None else (_num(d, "bw") or 0.0) * 1024
    total = _num(d, "total_ios")
    result = DirectionResult(
        io_bytes=io_bytes, bandwidth=bandwidth, iops=_num(d, "iops") or 0.0,
        total_ios=None if total is None else int(total), runtime_ms=_num(d, "runtime") or 0.0,
    )
    if not result.has_io:
        return result  # no samples: no latency, no percentiles (fio 2.x prints zeros)
    clat, cf = _latency(d, "clat")
    lat, lf = _latency(d, "lat")
    if clat is not None and _num(clat, "N") != 0:
        result.clat_mean_us = _scaled(clat, "mean", cf)
        result.clat_max_us = _scaled(clat, "max", cf)
        result.percentiles_us = _percentiles(clat, cf)
    if lat is not None and _num(lat, "N") != 0:
        result.lat_mean_us = _scaled(lat, "mean", lf)
        if not result.percentiles_us:  # lat_percentiles=1 puts them under lat only
            result.percentiles_us = _percentiles(lat, lf)
    return result


def _scaled(obj: Mapping[str, Any], key: str, factor: float) -> float | None:
    value = _num(obj, key)
    return None if value is None else value * factor


def _job(j: Any, index: int) -> JobResult:
    if not isinstance(j, Mapping):
        return JobResult(name=f"job{index}", error=-1)
    return JobResult(
        name=str(j.get("jobname", f"job{index}")), groupid=int(_num(j, "groupid") or 0),
        error=int(_num(j, "error") or 0), read=_direction(j.get("read")),
        write=_direction(j.get("write")), usr_cpu=_num(j, "usr_cpu"), sys_cpu=_num(j, "sys_cpu"),
    )


def _combine(parts: Sequence[DirectionResult]) -> DirectionResult:
    active = [p for p in parts if p.has_io]
    if len(active) <= 1:
        return active[0] if active else (parts[0] if parts else DirectionResult())
    total_ios = [p.total_ios for p in active]
    weights = [float(t) if t else float(p.io_bytes) for p, t in zip(active, total_ios, strict=True)]

    def weighted(attr: str) -> float | None:
        pairs: list[tuple[float, float]] = [
            (float(getattr(p, attr)), w) for p, w in zip(active, weights, strict=True)
            if getattr(p, attr) is not None]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else None

    keys = set.intersection(*(set(p.percentiles_us) for p in active))
    maxima = [p.clat_max_us for p in active if p.clat_max_us is not None]
    return DirectionResult(
        io_bytes=sum(p.io_bytes for p in active), bandwidth=sum(p.bandwidth for p in active),
        iops=sum(p.iops for p in active),
        total_ios=None if None in total_ios else sum(t or 0 for t in total_ios),
        runtime_ms=max(p.runtime_ms for p in active), lat_mean_us=weighted("lat_mean_us"),
        clat_mean_us=weighted("clat_mean_us"), clat_max_us=max(maxima) if maxima else None,
        percentiles_us={k: max(p.percentiles_us[k] for p in active) for k in sorted(keys)},
    )


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _find_json(text: str) -> tuple[dict[str, Any], str]:
    decoder = json.JSONDecoder()
    for m in _JSON_START.finditer(text):
        start = text.index("{", m.start())
        try:
            data, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(data, dict) and ("jobs" in data or "client_stats" in data):
            return data, text[:start]
    shown = " | ".join(line.strip() for line in text.strip().splitlines()[:5]) or "nothing"
    raise FioOutputError(f"fio's output holds no JSON result; it says: {shown[:500]}")


def parse(text: str) -> FioResult:
    """One fio JSON output (with whatever fio printed before it) -> FioResult."""
    data, before = _find_json(text)
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list):  # client/server mode
        raw_jobs = [j for j in data.get("client_stats") or []
                    if isinstance(j, Mapping) and j.get("jobname") != "All clients"]
    jobs = [_job(j, i) for i, j in enumerate(raw_jobs)]
    errors = [f"job {j.name}: error {j.error}"
              + (f" ({errno.errorcode[j.error]})" if j.error in errno.errorcode else "")
              for j in jobs if j.error]
    if not jobs:
        errors.append("fio reported no jobs")
    version = data.get("fio version")
    return FioResult(
        fio_version=str(version) if version is not None else None, jobs=jobs,
        read=_combine([j.read for j in jobs]), write=_combine([j.write for j in jobs]),
        usr_cpu=_mean([j.usr_cpu for j in jobs]), sys_cpu=_mean([j.sys_cpu for j in jobs]),
        errors=errors, preamble=[line.rstrip() for line in before.splitlines() if line.strip()],
    )
