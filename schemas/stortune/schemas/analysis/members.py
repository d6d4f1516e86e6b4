"""Slow members and path balance: what holds up across benchmark runs, not one sample.

``slow_members`` compares each array member (md, LVM PV) and each multipath path with its
peers (the devices right under the same array or LUN) run by run, and names only a member
that stands out in most runs: one slow sample is a spike, not a slow drive. ``balance`` says
how a multipath LUN's I/O spread over its paths and over the HBA ports beneath them, counting
a path that carried nothing (the case a per-run "slowest" mark cannot show: it compares busy
members only).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from stortune.schemas.analysis.model import PathShare, SlowMember
from stortune.schemas.bench.results import STANDOUT, DeviceStats
from stortune.schemas.topology import Topology

#: Relations whose devices work side by side under one array or LUN (sampler's ``relation``).
PEER_RELATIONS = frozenset({"md-member", "lvm-pv", "mpath-path"})
#: A member is persistently slow when it stands out in at least this share of the runs ...
PERSISTENT_SHARE = (2, 3)
#: ... and there were at least this many runs to judge from.
MIN_RUNS = 3
#: group name of the per-HBA-port rows of ``balance``
PORTS = "ports"


def finite(value: float | None) -> float | None:
    """The value, or None when absent, NaN or infinite (hand-made or corrupt figures)."""
    return value if value is not None and math.isfinite(value) else None


def medians_of_the_others(values: Sequence[float]) -> list[float | None]:
    """For each value, the median of all the other values (None when there are none).

    One sort, then each median by index: the median of the list without its i-th element
    (at sorted position p) is read off the sorted list skipping p. Taking the median of the
    peers' list member by member was quadratic: 4,000 members of one array took 2 s, the
    100,000 an agent may send, minutes.
    """
    n = len(values)
    if n < 2:
        return [None] * n
    order = sorted(range(n), key=values.__getitem__)
    ranked = [values[i] for i in order]
    m = n - 1

    def kth(k: int, skip: int) -> float:  # k-th smallest of the sorted list without position skip
        return ranked[k] if k < skip else ranked[k + 1]

    out: list[float | None] = [None] * n
    for position, index in enumerate(order):
        if m % 2:
            out[index] = kth(m // 2, position)
        else:
            out[index] = (kth(m // 2 - 1, position) + kth(m // 2, position)) / 2
    return out


def _load(s: DeviceStats, metric: str) -> float | None:
    if s.read_ios + s.write_ios <= 0:
        return None  # no completed I/O: its await is undefined and its util says nothing
    value = finite(s.await_ms if metric == "await" else s.util_percent)
    return value if value is not None and value >= 0 else None


@dataclass
class _Record:
    group: str
    member: str
    metric: str = "await"
    ratios: list[float] = field(default_factory=list)
    slow: int = 0
    peers: int = 0


def _run_ratios(run: Iterable[DeviceStats]) -> list[tuple[str, str, str, float, int]]:
    """(group, member, metric, ratio to its peers' median, peers) for one run's members."""
    groups: dict[tuple[str, str], dict[str, DeviceStats]] = {}
    for s in run:
        if s.relation in PEER_RELATIONS and s.above:
            groups.setdefault((s.above, s.relation), {})[s.device] = s
    out = []
    for (group, _), members in sorted(groups.items()):
        # await when every busy member has one (always, given I/O), else utilisation
        for metric in ("await", "util"):
            loads = {name: _load(s, metric) for name, s in members.items()}
            known = {name: v for name, v in loads.items() if v is not None}
            if len(known) >= 2:
                break
        else:
            continue
        names = sorted(known)
        others = medians_of_the_others([known[name] for name in names])
        for name, median in zip(names, others, strict=True):
            value = known[name]
            if median is None or median <= 0:
                continue  # peers answering in under a millisecond: no ratio to speak of
            out.append((group, name, metric, value / median, len(members) - 1))
    return out


def slow_members(runs: Sequence[Sequence[DeviceStats]]) -> list[SlowMember]:
    """Members slower than their peers' median by results.STANDOUT in at least 2/3 of the
    runs that measured them, with at least MIN_RUNS such runs; slowest first."""
    records: dict[tuple[str, str], _Record] = {}
    for run in runs:
        for group, member, metric, ratio, peers in _run_ratios(run):
            rec = records.setdefault((group, member), _Record(group, member))
            rec.ratios.append(ratio)
            rec.metric = metric
            rec.slow += ratio >= STANDOUT
            rec.peers = max(rec.peers, peers)
    out = []
    share, of = PERSISTENT_SHARE
    for rec in records.values():
        n = len(rec.ratios)
        if n < MIN_RUNS or rec.slow * of < share * n:
            continue
        ratio = round(statistics.median(rec.ratios), 2)
        whose = f"its {rec.peers} peers'" if rec.peers != 1 else "its peer's"
        out.append(SlowMember(
            group=rec.group, member=rec.member, runs_slow=rec.slow, runs=n, ratio=ratio, peers=rec.peers,
            message=f"{rec.member}: {rec.metric} {ratio:.1f} x {whose} median in {rec.slow} of {n} runs"))
    return sorted(out, key=lambda m: (-m.ratio, m.group, m.member))


def _volume(stats: Iterable[DeviceStats]) -> dict[str, tuple[int, int]]:
    """device -> (bytes, ios), summed when a device appears in several runs."""
    out: dict[str, tuple[int, int]] = {}
    for s in stats:
        b, n = out.get(s.device, (0, 0))
        out[s.device] = (b + max(0, s.read_bytes) + max(0, s.write_bytes),
                         n + max(0, s.read_ios) + max(0, s.write_ios))
    return out


def _shares(group: str, names: Sequence[str], volume: dict[str, tuple[int, int]],
            ports: dict[str, str | None]) -> list[PathShare]:
    figures = [volume.get(n, (0, 0)) for n in names]
    total_bytes = sum(b for b, _ in figures)
    total_ios = sum(n for _, n in figures)
    even = round(1 / len(names), 4)
    out = []
    for name, (b, n) in zip(names, figures, strict=True):
        # bytes say how the volume spread; I/O counts when nothing was counted in bytes
        share = b / total_bytes if total_bytes else (n / total_ios if total_ios else 0.0)
        out.append(PathShare(group=group, path=name, port=ports.get(name), bytes=b, ios=n,
                             share=round(share, 4), even_share=even, idle=n == 0))
    return out


def balance(topology: Topology, stats: Sequence[DeviceStats]) -> list[PathShare]:
    """Per multipath LUN that carried I/O, each path's share of it against an even share
    (idle paths included); then per HBA port (the paths' SCSI hosts) across those LUNs.

    ``stats`` may hold several runs: the figures of a device add up."""
    volume = _volume(stats)
    out: list[PathShare] = []
    port_of: dict[str, str | None] = {}
    for dev in topology.devices:
        if dev.dm is None or dev.dm.type != "multipath":
            continue
        paths = list(dict.fromkeys(dev.dm.paths or dev.slaves))
        if not paths or not any(volume.get(p, (0, 0))[1] for p in paths):
            continue  # a LUN the runs did not touch says nothing about balance
        for p in paths:
            below = topology.device(p)
            port_of[p] = below.scsi_host.name if below is not None and below.scsi_host else None
        out += _shares(dev.name, paths, volume, port_of)
    by_port: dict[str, tuple[int, int]] = {}
    for path, port in port_of.items():
        if port is None:
            continue
        b, n = by_port.get(port, (0, 0))
        pb, pn = volume.get(path, (0, 0))
        by_port[port] = (b + pb, n + pn)
    if len(by_port) >= 2:  # one port: nothing to balance
        names = sorted(by_port)
        out += _shares(PORTS, names, by_port, {n: n for n in names})
    return out


def unbalanced(shares: Sequence[PathShare], *, tolerance: float = 0.5) -> list[PathShare]:
    """Paths (or ports) idle, or off their even share by more than ``tolerance`` of it."""
    return [s for s in shares if s.idle or abs(s.share - s.even_share) > tolerance * s.even_share]
