"""A device's layer model: the chain beneath it, top to bottom, with a ceiling per layer.

Layers come in ``LayerKind`` order: filesystem -> lvm / multipath / dm -> md -> partition
-> disk (the bottom block devices: md member disks, LUN paths, NVMe namespaces, RAID
volumes) -> link (SAS phy, ATA link) -> port (FC port) -> controller -> pci. Each layer
holds its distinct parts (deduplicated by name: two paths through one FC port count that
port once) and its ceiling is the sum of its parts' (members of an array, paths of a LUN,
ports of an HBA work side by side). Unknown is None, never 0: a layer none of whose parts
is known has no ceiling and is never the limit. The device's ceiling is the lowest layer
ceiling; on a tie the deeper layer is named, because that is the hardware that binds.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from stortune.schemas.analysis import ceilings, volumes
from stortune.schemas.analysis.ceilings import Ceiling, mb
from stortune.schemas.analysis.diskclass import drive_class
from stortune.schemas.analysis.model import Check, DeviceAnalysis, Layer, LayerKind, MeasuredCeiling, Part
from stortune.schemas.topology import Device, DeviceKind, Topology

__all__ = ["MAX_DEVICE_WORK", "MAX_HOST_WORK", "Index", "bounded", "device_analysis", "join_names"]

#: Work (edges walked + bottom devices gathered) one device's analysis may take, and a whole
#: host's. A real chain is a few layers over at most md's 1,920 members or a LUN's paths (a
#: 3,276-LUN x 4-path host, 16,380 devices, takes 26,208 in all); past them the stacking is junk an agent
#: uploaded, and the analysis says so instead of growing with its square (the output follows
#: the work: about 40 us of CPU per unit, so a few seconds at most).
MAX_DEVICE_WORK = 16_384
MAX_HOST_WORK = 131_072

_NVME_CTRL = re.compile(r"/nvme/(nvme\d+)/")
_DIGITS = re.compile(r"(\d+)")
_DM_KINDS = {"lvm": LayerKind.LVM, "multipath": LayerKind.MULTIPATH}
#: Random-write penalty (disk I/Os per written block) per md level, as RAID planning counts it.
WRITE_PENALTY = {"raid0": 1, "raid1": 2, "raid10": 2, "raid4": 4, "raid5": 4, "raid6": 6,
                 "raid50": 4, "raid60": 6}
_BOTTOM = (DeviceKind.DISK, DeviceKind.LOOP, DeviceKind.ZRAM)
_NO_MEASURED: Mapping[str, MeasuredCeiling] = {}


@functools.lru_cache(maxsize=65536)  # names repeat across a host's analyses
def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((1, int(c)) if i % 2 else (0, c) for i, c in enumerate(_DIGITS.split(name)) if c)


def join_names(names: Iterable[str]) -> str:
    """sdb / sdb+sdc / sdb..sdf: how the field names a set of devices or ports."""
    ordered = sorted(dict.fromkeys(names), key=_natural)
    if len(ordered) <= 2:
        return "+".join(ordered)
    return f"{ordered[0]}..{ordered[-1]}"


class Index:
    """A topology's devices by name, built once for many analyses (a 1,000-device host)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.by_name: dict[str, Device] = {d.name: d for d in topology.devices}

    @functools.cached_property
    def volumes(self) -> dict[str, volumes.Volume]:
        """The host's controller volumes by device name (inventory looked up once)."""
        return volumes.by_device(self.topology)

    def lower(self, dev: Device) -> list[Device]:
        """The devices ``dev`` is built on: a partition's disk, a stacked device's slaves."""
        names = [dev.parent] if dev.kind is DeviceKind.PARTITION and dev.parent else dev.slaves
        return [self.by_name[n] for n in names if n in self.by_name]


@dataclass
class _PartDraft:
    name: str
    ceiling: Ceiling
    devices: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def part(self) -> Part:
        c = self.ceiling
        return Part(name=self.name, ceiling_bytes_per_second=c.bytes_per_second,
                    ceiling_iops=c.iops, source=c.source, estimate=c.estimate, detail=c.detail,
                    devices=sorted(self.devices, key=_natural) if len(self.devices) > 1
                    else list(self.devices))


@dataclass
class _LayerDraft:
    kind: LayerKind
    parts: dict[str, _PartDraft] = field(default_factory=dict)
    label: str = ""  # what follows the part names: "qla2xxx", "raid5"
    slots: dict[str, str] = field(default_factory=dict)  # PCI slot -> the part named for it

    def add(self, name: str, bottom: str | None, make: Ceiling | None) -> None:
        draft = self.parts.get(name)
        if draft is None:
            draft = self.parts[name] = _PartDraft(name, make or Ceiling(None, "unknown"))
        if bottom is not None and bottom not in draft.seen:
            draft.seen.add(bottom)  # a set beside the list: one port under 16k disks stays linear
            draft.devices.append(bottom)


