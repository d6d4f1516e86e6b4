"""Which Linux block device is which hardware RAID virtual drive: pure, no I/O.

A vendor tool lists virtual drives; sysfs lists disks. Three kinds of evidence tie them, tried
in this order for each virtual drive:

1. ``wwn``: the NAA id the tool prints (storcli ``SCSI NAA Id``, ssacli/arcconf ``Unique
   Identifier``) equals the disk's VPD page 0x83 designator (sysfs ``wwid``: ``naa.6...``).
   A WWN is unique by design, so it needs no other check, but one that two disks (or two
   virtual drives) share proves nothing and maps nothing.
2. ``target-id`` (MegaRAID/PERC only): megaraid_sas puts logical drives on the SCSI channels
   from ``MEGASAS_MAX_PD_CHANNELS`` (2) up, 128 targets each, LUN 0 (``MEGASAS_IS_LOGICAL``,
   ``MEGASAS_DEV_INDEX`` in drivers/scsi/megaraid/megaraid_sas.h): VD ``n`` is
   ``H:(2 + n // 128):(n % 128):0``. That holds only on the controller's own SCSI host, so the
   host must be told apart: by the controller's PCI address, or because there is exactly one
   megaraid_sas controller and one megaraid_sas host. Anything else is a warning, not a guess.
3. ``tool``: the ``/dev`` name the tool itself prints (arcconf, ssacli ``Disk Name``), taken only
   when that whole disk exists and sits behind a SCSI host run by the adapter's driver: a tool
   (or a stale answer) naming a partition, a path, or another controller's disk maps nothing.

One virtual drive maps to at most one disk and one disk to at most one virtual drive; every
conflict is a warning and leaves both out. All of it runs in time linear in devices plus
virtual drives: indexes are built once, never searched per drive.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from stortune.schemas.controllers import (
    AdapterName,
    Controller,
    ControllerInventory,
    MappedBy,
    VirtualDrive,
    VolumeRef,
    normalise_raid_level,
)
from stortune.schemas.topology import Device, DeviceKind, Topology, TunableState, is_device_name

#: megaraid_sas: logical drives start at this SCSI channel, ``MEGASAS_MAX_DEV_PER_CHANNEL`` each
MEGARAID_LD_CHANNEL = 2
MEGARAID_DEV_PER_CHANNEL = 128
#: megaraid_sas has two logical drive channels: ids beyond them cannot be addressed
MEGARAID_MAX_LD_IDS = 2 * MEGARAID_DEV_PER_CHANNEL

#: The kernel drivers that run each adapter's controllers (scsi_host ``proc_name``)
ADAPTER_DRIVERS: dict[AdapterName, frozenset[str]] = {
    "megaraid": frozenset({"megaraid_sas"}),
    "perc": frozenset({"megaraid_sas"}),
    # Adaptec Series 6/7/8 and ServeRAID 8: aacraid; SmartRAID 3100 (also run by arcconf): smartpqi
    "arcconf": frozenset({"aacraid", "smartpqi"}),
    # hpsa (P4xx..P8xx), smartpqi (Gen10 P408i ...), cciss (before 2.6.33 / RHEL 5-6)
    "smartarray": frozenset({"hpsa", "smartpqi", "cciss"}),
}
#: One warning line lists at most this many virtual drive ids, then "and N more"
_LIST_MAX = 16
#: ``Device.tunables``' bound (schemas/topology.py)
_MAX_TUNABLES = 256
_HEX = re.compile(r"^[0-9a-f]+$")

#: ``stortune.schemas.controllertunables.states``: a virtual drive's controller tunables
StatesFn = Callable[[Controller, VirtualDrive], Mapping[str, TunableState]]


def normalise_wwn(text: str | None) -> str | None:
    """An NAA id in one spelling: lower case, no ``naa.`` / ``0x`` prefix, no blanks.

    sysfs prints ``naa.600605b0...``, storcli ``600605b0...``, ssacli upper case, some tools
    ``0x5000...``. Other designator types (``t10.``, ``eui.``) keep their prefix, so they never
    equal a bare NAA id. None for text that identifies nothing: empty, all zeros (what a
    controller prints for an id it does not have) or shorter than the shortest NAA id (8 bytes
    would be 16 digits; 8 digits leaves room for tools that print less, and still refuses
    ``0``, ``-`` or ``N/A``)."""
    if text is None:
        return None
    value = "".join(text.split()).lower()
    for prefix in ("naa.", "0x"):
        if value.startswith(prefix):
            value = value[len(prefix):]
            break
    if len(value) < 8 or (_HEX.match(value) and not value.strip("0")):
        return None
    return value


def normalise_pci(text: str | None) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) from the spellings tools and sysfs use, else None.

    sysfs: ``0000:3b:00.0``; ssacli: ``0000:5C:00.0``; storcli: ``00:3b:00:00`` (domain, bus,
    device, function, colon separated); three parts (``3b:00.0``) are domain 0. All hex."""
    if not text:
        return None
    parts = re.split(r"[:.]", text.strip().lower())
    if len(parts) == 3:
        parts = ["0", *parts]
    if len(parts) != 4 or not all(p and len(p) <= 4 and _HEX.match(p) for p in parts):
        return None
    domain, bus, dev, fn = (int(p, 16) for p in parts)
    if bus > 0xFF or dev > 0x1F or fn > 0x7:
        return None
    return domain, bus, dev, fn


