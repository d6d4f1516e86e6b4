"""Discover the block device graph of a host from sysfs and procfs.

``discover(fs)`` makes two passes. The first reads each device's own
attributes from its sysfs directory; the second links devices to each other
(partition -> disk, holders/slaves, md members, multipath paths) and derives
what needs both ends: roles, partition alignment, partition ids.

Every path starts at the injected ``KernelFS`` roots. A missing attribute is
``None`` (or an unsupported tunable), never an exception: kernels differ in
what they show. A device whose directory cannot be read at all is left out
with a warning in ``Topology.warnings``.

Choices worth knowing:

* ``ram*`` (brd), ``sr*`` (optical: media comes and goes, nothing to tune),
  ``fd*`` and hidden NVMe multipath paths (``nvme0c0n1``) are skipped;
  ``loop*`` and ``nbd*`` devices of size 0 are unattached and skipped too.
* Stable ids carry their kind as a prefix: ``wwn:``, ``serial:``, ``uuid:``
  (md), ``dm:`` (dm uuid), ``dm-name:``, ``loop:`` (backing file), else
  ``name:`` (the kernel name, which is not stable). A partition of a disk with
  a stable id gets ``<disk id>-part<N>``. Paths of one multipath LUN share
  their ``wwn:`` id, because they are the same LUN.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stortune.agent import procfs
from stortune.agent.kernelfs import KernelFS, UnsafePathError, check_device_name
from stortune.agent.tunables import read_device, read_host
from stortune.schemas.topology import (
    MAX_DEVICES,
    TEXT_MAX,
    U64_MAX,
    Device,
    DeviceKind,
    DmInfo,
    MdInfo,
    MdMember,
    Mount,
    PartitionInfo,
    PciLink,
    Role,
    ScsiHost,
    Topology,
    Transport,
    is_device_name,
)

__all__ = ["device_id", "discover", "partition_alignment", "split_lvm_name"]

MIB = 1 << 20
_SKIP = re.compile(r"^(ram\d+|sr\d+|fd\d+|nvme\d+c\d+n\d+)$")
_UNATTACHED_WHEN_EMPTY = ("loop", "nbd")
_HCTL = re.compile(r"^\d+:\d+:\d+:\d+$")
_SCSI_HOST = re.compile(r"/(host\d+)/")
# PCI function directories: 0000:04:00.1 (domain:bus:device.function)
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ATA_PORT = re.compile(r"/ata(\d+)/")
_NVME_CTRL = re.compile(r"/nvme/(nvme\d+)/")
# VPD page B1 (Block Device Characteristics): bytes 4-5, MEDIUM ROTATION RATE
_VPD_B1_NON_ROTATING = 1
_VPD_B1_RPM_MIN, _VPD_B1_RPM_MAX = 0x0401, 0xFFFE
_DIGITS = re.compile(r"(\d+)")
_LETTER_NAMED = re.compile(r"^(sd|vd|xvd|hd)([a-z]+)(.*)$")
_KIND_ORDER = {kind: i for i, kind in enumerate(DeviceKind)}
_ROLE_ORDER = {role: i for i, role in enumerate(Role)}
_DmType = Literal["lvm", "multipath", "crypt", "other"]
# dm uuid prefixes set by the tools that create the devices (lvm2, multipathd, cryptsetup)
_DM_TYPES: tuple[tuple[str, _DmType], ...] = (
    ("LVM-", "lvm"), ("mpath-", "multipath"), ("CRYPT-", "crypt"),
)
_HOLDER_ROLES = {"multipath": Role.MPATH_PATH, "lvm": Role.LVM_PV, "crypt": Role.CRYPT_BACKING}


def discover(fs: KernelFS) -> Topology:
    """The block devices, their relations, mounts and tunables, as the kernel shows them now;
    with a controller seam (``fs.controllers``), the RAID volumes behind the disks too."""
    topology = _Discovery(fs).run()
    if fs.controllers is not None:
        fs.controllers.attach(topology)
    return topology


def device_id(fs: KernelFS, name: str) -> str | None:
    """The stable id ``discover`` gives device ``name``, read from it (and its disk) alone.

    None when no such device is discovered. The executor asks this before a
    write, to refuse a kernel name that now belongs to another device.
    """
    check_device_name(name)
    walk = _Discovery(fs)
    node = walk.one(name)
    if node is None:
        return None
    if node.dev.kind is DeviceKind.PARTITION:
        parent = walk.one(os.path.basename(os.path.dirname(node.path)))
        walk.partition_id(node, parent)
    return node.dev.id


# -- small pure helpers -----------------------------------------------------


def _text(raw: str | None) -> str | None:
    """Attribute text without padding; empty means the kernel has nothing to say, and
    more than a sysfs page (TEXT_MAX) is no attribute: the control plane would refuse it."""
    if raw is None:
        return None
    text = raw.strip()
    return text if text and len(text) <= TEXT_MAX else None


_INT = re.compile(r"-?[0-9]{1,20}", re.ASCII)


def _int(raw: str | None, low: int = 0, high: int = U64_MAX) -> int | None:
    """The first word as an integer in [low, high], else None: a number no kernel writes
    ("-8" bytes, 30 digits, "²", "1_000") is unknown, not a topology the server refuses."""
    if raw is None:
        return None
    words = raw.split(maxsplit=1)
    if not words or not _INT.fullmatch(words[0]):
        return None
    value = int(words[0])
    return value if low <= value <= high else None


def _bool(raw: str | None) -> bool | None:
    value = _int(raw)
    return None if value is None else value != 0


def _rotation_rpm(page: bytes | None) -> int | None:
    """MEDIUM ROTATION RATE of VPD page B1: 1 = not rotating, 0x0401-0xFFFE rpm, else unknown."""
    if page is None or len(page) < 6 or page[1] != 0xB1:
        return None
    rate = int.from_bytes(page[4:6], "big")
    if rate == _VPD_B1_NON_ROTATING or _VPD_B1_RPM_MIN <= rate <= _VPD_B1_RPM_MAX:
        return rate
    return None  # 0: not reported; 2-0x400 and 0xFFFF: reserved


def _id_text(value: str) -> str:
    """Ids must not carry the padding of INQUIRY strings: whitespace runs become '_'."""
    return "_".join(value.split())


def _vpd80_serial(raw: str | None) -> str | None:
    """Unit serial number from VPD page 0x80: a 4-byte header, then ASCII (often padded)."""
    if raw is None or len(raw) <= 4:
        return None
    return _text(raw[4:].replace("\x00", " ").replace("\ufffd", " "))


def split_lvm_name(dm_name: str) -> tuple[str, str] | None:
    """``vg--a-lv--b`` -> ("vg-a", "lv-b"): LVM doubles '-' inside names; one '-' separates."""
    i = 0
    while i < len(dm_name):
        if dm_name[i] == "-":
            if dm_name[i + 1 : i + 2] != "-":
                vg = dm_name[:i].replace("--", "-")
                lv = dm_name[i + 1 :].replace("--", "-")
                return (vg, lv) if vg and lv else None
            i += 1  # skip the escaped pair
        i += 1
    return None


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Natural order where sd/vd names count like the kernel: sdz < sdaa."""
    head: list[tuple[int, int | str]] = []
    m = _LETTER_NAMED.match(name)
    if m:
        head = [(0, m.group(1)), (1, len(m.group(2))), (0, m.group(2))]
        name = m.group(3)
    for i, chunk in enumerate(_DIGITS.split(name)):
        if chunk:
            head.append((1, int(chunk)) if i % 2 else (0, chunk))
    return tuple(head)


