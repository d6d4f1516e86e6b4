"""The bottleneck verdict on one benchmark step: each layer's load against its ceiling.

A layer's measured figure is what crossed it: for the layers beneath the block device
(disks, links, ports, controllers, PCIe links) the sum of the figures of the bottom devices
whose I/O crosses its parts, each device counted once; for the layers at and above it
(filesystem, LVM, multipath, md, partition) the target's own figure. Its share is the larger
of bytes/s against the byte ceiling and IOPS against the IOPS ceiling (a random 4 KiB step
saturates a disk's IOPS long before its bytes). The layer with the highest share is the limit;
a layer without a known ceiling is listed but never the limit.

Saturation follows the USE method: a device whose utilisation is near 100 %, whose average
queue holds more than one I/O, or whose await is far above its peers' median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from stortune.schemas.analysis.ceilings import PROBED_READ, mb
from stortune.schemas.analysis.members import (
    PEER_RELATIONS,
    PORTS,
    balance,
    finite,
    medians_of_the_others,
    slow_members,
    unbalanced,
)
from stortune.schemas.analysis.model import (
    Bottleneck,
    DeviceAnalysis,
    Layer,
    LayerKind,
    LayerLoad,
    PathShare,
    Saturation,
    SlowMember,
)
from stortune.schemas.bench.results import STANDOUT, BenchmarkResult, DeviceStats
from stortune.schemas.topology import Topology

#: Layers whose load is the target's own figure (the I/O the workload asked for).
TOP_KINDS = frozenset({LayerKind.FILESYSTEM, LayerKind.LVM, LayerKind.MULTIPATH, LayerKind.DM,
                       LayerKind.MD, LayerKind.PARTITION})
#: Utilisation from which a device counts as fully used (iostat's %util).
UTIL_FULL = 90.0
#: Average I/Os in flight above which requests wait for one another.
QUEUE_SATURATED = 1.0


class _Figures:
    """One device's mean over the step's repeats (bytes/s, IOPS, util, queue, await)."""

    def __init__(self, samples: Sequence[DeviceStats]) -> None:
        first = samples[0]
        self.device, self.relation, self.above = first.device, first.relation, first.above
        self.bytes_per_s = _mean([s.read_bytes_per_s + s.write_bytes_per_s for s in samples]) or 0.0
        self.write_bytes_per_s = _mean([s.write_bytes_per_s for s in samples]) or 0.0
        self.iops = _mean([s.read_iops + s.write_iops for s in samples]) or 0.0
        self.util = _mean([s.util_percent for s in samples])
        self.queue = _mean([s.queue_depth for s in samples])
        self.await_ms = _mean([s.await_ms for s in samples if s.read_ios + s.write_ios > 0])


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in (finite(x) for x in values) if v is not None and v >= 0]
    return sum(known) / len(known) if known else None


def _figures(stats: Sequence[DeviceStats]) -> dict[str, _Figures]:
    by_device: dict[str, list[DeviceStats]] = {}
    for s in stats:
        by_device.setdefault(s.device, []).append(s)
    return {name: _Figures(samples) for name, samples in by_device.items()}


def _share(measured: float | None, ceiling: float | None) -> float | None:
    if measured is None or ceiling is None or not ceiling > 0:
        return None
    return measured / ceiling


def _load(layer: Layer, target: _Figures | None, figures: dict[str, _Figures]) -> LayerLoad:
    if layer.kind in TOP_KINDS:
        crossing = [target] if target is not None else []
    else:
        names = dict.fromkeys(d for part in layer.parts for d in part.devices)  # each device once
        crossing = [figures[n] for n in names if n in figures]
    measured = sum(f.bytes_per_s for f in crossing) if crossing else None
    iops = sum(f.iops for f in crossing) if crossing else None
    ceiling, ceiling_iops = finite(layer.ceiling_bytes_per_second), finite(layer.ceiling_iops)
    shares = [s for s in (_share(measured, ceiling), _share(iops, ceiling_iops)) if s is not None]
    if _read_ceilings_only(layer) and crossing and 2 * sum(f.write_bytes_per_s for f in crossing) > (
            measured or 0.0):
        shares = []  # a probe only reads: its figure says nothing of what writes can do
    return LayerLoad(layer=layer.name, kind=layer.kind, ceiling_bytes_per_second=ceiling,
                     measured_bytes_per_second=measured, ceiling_iops=ceiling_iops, measured_iops=iops,
                     share=round(max(shares), 4) if shares else None, estimate=layer.estimate)


def _read_ceilings_only(layer: Layer) -> bool:
    """Every known ceiling of the layer is a probe's read figure."""
    known = [p for p in layer.parts if p.ceiling_bytes_per_second is not None or p.ceiling_iops is not None]
    return bool(known) and all(p.detail == PROBED_READ for p in known)