def _pci_text(address: tuple[int, int, int, int]) -> str:
    domain, bus, dev, fn = address
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def physical_drive_count(vd: VirtualDrive) -> int | None:
    """Drives behind the volume, all spans: the listed slots, else the tool's count (every
    adapter already counts all spans: storcli's drives per span x span depth)."""
    return len(vd.drives) or vd.drive_count


def _listed(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:_LIST_MAX])
    return shown if len(ids) <= _LIST_MAX else f"{shown} and {len(ids) - _LIST_MAX} more"


def _label(c: Controller) -> str:
    return f"{c.adapter} controller {c.index}"


def _host_driver(dev: Device) -> str | None:
    return dev.scsi_host.driver if dev.scsi_host is not None else None


@dataclass
class _Index:
    """The disks, looked up three ways, built once."""

    by_name: dict[str, Device]
    by_wwn: dict[str, list[Device]]
    #: (SCSI host name, "C:T:L") -> disks at that address
    by_address: dict[tuple[str, str], list[Device]]
    #: driver -> SCSI host name -> (PCI address of the host's function, parsed, or None)
    hosts: dict[str, dict[str, tuple[int, int, int, int] | None]]

    @classmethod
    def build(cls, devices: Iterable[Device]) -> _Index:
        by_name: dict[str, Device] = {}
        by_wwn: dict[str, list[Device]] = defaultdict(list)
        by_address: dict[tuple[str, str], list[Device]] = defaultdict(list)
        hosts: dict[str, dict[str, tuple[int, int, int, int] | None]] = defaultdict(dict)
        for dev in devices:
            if dev.kind is not DeviceKind.DISK:
                by_name.setdefault(dev.name, dev)  # known, so "names a partition" can be said
                continue
            by_name[dev.name] = dev
            wwn = normalise_wwn(dev.wwn)
            if wwn is not None:
                by_wwn[wwn].append(dev)
            host = dev.scsi_host
            if host is not None and host.driver:
                hosts[host.driver][host.name] = normalise_pci(host.pci.address if host.pci else None)
                if dev.scsi_address:
                    ctl = dev.scsi_address.split(":", 1)[-1]
                    by_address[(host.name, ctl)].append(dev)
        return cls(by_name, dict(by_wwn), dict(by_address), dict(hosts))


@dataclass
class _Claim:
    controller: Controller
    vd: VirtualDrive
    dev: Device
    by: MappedBy