def partition_alignment(start_sector: int, size_sectors: int, number: int | None,
                        optimal_io: int | None, md_chunk: int | None) -> PartitionInfo:
    """Alignment of a partition start to 1 MiB, the disk's optimal I/O size and the md chunk.

    ``misalignment_bytes`` is the start offset modulo the largest boundary it
    misses (0 when aligned): modulo a boundary it meets, it would always be 0
    and say nothing.
    """
    offset = start_sector * 512
    opt = optimal_io if optimal_io and optimal_io > 0 else None
    chunk = md_chunk if md_chunk and md_chunk > 0 else None
    checks = [(MIB, offset % MIB == 0)]
    aligned_opt = None if opt is None else offset % opt == 0
    aligned_chunk = None if chunk is None else offset % chunk == 0
    if opt is not None:
        checks.append((opt, bool(aligned_opt)))
    if chunk is not None:
        checks.append((chunk, bool(aligned_chunk)))
    missed = [boundary for boundary, ok in checks if not ok]
    return PartitionInfo(
        number=number,
        start_sector=start_sector,
        size_sectors=size_sectors,
        aligned=not missed,
        aligned_1mib=offset % MIB == 0,
        aligned_optimal_io=aligned_opt,
        aligned_md_chunk=aligned_chunk,
        misalignment_bytes=offset % max(missed) if missed else 0,
    )


