"""The analysis as table rows: one text layout for ``stortune-agent analyze`` and
``stortune analyze host`` (each prints the sections with its own table writer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stortune.schemas.analysis import volumes
from stortune.schemas.analysis.ceilings import mb
from stortune.schemas.analysis.model import Check, DeviceAnalysis, ExistingArray, HostAnalysis, Layer, Part

LAYER_HEADERS = ("LAYER", "KIND", "CEILING", "SOURCE")
CHECK_HEADERS = ("SEVERITY", "CODE", "DEVICE", "MESSAGE")
BALANCE_HEADERS = ("GROUP", "PATH", "PORT", "SHARE", "EVEN", "BYTES")


@dataclass(frozen=True)
class Section:
    """One block of the layout: a heading, then a table (``headers`` and ``rows``) or lines."""

    heading: str
    headers: tuple[str, ...] = ()
    rows: list[list[str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    #: Lines that call for attention (a writer with colours shows them so).
    attention: bool = False


def mbps(value: float | None) -> str:
    """MB/s as the sources write it (1,594 MB/s); '-' when unknown."""
    return "-" if value is None else mb(value)


def _ceiling(value: float | None, iops: float | None, estimate: bool) -> str:
    text = mbps(value)
    if iops is not None:
        text += f", {iops:,.0f} IOPS"
    return f"~{text}" if estimate and value is not None else text


def _part_row(part: Part) -> list[str]:
    return [f"  {part.name}", "", _ceiling(part.ceiling_bytes_per_second, part.ceiling_iops,
                                            part.estimate), part.source]


def _layer_row(layer: Layer, limit: str | None) -> list[str]:
    mark = " <- limit" if limit is not None and layer.name == limit else ""
    return [layer.name + mark, layer.kind.value,
            _ceiling(layer.ceiling_bytes_per_second, layer.ceiling_iops, layer.estimate), layer.source]


def layer_rows(device: DeviceAnalysis, *, parts: bool = True) -> list[list[str]]:
    """The device's layer tree, top to bottom; each layer's parts indented below it when a
    layer has more than one (a single part repeats its layer)."""
    rows: list[list[str]] = []
    for layer in device.layers:
        rows.append(_layer_row(layer, device.limit))
        if parts and len(layer.parts) > 1:
            rows.extend(_part_row(p) for p in layer.parts)
    return rows


def device_heading(device: DeviceAnalysis) -> str:
    limit = f", limited by {device.limit}" if device.limit else ""
    kind = f"{device.kind}, {device.volume}" if device.volume else device.kind
    return f"{device.device} ({kind}): ceiling {mbps(device.ceiling_bytes_per_second)}{limit}"


def check_rows(checks: Sequence[Check]) -> list[list[str]]:
    order = {"error": 0, "warning": 1, "info": 2}
    return [[c.severity, c.code, c.device or "-", c.message]
            for c in sorted(checks, key=lambda c: (order[c.severity], c.device or "", c.code))]


def all_checks(analysis: HostAnalysis) -> list[Check]:
    """Host-wide checks and every device's, each once (a check found through two devices'
    chains is the same finding)."""
    seen: set[tuple[str, str, str | None]] = set()
    out: list[Check] = []
    for check in [*analysis.checks, *(c for d in analysis.devices for c in d.checks)]:
        key = (check.code, check.message, check.device)
        if key not in seen:
            seen.add(key)
            out.append(check)
    return out


def sections(analysis: HostAnalysis) -> list[Section]:
    """The whole layout: each device's layer tree, the checks, slow members, path balance and
    the probe ceilings used."""
    out = [Section(device_heading(d), LAYER_HEADERS, layer_rows(d)) for d in analysis.devices]
    if analysis.controllers is not None:
        lines = volumes.inventory_lines(analysis.controllers)
        out.append(Section("Hardware RAID controllers", lines=lines or ["none found"],
                           attention=bool(analysis.controllers.errors)))
    checks = all_checks(analysis)
    if checks:
        out.append(Section("Checks", CHECK_HEADERS, check_rows(checks)))
    if analysis.slow_members:
        out.append(Section("Slow members (across the latest benchmark runs)",
                           lines=[f"{m.group}: {m.message}" for m in analysis.slow_members], attention=True))
    if analysis.balance:
        out.append(Section("Path balance", BALANCE_HEADERS, [
            [s.group, s.path + (" (idle)" if s.idle else ""), s.port or "-", f"{s.share:.0%}",
             f"{s.even_share:.0%}", f"{s.bytes:,}"] for s in analysis.balance]))
    if analysis.arrays:
        out.append(Section("What the md arrays can do (RAID planning's model)", ARRAY_HEADERS,
                           [array_row(a) for a in analysis.arrays]))
    if analysis.measured:
        out.append(Section("Probe ceilings used", lines=[", ".join(m.device for m in analysis.measured)]))
    return out


ARRAY_HEADERS = ("ARRAY", "LEVEL", "DISKS", "PER DISK", "RANDOM IOPS", "SEQ READ", "REBUILD (IDLE)",
                 "WARNINGS")


def array_row(array: ExistingArray) -> list[str]:
    """One md array: its members' weakest figures and what the level makes of them."""
    plan = array.plan
    per_disk = "-" if array.per_disk_iops is None else (
        f"{array.per_disk_iops:,.0f} IOPS" + (f", {array.per_disk_mbps:,.0f} MB/s"
                                              if array.per_disk_mbps is not None else "")
        + f" ({array.per_disk_source})")
    if plan is None:
        return [array.array, array.level, str(len(array.members)), per_disk, "-", "-", "-",
                "not a level RAID planning models, or no per-disk figures"]
    iops = "-" if plan.random_iops is None else f"{'~' if plan.estimate else ''}{plan.random_iops:,.0f}"
    seq = "-" if plan.sequential_read_mbps is None else f"{plan.sequential_read_mbps:,.0f} MB/s"
    rebuild = "-" if plan.rebuild_seconds_idle is None else f"{plan.rebuild_seconds_idle / 3600:,.1f} h"
    return [array.array, plan.level, str(plan.disks), per_disk, iops, seq, rebuild,
            "; ".join(plan.warnings) or "-"]