def _layer_kind(dev: Device) -> LayerKind:
    if dev.kind is DeviceKind.MD:
        return LayerKind.MD
    if dev.kind is DeviceKind.PARTITION:
        return LayerKind.PARTITION
    if dev.kind is DeviceKind.DM:
        return _DM_KINDS.get(dev.dm.type if dev.dm else "other", LayerKind.DM)
    return LayerKind.DISK


class TooComplex(Exception):
    """A device's chain costs more than the work allowed: junk stacking, not a host."""


def _chain(index: Index, top: Device, budget: int) -> tuple[list[Device], dict[str, list[str]], int]:
    """Every device in ``top``'s chain (itself first), the bottom devices under each, and the
    work it took (edges walked + bottom names gathered: what the analysis' size follows).

    Iterative (a stack of any depth) and each device walked once; a device already on the
    way down is skipped (a cycle is junk). TooComplex past ``budget`` units of work."""
    order: list[Device] = [top]
    bottoms: dict[str, list[str]] = {}
    gathered: dict[str, dict[str, None]] = {top.name: {}}
    def below(dev: Device) -> Iterator[Device]:
        return iter(() if dev.kind in _BOTTOM else index.lower(dev))  # a bottom's lower: not walked

    stack: list[tuple[Device, Iterator[Device]]] = [(top, below(top))]
    work = 0
    while stack:
        dev, lower = stack[-1]
        child = next(lower, None)
        if child is None:
            stack.pop()
            found = [dev.name] if dev.kind in _BOTTOM else list(gathered.pop(dev.name))
            bottoms[dev.name] = found
            if stack:
                gathered[stack[-1][0].name].update(dict.fromkeys(found))
                work += len(found)
            continue
        work += 1
        if work > budget:
            raise TooComplex(top.name)
        if child.name in gathered:
            continue  # on the way down: a cycle
        done = bottoms.get(child.name)
        if done is not None:
            gathered[dev.name].update(dict.fromkeys(done))
            work += len(done)
            continue
        order.append(child)
        gathered[child.name] = {}
        stack.append((child, below(child)))
    return order, bottoms, work


def _sum(parts: list[Part]) -> tuple[float | None, float | None, bool, str]:
    """A layer's ceiling from its parts: the sum of those known, and how it was reached."""
    known = [p for p in parts if p.ceiling_bytes_per_second is not None]
    if not known:
        if len(parts) == 1:
            return None, None, False, parts[0].source
        return None, None, False, f"{len(parts)} parts, none with a known ceiling: {parts[0].source}"
    total = sum(p.ceiling_bytes_per_second or 0.0 for p in known)
    iops_known = [p.ceiling_iops for p in known if p.ceiling_iops is not None]
    iops = sum(iops_known) if iops_known else None
    estimate = any(p.estimate for p in known)
    if len(parts) == 1:
        return total, iops, estimate, parts[0].source
    first = known[0]
    if all(p.ceiling_bytes_per_second == first.ceiling_bytes_per_second and p.detail == first.detail
           for p in known):
        what = f" ({first.detail})" if first.detail else ""
        source = f"{len(known)} x {mb(first.ceiling_bytes_per_second or 0.0)}{what} = {mb(total)}"
    else:
        source = "sum of " + " + ".join(mb(p.ceiling_bytes_per_second or 0.0) for p in known) \
                 + f" = {mb(total)}"
    unknown = len(parts) - len(known)
    if unknown:
        source += f"; {unknown} of {len(parts)} parts unknown, not counted"
    return total, iops, estimate, source


def _md_ceiling(dev: Device, members: list[str], disks: dict[str, _PartDraft]) -> Ceiling:
    level = dev.md.level if dev.md else None
    return _array_ceiling(level or "md", level, [disks[m].ceiling for m in members if m in disks],
                          len(members), "members")


def _array_ceiling(what: str, level: str | None, figures: list[Ceiling], count: int,
                   noun: str) -> Ceiling:
    """An array's read ceiling, the sum of its ``count`` members' (md members, or the drives
    behind a controller volume), with the random-write penalty of its level noted."""
    known = [c for c in figures if c.bytes_per_second is not None]
    penalty = WRITE_PENALTY.get(level or "")
    note = f"; random writes pay {level}'s penalty of {penalty}" if penalty and penalty > 1 else ""
    if not known:
        return Ceiling(None, f"{what} over {count} {noun} of unknown ceiling{note}")
    total = sum(c.bytes_per_second or 0.0 for c in known)
    iops_known = [c.iops for c in known if c.iops is not None]
    missing = count - len(known)
    return Ceiling(
        total, f"{what} reads: the sum of {len(known)} {noun} = {mb(total)}{note}"
               + (f"; {missing} {noun} unknown, not counted" if missing else ""),
        iops=sum(iops_known) if iops_known else None, estimate=any(c.estimate for c in known),
        detail=level)