class _Mapper:
    def __init__(self, inventory: ControllerInventory, devices: Iterable[Device]) -> None:
        self.inventory = inventory
        self.index = _Index.build(devices)
        self.warnings: list[str] = []
        # WWNs two virtual drives both report: evidence for neither
        seen: dict[str, int] = defaultdict(int)
        for c in inventory.controllers:
            for vd in c.virtual_drives:
                wwn = normalise_wwn(vd.wwn)
                if wwn is not None:
                    seen[wwn] += 1
        self.shared_wwns = {wwn for wwn, n in seen.items() if n > 1}
        family = [c for c in inventory.controllers if c.adapter in ("megaraid", "perc")]
        unread = any(e.adapter in ("megaraid", "perc") for e in inventory.errors)
        # a lone megaraid_sas host is this controller's only when no other card could own it
        self.sole_megaraid = len(family) == 1 and not unread

    def controllers(self) -> list[Controller]:
        """The controllers a reference can name without doubt: (adapter, index) once each."""
        count: dict[tuple[str, int], int] = defaultdict(int)
        for c in self.inventory.controllers:
            count[(c.adapter, c.index)] += 1
        out = []
        for c in self.inventory.controllers:
            if count[(c.adapter, c.index)] > 1:
                self.warnings.append(f"{_label(c)}: the tool lists two controllers with this index;"
                                     " neither is mapped")
            else:
                out.append(c)
        return out

    def run(self) -> dict[str, VolumeRef]:
        claims: list[_Claim] = []
        for c in self.controllers():
            host = self.megaraid_host(c) if c.adapter in ("megaraid", "perc") else None
            unmapped: list[int] = []
            ids: dict[int, int] = defaultdict(int)
            for vd in c.virtual_drives:
                ids[vd.id] += 1
            twice = sorted(i for i, n in ids.items() if n > 1)
            if twice:
                self.warnings.append(f"{_label(c)}: virtual drive id(s) {_listed(twice)} listed"
                                     " more than once; not mapped")
            for vd in c.virtual_drives:
                if ids[vd.id] > 1:
                    continue
                claim = self.evidence(c, vd, host)
                if claim is None:
                    unmapped.append(vd.id)
                else:
                    claims.append(claim)
            if unmapped:
                self.warnings.append(
                    f"{_label(c)}: virtual drive(s) {_listed(unmapped)} match no block device"
                    " (no WWN, SCSI address or disk name the tool prints leads to exactly one"
                    " disk); their controller settings are not managed")
        return self.resolve(claims)

    def evidence(self, c: Controller, vd: VirtualDrive, host: str | None) -> _Claim | None:
        where = f"{_label(c)} virtual drive {vd.id}"
        wwn = normalise_wwn(vd.wwn)
        if wwn is not None:
            if wwn in self.shared_wwns:
                self.warnings.append(f"{where}: WWN {wwn} is reported for more than one virtual"
                                     " drive; not used to map")
            else:
                found = self.index.by_wwn.get(wwn, [])
                if len(found) == 1:
                    return _Claim(c, vd, found[0], "wwn")
                if found:
                    names = ", ".join(sorted(d.name for d in found))
                    self.warnings.append(f"{where}: WWN {wwn} is on {len(found)} disks ({names});"
                                         " not used to map (multipath? map it by hand)")
        if host is not None and vd.id < MEGARAID_MAX_LD_IDS:
            ctl = (f"{MEGARAID_LD_CHANNEL + vd.id // MEGARAID_DEV_PER_CHANNEL}:"
                   f"{vd.id % MEGARAID_DEV_PER_CHANNEL}:0")
            found = self.index.by_address.get((host, ctl), [])
            if len(found) == 1:
                return _Claim(c, vd, found[0], "target-id")
            if found:
                self.warnings.append(f"{where}: {len(found)} disks claim SCSI address {host}"
                                     f" {ctl}; not mapped")
        if vd.block_device is not None:
            dev = self.tool_disk(c, vd.block_device, where)
            if dev is not None:
                return _Claim(c, vd, dev, "tool")
        return None

    def tool_disk(self, c: Controller, path: str, where: str) -> Device | None:
        # /dev/cciss/c0d0 is sysfs' cciss!c0d0; nothing else may hold a '/' or a dot-dot
        rel = path.removeprefix("/dev/")
        name = rel.replace("/", "!") if rel.startswith("cciss/") and rel.count("/") == 1 else rel
        if rel == path or not is_device_name(name):
            self.warnings.append(f"{where}: the tool names {path[:80]!r}, not a /dev disk; not mapped")
            return None
        dev = self.index.by_name.get(name)
        if dev is None:
            self.warnings.append(f"{where}: the tool names {path}, which this host does not have;"
                                 " not mapped")
            return None
        if dev.kind is not DeviceKind.DISK:
            self.warnings.append(f"{where}: the tool names {path}, a {dev.kind.value}, not a whole"
                                 " disk; not mapped")
            return None
        drivers = ADAPTER_DRIVERS[c.adapter]
        if c.driver in drivers:
            drivers = frozenset({c.driver})
        seen = _host_driver(dev)
        if seen not in drivers:
            self.warnings.append(
                f"{where}: the tool names {path}, but {dev.name} sits behind"
                f" {'driver ' + seen if seen else 'no SCSI host driver'}, not {sorted(drivers)};"
                " not mapped")
            return None
        return dev

    def megaraid_host(self, c: Controller) -> str | None:
        """The SCSI host of a megaraid_sas controller, when it can be told apart; else None."""
        driver = c.driver if c.driver else "megaraid_sas"
        hosts = self.index.hosts.get(driver, {})
        if not hosts or not c.virtual_drives:
            return None
        pci = normalise_pci(c.pci_address)
        if pci is not None:
            match = [name for name, address in hosts.items() if address == pci]
            if len(match) == 1:
                return match[0]
            if len(match) > 1:
                self.warnings.append(f"{_label(c)}: SCSI hosts {', '.join(sorted(match))} share"
                                     f" its PCI address {c.pci_address}; target ids not used")
                return None
            if all(address is not None for address in hosts.values()):
                seen = ", ".join(f"{name} at {_pci_text(address)}"
                                 for name, address in sorted(hosts.items()) if address)
                self.warnings.append(f"{_label(c)}: its PCI address {c.pci_address} is none of the"
                                     f" {driver} SCSI hosts' ({seen}); target ids not used")
                return None
        if self.sole_megaraid and len(hosts) == 1:
            return next(iter(hosts))
        self.warnings.append(
            f"{_label(c)}: cannot tell which of the {driver} SCSI hosts"
            f" ({', '.join(sorted(hosts))}) is this controller"
            f" (PCI address {c.pci_address or 'not reported by the tool'}); target ids not used")
        return None

    def resolve(self, claims: list[_Claim]) -> dict[str, VolumeRef]:
        by_dev: dict[str, list[_Claim]] = defaultdict(list)
        for claim in claims:
            by_dev[claim.dev.name].append(claim)
        refs: dict[str, VolumeRef] = {}
        for name, mine in by_dev.items():
            if len(mine) > 1:
                who = "; ".join(f"{_label(x.controller)} virtual drive {x.vd.id} (by {x.by})"
                                for x in mine)
                self.warnings.append(f"{name}: claimed by {len(mine)} virtual drives ({who});"
                                     " none mapped")
                continue
            refs[name] = volume_ref(mine[0].controller, mine[0].vd, mine[0].by, mine[0].dev)
        return refs