# -- the walk ---------------------------------------------------------------


@dataclass
class _HostFacts:
    driver: str | None
    fc_speed: str | None
    fc_port_name: str | None
    fc_port_state: str | None
    fc: bool
    iscsi: bool
    sas: bool
    pci: PciLink | None = None

    def model(self, name: str) -> ScsiHost:
        return ScsiHost(name=name, driver=self.driver, fc_speed=self.fc_speed,
                        fc_port_name=self.fc_port_name, fc_port_state=self.fc_port_state,
                        pci=self.pci)  # shared: the topology is read-only data


@dataclass(frozen=True)
class _Link:
    kind: Literal["sas-phy", "ata-link"]
    name: str
    rate: str | None


@dataclass
class _Node:
    dev: Device
    path: str  # the device's resolved sysfs directory
    start: int | None = None  # partitions: first sector
    number: int | None = None  # partitions: partition number


class _Discovery:
    def __init__(self, fs: KernelFS) -> None:
        self.fs = fs
        # directories the walk resolved, so reading tunables needs no lookups
        self.dirs: dict[str, Path] = {}
        self.sys = os.path.normpath(str(fs.sysfs))
        self.warnings: list[str] = []
        self._hosts: dict[str, _HostFacts] = {}
        # read once per PCI function / SAS port / ATA link: many disks share one
        self._pci: dict[str, PciLink | None] = {}
        self._links: dict[str, _Link | None] = {}
        self._proc_partitions: dict[str, procfs.PartitionEntry] | None = None
        self._mdstat: dict[str, procfs.MdStatArray] | None = None

    def read(self, path: str) -> str | None:
        return _text(self.fs.read(path))

    def rel(self, path: str) -> str | None:
        prefix = self.sys + "/"
        return path[len(prefix):] if path.startswith(prefix) else None

    @staticmethod
    def listdir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(path), key=_natural_key)
        except OSError:
            return []

    @classmethod
    def device_names(cls, path: str) -> list[str]:
        """The entries of a holders/ or slaves/ directory that ``device`` does not skip."""
        return [name for name in cls.listdir(path) if is_device_name(name)]

    @staticmethod
    def link_name(path: str) -> str | None:
        """Name of the directory a symlink points to (by text: one readlink, no lstat walk)."""
        try:
            target = os.readlink(path)
        except OSError:
            return None
        return os.path.basename(os.path.normpath(os.path.join(os.path.dirname(path), target)))

    def run(self) -> Topology:
        nodes: list[_Node] = []
        for name, path in self.entries():
            node = self.device(name, path)
            if node is not None:
                nodes.append(node)
        by_name = {n.dev.name: n for n in nodes}
        self.link(nodes, by_name)
        self.attach_mounts(nodes, by_name)
        for node in nodes:
            self.finish(node, by_name)
        nodes.sort(key=lambda n: (_KIND_ORDER[n.dev.kind], _natural_key(n.dev.name)))
        return Topology(
            hostname=self.read(f"{self.fs.procfs}/sys/kernel/hostname"),
            kernel=self.read(f"{self.fs.procfs}/sys/kernel/osrelease"),
            devices=[n.dev for n in nodes],
            host_tunables=read_host(self.fs),
            memory_bytes=self.memory_bytes(),
            warnings=self.warnings,
        )

    def memory_bytes(self) -> int | None:
        text = self.fs.read_table("meminfo")
        return None if text is None else procfs.parse_meminfo_total(text)

    # -- enumeration ---------------------------------------------------------
    @staticmethod
    def resolve(link: str) -> str:
        """Where a class/block link points, by text: sysfs directories are never links
        themselves, so joining and normalising the target is what realpath would give,
        at one readlink instead of an lstat per path component."""
        try:
            target = os.readlink(link)
        except OSError:
            return link  # a plain directory (old or hand-made trees)
        return os.path.normpath(os.path.join(os.path.dirname(link), target))

    def entries(self) -> list[tuple[str, str]]:
        try:
            with os.scandir(f"{self.sys}/class/block") as it:
                return [(e.name, self.resolve(e.path)) for e in it]
        except OSError:
            pass
        # Before class/block existed (and in some containers) only block/ is there:
        # whole disks, with their partitions as subdirectories.
        out: list[tuple[str, str]] = []
        try:
            with os.scandir(f"{self.sys}/block") as it:
                disks = [(e.name, self.resolve(e.path)) for e in it]
        except OSError as exc:
            self.warnings.append(
                f"cannot list {self.sys}/class/block or {self.sys}/block ({exc.strerror});"
                " no block devices discovered"
            )
            return out
        for name, path in disks:
            out.append((name, path))
            try:
                with os.scandir(path) as it:
                    out.extend(
                        (e.name, e.path) for e in it
                        if e.name.startswith(name) and e.is_dir(follow_symlinks=False)
                        and os.path.exists(f"{e.path}/partition")
                    )
            except OSError:
                continue
        return out

    def one(self, name: str) -> _Node | None:
        """Pass 1 for a single device, found the way KernelFS.block_dir finds it."""
        for base in ("class/block", "block"):
            link = f"{self.sys}/{base}/{name}"
            if os.path.lexists(link):
                return self.device(name, self.resolve(link))
        return None

    # -- pass 1: one device's own attributes -----------------------------------
    def device(self, name: str, path: str) -> _Node | None:
        if _SKIP.match(name):
            return None
        if not is_device_name(name):
            # The control plane refuses a topology naming it (schemas/topology.py), and the
            # executor would refuse to write to it: one odd device must not hide the others.
            self.warnings.append(f"{name!r}: not a kernel block device name stortune accepts;"
                                 " device skipped")
            return None
        if not os.path.isdir(path) or not os.access(path, os.R_OK | os.X_OK):
            self.warnings.append(
                f"{name}: sysfs directory {self.rel(path) or path} is missing or unreadable;"
                " device skipped"
            )
            return None
        number = _int(self.read(f"{path}/partition"))
        kind = DeviceKind.PARTITION if number is not None else self.kind(name)
        size = _int(self.read(f"{path}/size"), high=U64_MAX // 512)
        if size == 0 and name.startswith(_UNATTACHED_WHEN_EMPTY):
            return None
        self.dirs[name] = Path(path)
        dev = Device(name=name, kind=kind, id=f"name:{name}")
        node = _Node(dev=dev, path=path, number=number)
        dev.sysfs_path = self.rel(path)
        dev.devno = self.read(f"{path}/dev") or self.devno_fallback(name)
        dev.size_bytes = None if size is None else size * 512
        dev.read_only = _bool(self.read(f"{path}/ro"))
        dev.removable = _bool(self.read(f"{path}/removable"))
        dev.holders = self.device_names(f"{path}/holders")
        offset = _int(self.read(f"{path}/alignment_offset"), low=-1)  # -1: cannot be aligned
        if offset is not None:  # (a pydantic assignment costs: 1,000+ devices)
            dev.alignment_offset = offset
        if kind is DeviceKind.PARTITION:
            node.start = _int(self.read(f"{path}/start"))
            return node
        dev.slaves = self.device_names(f"{path}/slaves")
        queue = f"{path}/queue"
        dev.logical_block_size = _int(self.read(f"{queue}/logical_block_size"))
        dev.physical_block_size = _int(self.read(f"{queue}/physical_block_size"))
        dev.minimum_io_size = _int(self.read(f"{queue}/minimum_io_size"))
        dev.optimal_io_size = _int(self.read(f"{queue}/optimal_io_size"))
        dev.rotational = _bool(self.read(f"{queue}/rotational"))
        if kind is DeviceKind.DISK:
            self.disk(dev, path)
        elif kind is DeviceKind.MD:
            self.md(dev, path)
        elif kind is DeviceKind.DM:
            self.dm(dev, path)
        elif kind is DeviceKind.LOOP:
            backing = self.read(f"{path}/loop/backing_file")
            if backing:
                dev.id = f"loop:{backing}"
        return node

    @staticmethod
    def kind(name: str) -> DeviceKind:
        if name.startswith("dm-"):
            return DeviceKind.DM
        if name.startswith("md"):
            return DeviceKind.MD
        if name.startswith("loop"):
            return DeviceKind.LOOP
        if name.startswith("zram"):
            return DeviceKind.ZRAM
        return DeviceKind.DISK

    def devno_fallback(self, name: str) -> str | None:
        """/proc/partitions knows major:minor when the sysfs ``dev`` attribute cannot be read."""
        if self._proc_partitions is None:
            text = self.fs.read_table("partitions")
            self._proc_partitions = procfs.parse_partitions(text)[0] if text else {}
        entry = self._proc_partitions.get(name)
        if entry is None:
            self.warnings.append(
                f"{name}: major:minor unknown (sysfs dev unreadable, not in /proc/partitions);"
                " its mounts cannot be matched"
            )
            return None
        return entry.devno

    def disk(self, dev: Device, path: str) -> None:
        device = f"{path}/device"
        link = self.link_name(device)
        if link is not None and _HCTL.match(link):
            dev.scsi_address = link
        dev.vendor = self.read(f"{device}/vendor")
        dev.model = self.read(f"{device}/model")
        dev.firmware = self.read(f"{device}/rev") or self.read(f"{device}/firmware_rev")
        # SCSI shows the VPD 0x83 designator as device/wwid; NVMe namespaces have their own
        dev.wwn = (self.read(f"{device}/wwid") or self.read(f"{path}/wwid")
                   or self.read(f"{device}/wwn"))
        # NVMe controllers and virtio disks have a serial attribute; a SCSI device never
        # does, so it goes straight to VPD page 0x80
        if dev.scsi_address is None:
            dev.serial = self.read(f"{device}/serial") or self.read(f"{path}/serial")
        if dev.serial is None:
            dev.serial = _vpd80_serial(self.fs.read(f"{device}/vpd_pg80"))
        if dev.wwn:
            dev.id = f"wwn:{_id_text(dev.wwn)}"
        elif dev.serial:
            dev.id = f"serial:{_id_text(dev.serial)}"

        m = _SCSI_HOST.search(path)
        host = self.host(m.group(1), path[:m.end(1)]) if m else None
        if m and host:
            dev.scsi_host = host.model(m.group(1))
            dev.driver = host.driver
        else:
            dev.driver = (self.link_name(f"{device}/driver")
                          or self.link_name(f"{device}/device/driver"))
        dev.transport = self.transport(dev.name, path, host, dev.scsi_address)
        if dev.scsi_address is not None:
            rpm = _rotation_rpm(self.fs.read_bytes(f"{device}/vpd_pgb1"))
            if rpm is not None:
                dev.rotation_rpm = rpm
            wire = self.disk_link(path, dev.scsi_address)
            if wire is not None:
                dev.link_kind, dev.link_name, dev.link_rate = wire.kind, wire.name, wire.rate
        elif dev.transport == "nvme":
            ctrl = _NVME_CTRL.search(path)
            pci = self.pci_above(path[:ctrl.start()]) if ctrl else None
            if pci is not None:
                dev.pci = pci

    def pci_above(self, path: str) -> PciLink | None:
        """The nearest PCI function directory at or above ``path``, with its PCIe link."""
        cut = path
        while cut.startswith(self.sys + "/devices/"):
            base = cut.rsplit("/", 1)[-1]
            if _PCI_ADDRESS.match(base):
                return self.pci_link(cut, base)
            cut = cut.rsplit("/", 1)[0]
        return None

    def pci_link(self, directory: str, address: str) -> PciLink | None:
        if directory in self._pci:
            return self._pci[directory]
        # Conventional PCI and root-complex integrated functions have no link attributes
        # (or "Unknown" and width 0): the address is still worth knowing.
        link = PciLink(
            address=address,
            current_link_speed=self.read(f"{directory}/current_link_speed"),
            current_link_width=_int(self.read(f"{directory}/current_link_width"), high=MAX_DEVICES),
            max_link_speed=self.read(f"{directory}/max_link_speed"),
            max_link_width=_int(self.read(f"{directory}/max_link_width"), high=MAX_DEVICES),
        )
        self._pci[directory] = link
        return link

    def disk_link(self, path: str, hctl: str) -> _Link | None:
        """The SAS phy or ATA link a SCSI disk hangs on, read once per port or link."""
        end = path.rfind("/end_device-")
        if end >= 0:
            port = path[:end]  # .../host0/port-0:0 (or an expander's port-0:0:12)
            if port.rsplit("/", 1)[-1].startswith("port-"):
                return self.cached_link(port, self.sas_phy)
            return None
        m = _ATA_PORT.search(path)
        if m is None:
            return None
        # behind a port multiplier libata puts the PMP link number in the SCSI channel
        channel = hctl.split(":")[1]
        ata = path[:m.end() - 1]
        return self.cached_link(f"{ata}\0{m.group(1)}\0{channel}", self.ata_link)

    def cached_link(self, key: str, read: Callable[[str], _Link | None]) -> _Link | None:
        if key not in self._links:
            self._links[key] = read(key)
        return self._links[key]

    def sas_phy(self, port: str) -> _Link | None:
        phys = [e for e in self.listdir(port) if e.startswith("phy-")]
        if not phys:
            return None
        phy = phys[0]  # a disk's port is narrow: one phy
        rate = (self.read(f"{self.sys}/class/sas_phy/{phy}/negotiated_linkrate")
                or self.read(f"{port}/{phy}/sas_phy/{phy}/negotiated_linkrate"))
        return _Link("sas-phy", phy, rate)

    def ata_link(self, key: str) -> _Link | None:
        ata, port, channel = key.split("\0")
        for name in (f"link{port}.{channel}", f"link{port}"):
            rate = self.read(f"{ata}/{name}/ata_link/{name}/sata_spd")
            if rate is not None:
                return _Link("ata-link", name, rate)
        return None

    @staticmethod
    def transport(name: str, path: str, host: _HostFacts | None,
                  scsi_address: str | None) -> Transport | None:
        if name.startswith("nvme"):
            return "nvme"
        if "/virtio" in path:
            return "virtio"
        if host is not None and host.fc:
            return "fc"
        if "/session" in path or (host is not None and host.iscsi):
            return "iscsi"
        if "/usb" in path:
            return "usb"
        if ("/end_device-" in path or "/sas_" in path or "/port-" in path
                or (host is not None and host.sas)):
            return "sas"
        if (host is not None and host.driver in ("ahci", "ata_piix")) or "/ata" in path:
            return "sata"
        if name.startswith("sd") or scsi_address is not None:
            return "scsi"
        return None

    def host(self, name: str, directory: str) -> _HostFacts:
        """Per SCSI host facts, read once: 1,000 LUN paths share two HBA ports."""
        cached = self._hosts.get(name)
        if cached is not None:
            return cached
        driver = self.read(f"{self.sys}/class/scsi_host/{name}/proc_name")
        fc_dir = f"{self.sys}/class/fc_host/{name}"
        facts = _HostFacts(
            driver=None if driver == "<NULL>" else driver,
            fc_speed=self.read(f"{fc_dir}/speed"),
            fc_port_name=self.read(f"{fc_dir}/port_name"),
            fc_port_state=self.read(f"{fc_dir}/port_state"),
            fc=os.path.isdir(fc_dir),
            iscsi=os.path.isdir(f"{self.sys}/class/iscsi_host/{name}"),
            sas=os.path.isdir(f"{self.sys}/class/sas_host/{name}"),
            pci=self.pci_above(directory),
        )
        self._hosts[name] = facts
        return facts

    def md(self, dev: Device, path: str) -> None:
        md = f"{path}/md"
        info = MdInfo(
            level=self.read(f"{md}/level"),
            chunk_bytes=_int(self.read(f"{md}/chunk_size")),
            raid_disks=_int(self.read(f"{md}/raid_disks"), high=MAX_DEVICES),
            degraded=_int(self.read(f"{md}/degraded"), high=MAX_DEVICES),
            sync_action=self.read(f"{md}/sync_action"),
            array_state=self.read(f"{md}/array_state"),
            metadata_version=self.read(f"{md}/metadata_version"),
            uuid=self.read(f"{md}/uuid"),  # since Linux 5.7
            sync_completed=self.read(f"{md}/sync_completed"),
            # "200000 (system)": the effective figure, then whose it is
            sync_speed_min_kib=_int(self.read(f"{md}/sync_speed_min")),
            sync_speed_max_kib=_int(self.read(f"{md}/sync_speed_max")),
        )
        component_kib = _int(self.read(f"{md}/component_size"), high=U64_MAX // 1024)
        info.component_bytes = None if component_kib is None else component_kib * 1024
        members: list[MdMember] = []
        try:
            with os.scandir(md) as it:
                member_dirs = [e.name for e in it if e.name.startswith("dev-")]
        except OSError:
            member_dirs = []
        for entry in member_dirs:
            member = f"{md}/{entry}"
            device = self.link_name(f"{member}/block") or entry[4:]
            if not is_device_name(device):
                continue  # skipped as a device too (see ``device``)
            state = self.read(f"{member}/state")
            members.append(MdMember(
                device=device,
                slot=_int(self.read(f"{member}/slot"), high=MAX_DEVICES),  # "none" for spares -> None
                state=state.split(",") if state else [],
                errors=_int(self.read(f"{member}/errors")),
            ))
        members.sort(key=lambda mm: (mm.slot is None, mm.slot or 0, _natural_key(mm.device)))
        info.members = members
        if info.level is None or info.metadata_version is None:
            self.md_fallback(dev.name, info)
        dev.md = info
        if info.uuid:
            dev.id = f"uuid:{info.uuid}"

    def md_fallback(self, name: str, info: MdInfo) -> None:
        """Fill what md/ did not show from /proc/mdstat (older kernels, odd personalities)."""
        if self._mdstat is None:
            text = self.fs.read_table("mdstat")
            arrays, problems = procfs.parse_mdstat(text) if text else ({}, [])
            self._mdstat = arrays
            self.warnings.extend(problems)
        array = self._mdstat.get(name)
        if array is None:
            return
        info.level = info.level or array.level
        info.metadata_version = info.metadata_version or array.metadata
        if info.chunk_bytes is None and array.chunk_kib is not None:
            info.chunk_bytes = array.chunk_kib * 1024
        info.raid_disks = info.raid_disks if info.raid_disks is not None else array.raid_disks

    def dm(self, dev: Device, path: str) -> None:
        name = self.read(f"{path}/dm/name")
        uuid = self.read(f"{path}/dm/uuid")
        dm_type: _DmType = next(
            (kind for prefix, kind in _DM_TYPES if uuid and uuid.startswith(prefix)), "other"
        )
        info = DmInfo(name=name, uuid=uuid, type=dm_type)
        if dm_type == "lvm" and name:
            split = split_lvm_name(name)
            if split:
                info.vg, info.lv = split
        dev.dm = info
        if uuid:
            dev.id = f"dm:{uuid}"
        elif name:
            dev.id = f"dm-name:{name}"

    # -- pass 2: relations -----------------------------------------------------
    def link(self, nodes: list[_Node], by_name: dict[str, _Node]) -> None:
        # A holder link without the matching slave link (or the reverse) still
        # means the two are stacked: record both directions from either side.
        for node in nodes:
            for slave in node.dev.slaves:
                lower = by_name.get(slave)
                if lower is not None and node.dev.name not in lower.dev.holders:
                    lower.dev.holders.append(node.dev.name)
            for holder in node.dev.holders:
                upper = by_name.get(holder)
                if upper is not None and node.dev.name not in upper.dev.slaves:
                    upper.dev.slaves.append(node.dev.name)
        for node in nodes:
            dev = node.dev
            if dev.kind is not DeviceKind.PARTITION:
                continue
            parent = by_name.get(os.path.basename(os.path.dirname(node.path)))
            if parent is None:
                continue
            dev.parent = parent.dev.name
            parent.dev.partitions.append(dev.name)
            # a partition shares its disk's request queue, and so its geometry
            for attr in ("logical_block_size", "physical_block_size", "minimum_io_size",
                         "optimal_io_size", "rotational"):
                setattr(dev, attr, getattr(parent.dev, attr))

    def attach_mounts(self, nodes: list[_Node], by_name: dict[str, _Node]) -> None:
        text = self.fs.read_table("self/mountinfo")
        if text is None:
            self.warnings.append("cannot read self/mountinfo under the procfs root; no mounts")
            return
        entries, problems = procfs.parse_mountinfo(text)
        self.warnings.extend(problems)
        by_devno = {n.dev.devno: n for n in nodes if n.dev.devno}
        by_mapper = {f"/dev/mapper/{n.dev.dm.name}": n for n in nodes if n.dev.dm and n.dev.dm.name}
        for entry in entries:
            node = by_devno.get(entry.devno)
            if node is None and entry.major == 0 and entry.source.startswith("/dev/"):
                # btrfs (and other multi-device filesystems) report an anonymous 0:N
                # st_dev; the source names the device instead
                node = by_mapper.get(entry.source) or by_name.get(entry.source[5:])
            if node is None:
                continue
            node.dev.mounts.append(Mount(
                mountpoint=entry.mountpoint, fstype=entry.fstype, source=entry.source,
                options=list(entry.options), super_options=list(entry.super_options),
            ))

    def finish(self, node: _Node, by_name: dict[str, _Node]) -> None:
        dev = node.dev
        dev.holders.sort(key=_natural_key)
        dev.slaves.sort(key=_natural_key)
        dev.partitions.sort(key=_natural_key)
        if dev.dm is not None and dev.dm.type == "multipath":
            dev.dm.paths = list(dev.slaves)
        roles: set[Role] = set()
        md_chunk: int | None = None
        for holder in dev.holders:
            upper = by_name.get(holder)
            if upper is None:
                continue
            if upper.dev.md is not None:
                roles.add(Role.MD_MEMBER)
                md_chunk = upper.dev.md.chunk_bytes
            elif upper.dev.dm is not None and upper.dev.dm.type in _HOLDER_ROLES:
                roles.add(_HOLDER_ROLES[upper.dev.dm.type])
        if dev.holders:
            roles.add(Role.HAS_HOLDERS)
        if dev.mounts:
            roles.add(Role.MOUNTED)
        if dev.kind is DeviceKind.PARTITION:
            roles.add(Role.PARTITION)
            self.partition(node, by_name, md_chunk)
        # The queue (scheduler, nr_requests) an md member partition runs on is its disk's: a
        # profile selects that disk by this role (role md-member selects the partitions).
        if any((part := by_name.get(p)) is not None and any(
                (upper := by_name.get(h)) is not None and upper.dev.md is not None
                for h in part.dev.holders) for p in dev.partitions):
            roles.add(Role.MD_MEMBER_DISK)
        dev.roles = sorted(roles, key=_ROLE_ORDER.__getitem__)
        try:
            dev.tunables = read_device(self.fs, dev.name, dev.kind, self.dirs.get(dev.name))
        except (UnsafePathError, OSError, ValueError) as exc:
            self.warnings.append(f"{dev.name}: tunables not read: {exc}")

    @staticmethod
    def partition_id(node: _Node, parent: _Node | None) -> None:
        if parent is not None and not parent.dev.id.startswith("name:") and node.number:
            node.dev.id = f"{parent.dev.id}-part{node.number}"

    def partition(self, node: _Node, by_name: dict[str, _Node], md_chunk: int | None) -> None:
        dev = node.dev
        parent = by_name.get(dev.parent) if dev.parent else None
        self.partition_id(node, parent)
        if node.start is None:
            self.warnings.append(f"{dev.name}: partition start unreadable; alignment unknown")
            return
        size = dev.size_bytes // 512 if dev.size_bytes is not None else 0
        optimal = parent.dev.optimal_io_size if parent is not None else None
        dev.partition = partition_alignment(node.start, size, node.number, optimal, md_chunk)