def _volume_ceiling(dev: Device, found: volumes.Volume | None) -> Ceiling | None:
    """A controller volume not probed: the sum of its physical drives' class ceilings, as an
    md array's is of its members' (an estimate); None when it is no mapped volume."""
    if found is None or found.drives is None:
        return None
    cls = drive_class(dev, found.media)
    drive = (Ceiling(None, "unknown") if cls is None else
             Ceiling(cls.bytes_per_second, cls.name, iops=cls.iops, estimate=True))
    made = _array_ceiling(f"{found.summary()}: {found.level or found.ref.raid_level}", found.level,
                          [drive] * found.drives, found.drives,
                          f"drives ({cls.name}, estimate)" if cls is not None else "drives")
    if found.level is None:
        made = replace(made, source=made.source + f"; level {found.ref.raid_level!r} not modelled:"
                                                  " write penalty not judged")
    return made if cls is not None else replace(made, source=made.source + ": unknown until measured"
                                                                           " (stortune probe)")


def _disk_ceiling(dev: Device, measured: Mapping[str, MeasuredCeiling],
                  volume: volumes.Volume | None = None) -> Ceiling:
    """Measured by a probe first; else a controller volume's drives, else the device class,
    marked as an estimate."""
    probe = measured.get(dev.name)
    found = ceilings.measured(probe) if probe is not None else None
    if found is not None:
        return found
    return _volume_ceiling(dev, volume) or ceilings.disk(dev)


def _stacked_part(dev: Device) -> Ceiling:
    if dev.kind is DeviceKind.PARTITION:
        return Ceiling(None, f"partition of {dev.parent or '?'}: no ceiling of its own")
    kind = dev.dm.type if dev.dm else "dm"
    label = f"{dev.name} ({dev.dm.name})" if dev.dm and dev.dm.name else dev.name
    return Ceiling(None, f"{kind} {label}: no ceiling of its own; the layers below carry it")


def bounded(dev: Device, why: str) -> DeviceAnalysis:
    """A device whose chain was not analysed: no layers, and a check saying why."""
    return DeviceAnalysis(device=dev.name, kind=dev.kind.value, checks=[Check(
        severity="warning", code="analysis-bounded", device=dev.name, message=why)])


def device_analysis(topology: Topology | Index, name: str,
                    measured: Mapping[str, MeasuredCeiling] = _NO_MEASURED,
                    budget: int = MAX_DEVICE_WORK) -> DeviceAnalysis:
    """The layer model of device ``name`` (KeyError when the topology has no such device).

    ``measured``: probe figures by device name; a disk's measured ceiling replaces its class
    estimate. A chain costing more than ``budget`` work is not analysed (``bounded``)."""
    return device_analysis_work(topology, name, measured, budget)[0]


def device_analysis_work(topology: Topology | Index, name: str,
                         measured: Mapping[str, MeasuredCeiling] = _NO_MEASURED,
                         budget: int = MAX_DEVICE_WORK) -> tuple[DeviceAnalysis, int]:
    """``device_analysis`` and the work it took (``budget`` when it was bounded)."""
    index = topology if isinstance(topology, Index) else Index(topology)
    top = index.by_name[name]
    try:
        order, bottoms, work = _chain(index, top, budget)
    except TooComplex:
        return bounded(top, f"{name}'s stack of devices (slaves, partitions) takes more than"
                            f" {budget:,} steps to walk: no real host stacks so; not analysed"), budget
    drafts: dict[LayerKind, _LayerDraft] = {}

    def layer(kind: LayerKind) -> _LayerDraft:
        return drafts.setdefault(kind, _LayerDraft(kind))

    disks = layer(LayerKind.DISK) if any(bottoms.values()) else None
    for dev in order:
        if dev.kind in _BOTTOM and disks is not None:
            disks.add(dev.name, dev.name, _disk_ceiling(dev, measured, index.volumes.get(dev.name)))
    for dev in order:
        kind = _layer_kind(dev)
        if kind is LayerKind.DISK:
            continue
        under = bottoms.get(dev.name, [])
        if kind is LayerKind.MD:
            made = _md_ceiling(dev, under, disks.parts if disks else {})
            draft = layer(kind)
            draft.label = " ".join(dict.fromkeys(filter(None, [draft.label, made.detail])))
        else:
            made = _stacked_part(dev)
            draft = layer(kind)
            if kind in (LayerKind.LVM, LayerKind.MULTIPATH) and dev.dm and dev.dm.name:
                draft.label = dev.dm.name if not draft.label else draft.label
        draft.add(dev.name, None, made)
        part = draft.parts[dev.name]
        part.devices, part.seen = list(under), set(under)
    for dev in order:
        if dev.kind in _BOTTOM:
            _hardware(dev, layer)
    layers = [_layer(top, drafts[kind]) for kind in LayerKind if kind in drafts]
    if top.mounts:
        parts = [Part(name=m.mountpoint, source=f"{m.fstype} on {m.source}: no ceiling of its own",
                      devices=sorted(bottoms.get(top.name, []), key=_natural)) for m in top.mounts]
        layers.insert(0, Layer(name=", ".join(f"{m.mountpoint} {m.fstype}" for m in top.mounts),
                               kind=LayerKind.FILESYSTEM, source=parts[0].source, parts=parts))
    limit: Layer | None = None
    for candidate in layers:  # top to bottom: a tie names the deeper layer
        c = candidate.ceiling_bytes_per_second
        if c is not None and (limit is None or c <= (limit.ceiling_bytes_per_second or 0.0)):
            limit = candidate
    found = index.volumes.get(top.name)
    return DeviceAnalysis(device=top.name, kind=top.kind.value, layers=layers,
                          volume=found.summary() if found is not None else None,
                          ceiling_bytes_per_second=None if limit is None else limit.ceiling_bytes_per_second,
                          limit=None if limit is None else limit.name), work