def _what(layer: Layer) -> str:
    """'2 x 8 Gbit' when the parts rest on one figure, else ''."""
    details = {p.detail or "" for p in layer.parts}
    if len(details) == 1 and "" not in details:
        detail = details.pop()
        return detail if len(layer.parts) == 1 else f"{len(layer.parts)} x {detail}"
    return ""


def summary(load: LayerLoad, layer: Layer) -> str:
    """'host1+host2 qla2xxx, 2 x 8GFC = 1,594 MB/s: measured 1,540 MB/s, 97 %'."""
    by_iops = (_share(load.measured_iops, load.ceiling_iops) or 0.0) > (
        _share(load.measured_bytes_per_second, load.ceiling_bytes_per_second) or 0.0)
    if by_iops:
        ceiling, measured = f"{load.ceiling_iops or 0:,.0f} IOPS", f"{load.measured_iops or 0:,.0f} IOPS"
    else:
        ceiling, measured = mb(load.ceiling_bytes_per_second or 0), mb(load.measured_bytes_per_second or 0)
    what = _what(layer)
    text = f"{load.layer}, {what + ' = ' if what else ''}{ceiling}: measured {measured}, " \
           f"{100 * (load.share or 0):.0f} %"
    return text + (" (estimated ceiling)" if load.estimate else "")


def saturation(stats: Sequence[DeviceStats]) -> list[Saturation]:
    """Devices the USE method calls saturated: util near 100 %, queue above 1, or an await
    far above the median of their peers (the other members of the same array or LUN)."""
    figures = _figures(stats)
    peers: dict[tuple[str, str], list[_Figures]] = {}
    for f in figures.values():
        if f.relation in PEER_RELATIONS and f.above:
            peers.setdefault((f.above, f.relation), []).append(f)
    # each device's peers' median await, in one sort per group (not a median per device)
    peer_median: dict[int, float | None] = {}
    for group in peers.values():
        timed = {id(p): p.await_ms for p in group if p.await_ms is not None}
        peer_median.update(zip(timed, medians_of_the_others(list(timed.values())), strict=True))
        if timed:  # a device without an await of its own: every timed one is its peer
            median_all = statistics.median(timed.values())
            peer_median.update({id(p): median_all for p in group if p.await_ms is None})
    out = []
    for f in figures.values():
        reasons = []
        if f.util is not None and f.util >= UTIL_FULL:
            reasons.append(f"util {f.util:.0f} %")
        if f.queue is not None and f.queue > QUEUE_SATURATED:
            reasons.append(f"queue {f.queue:.1f}")
        median = peer_median.get(id(f))
        if f.await_ms is not None and median and f.await_ms >= STANDOUT * median:
            reasons.append(f"await {f.await_ms:.1f} ms = {f.await_ms / median:.1f} x its peers' median")
        if reasons:
            out.append(Saturation(device=f.device, util_percent=f.util, queue_depth=f.queue,
                                  await_ms=f.await_ms, peers_await_ms=median, reasons=reasons))
    return sorted(out, key=lambda s: (-len(s.reasons), s.device))