def volume_ref(c: Controller, vd: VirtualDrive, by: MappedBy, dev: Device | None = None) -> VolumeRef:
    """The facts a device carries once mapped to ``vd``; raid level in the profile's words."""
    return VolumeRef(
        adapter=c.adapter, controller=c.index, virtual_drive=vd.id, mapped_by=by, model=c.model,
        # the tool's word for its driver; else the one sysfs shows running the disk's host
        driver=c.driver or (_host_driver(dev) if dev is not None else None),
        firmware_version=c.firmware_version, raid_level=normalise_raid_level(vd.raid_level),
        strip_size_bytes=vd.strip_size_bytes, physical_drives=physical_drive_count(vd),
        backup=c.backup,
    )


def volume_refs(inventory: ControllerInventory,
                devices: Iterable[Device]) -> tuple[dict[str, VolumeRef], list[str]]:
    """Device name -> the virtual drive it is, and what could not be mapped, in words.

    Pass every device of the host, even to look one up: the checks that make a mapping safe
    (no other disk has this WWN, no other megaraid_sas host could be this controller's) see
    only the devices given."""
    mapper = _Mapper(inventory, devices)
    refs = mapper.run()
    return refs, mapper.warnings


def attach_controllers(topology: Topology, inventory: ControllerInventory,
                       states: StatesFn | None = None) -> None:
    """Fill a freshly discovered ``topology`` in place: ``Device.controller`` of each mapped
    disk, its controller tunables (``states(controller, vd)``) merged into ``Device.tunables``,
    ``Topology.controllers`` and the mapping's warnings.

    ``states`` is ``stortune.schemas.controllertunables.states``, passed in so this module
    depends on no particular tunable set. A name the disk already has is a kernel tunable:
    it is kept and the clash reported, never overwritten."""
    refs, warnings = volume_refs(inventory, topology.devices)
    vds = {(c.adapter, c.index, vd.id): (c, vd) for c in inventory.controllers
           for vd in c.virtual_drives}
    for dev in topology.devices:
        ref = refs.get(dev.name)
        if ref is None:
            continue
        dev.controller = ref
        if states is None:
            continue
        controller, vd = vds[(ref.adapter, ref.controller, ref.virtual_drive)]
        for name, state in states(controller, vd).items():
            if name in dev.tunables:
                warnings.append(f"{dev.name}: controller tunable {name} has the name of a tunable"
                                " the device already has; the device's is kept")
            elif len(dev.tunables) >= _MAX_TUNABLES:
                warnings.append(f"{dev.name}: more than {_MAX_TUNABLES} tunables; controller"
                                f" tunable {name} left out")
            else:
                dev.tunables[name] = state
    topology.controllers = inventory
    topology.warnings.extend(warnings)