def _hardware(dev: Device, layer: Callable[[LayerKind], _LayerDraft]) -> None:
    """The link, FC port, controller and PCIe link a bottom device's I/O crosses."""
    if dev.link_kind is not None and dev.link_name:
        made = (ceilings.sas_phy(dev.link_rate, dev.link_name) if dev.link_kind == "sas-phy"
                else ceilings.ata_link(dev.link_rate, dev.link_name))
        attr = "negotiated_linkrate" if dev.link_kind == "sas-phy" else "sata_spd"
        fallback = Ceiling(None, f"{dev.link_name} {attr} {dev.link_rate or 'unreadable'}: unknown")
        layer(LayerKind.LINK).add(dev.link_name, dev.name, made or fallback)
    host = dev.scsi_host
    pci = host.pci if host is not None else dev.pci
    if host is not None:
        if host.fc_speed is not None or host.fc_port_name is not None:
            made = ceilings.fc_port(host.fc_speed, host.name, host.fc_port_state)
            fallback = Ceiling(None, f"fc_host/{host.name}/speed {host.fc_speed or 'unreadable'},"
                                     f" port_state {host.fc_port_state or '?'}: unknown")
            port = layer(LayerKind.PORT)
            port.add(host.name, dev.name, made or fallback)
            port.label = port.label or host.driver or ""
        ctrl = layer(LayerKind.CONTROLLER)
        ctrl.add(host.name, dev.name, Ceiling(
            None, f"SCSI host {host.name} ({host.driver or 'driver unknown'}): no ceiling of its"
                  " own; its links, ports and PCIe link carry it"))
        ctrl.label = ctrl.label or host.driver or ""
    elif dev.transport == "nvme" and dev.sysfs_path:
        m = _NVME_CTRL.search(f"/{dev.sysfs_path}")
        if m:
            ctrl = layer(LayerKind.CONTROLLER)
            ctrl.add(m.group(1), dev.name, Ceiling(
                None, f"NVMe controller {m.group(1)}: no ceiling of its own; its PCIe link carries it"))
            ctrl.label = ctrl.label or "nvme"
    if pci is not None:
        made = ceilings.pcie(pci)
        width = "absent" if pci.current_link_width is None else pci.current_link_width
        fallback = Ceiling(None, f"{pci.address}: no PCIe link shown (current_link_speed"
                                 f" {pci.current_link_speed or 'absent'}, width {width})")
        # The functions of one card (a dual-port HBA's 04:00.0 and 04:00.1) share its one
        # link, each showing it: one part per slot (domain:bus:device), not per function.
        slot = pci.address.rsplit(".", 1)[0]
        links = layer(LayerKind.PCI)
        name = links.slots.setdefault(slot, pci.address)
        links.add(name, dev.name, made or fallback)


def _layer(top: Device, draft: _LayerDraft) -> Layer:
    drafts = list(draft.parts.values())
    if len(drafts) > 1:
        drafts.sort(key=lambda d: _natural(d.name))
    parts = [d.part() for d in drafts]
    total, iops, estimate, source = _sum(parts)
    name = join_names(p.name for p in parts)
    if draft.label:
        name = f"{name} {draft.label}"
    return Layer(name=name, kind=draft.kind, ceiling_bytes_per_second=total, ceiling_iops=iops,
                 source=source, estimate=estimate, parts=parts)