def bottleneck(analysis: DeviceAnalysis, step: str, stats: Sequence[DeviceStats]) -> Bottleneck:
    """The verdict on ``step``: every layer of ``analysis`` measured against its ceiling from
    ``stats`` (one step's device figures; several entries of a device, its repeats, are
    averaged), the limit and the saturated devices."""
    figures = _figures(stats)
    target = figures.get(analysis.device) or next(
        (f for f in figures.values() if f.relation == "target"), None)
    loads = [(_load(layer, target, figures), layer) for layer in analysis.layers]
    ranked = [(load, layer) for load, layer in loads if load.share is not None]
    # the highest share; on a tie the lower layer (listed later), where the limit physically is
    limit = max(reversed(ranked), key=lambda pair: pair[0].share or 0.0, default=None)
    if target is None and not any(load.measured_bytes_per_second for load, _ in loads):
        limit, text = None, "no figures measured for the target"
    elif limit is None:
        text = "no layer with a known ceiling"
    elif not limit[0].share:
        limit, text = None, "no I/O measured across a layer with a known ceiling"
    else:
        text = summary(*limit)
    return Bottleneck(step=step, device=analysis.device, layers=[load for load, _ in loads],
                      limit=limit[0] if limit is not None else None, summary=text,
                      saturated=saturation(stats))


def judged(result: BenchmarkResult, topology: Topology, analysis: DeviceAnalysis | None) -> BenchmarkResult:
    """A copy of ``result`` with its verdict: a bottleneck per step (over the step's successful
    repeats, averaged: the same runs the summaries average, so the verdict speaks of the figures
    shown beside it), the slow members across every successful step run, and the path balance
    over the whole run. ``analysis`` is the target's layer model (None: no bottlenecks)."""
    done = [r for r in result.runs if r.state == "done" and r.devices]
    bottlenecks = []
    if analysis is not None:
        for step in dict.fromkeys(r.step for r in done):
            stats = [d for r in done if r.step == step for d in r.devices]
            bottlenecks.append(bottleneck(analysis, step, stats))
    return result.model_copy(update={
        "bottlenecks": bottlenecks,
        "slow_members": slow_members([r.devices for r in done]),
        "balance": balance(topology, [d for r in done for d in r.devices]),
    })


#: Saturated devices listed per step before the rest is counted.
SHOWN_SATURATED = 8


def lines(bottlenecks: Sequence[Bottleneck], slow: Sequence[SlowMember],
          shares: Sequence[PathShare]) -> list[tuple[str, str]]:
    """The verdict in words, each line with a style ("", "yellow", "red"), for every surface
    that shows a result: bench show, the agent's bench output, the experiment's winner."""
    out: list[tuple[str, str]] = []
    for b in bottlenecks:
        share = b.limit.share if b.limit is not None else None
        out.append((f"{b.step}: limit {b.summary}" if b.limit is not None else f"{b.step}: {b.summary}",
                    "yellow" if share is not None and share >= UTIL_FULL / 100 else ""))
        for sat in b.saturated[:SHOWN_SATURATED]:
            out.append((f"  saturated {sat.device}: {', '.join(sat.reasons)}", ""))
        if len(b.saturated) > SHOWN_SATURATED:
            out.append((f"  ... {len(b.saturated) - SHOWN_SATURATED} more saturated device(s)", ""))
    for m in slow:
        out.append((f"slow member of {m.group}: {m.message}", "red"))
    for s in unbalanced(shares):
        where = "port" if s.group == PORTS else f"path of {s.group}"
        via = f" via {s.port}" if s.port and s.port != s.path else ""
        state = "idle" if s.idle else f"{100 * s.share:.0f} % of the I/O"
        out.append((f"{where} {s.path}{via}: {state} against an even {100 * s.even_share:.0f} %",
                    "red" if s.idle else "yellow"))
    return out
