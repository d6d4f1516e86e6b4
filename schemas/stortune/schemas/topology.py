"""The device graph an agent discovers: plain data, no I/O.

Discovery (in the agent) fills these models from sysfs/procfs; the planner, the
control plane and the CLI only read them. Anything the kernel did not show is
``None`` (unknown), never a guess.

The control plane stores what agents upload and plans against it, so the model
itself holds the limits, and every consumer gets them: a name that refers to a
device is a kernel block device name (never a path), ``sysfs_path`` stays
below the sysfs root, text is at most a sysfs page (``TEXT_MAX``) and counts
are bounded (``MAX_DEVICES``). What the kernel reports always fits.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from stortune.schemas.controllers import ControllerInventory, VolumeRef

#: The pseudo-target that carries host-wide tunables (procfs sysctls).
HOST_TARGET = "host"

#: Kernel block device names: sda, nvme0n1p2, md126, dm-3, loop0, pmem0.1, and cciss!c0d0
#: (sysfs writes a '/' in a driver's name as '!'). A letter or digit first, no '/', no '..':
#: a name is a path component and never a path. The kernel's own limit is 32 (DISK_NAME_LEN),
#: partition suffixes included with room to spare.
DEVICE_NAME_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_:!+-])*\.?$"
DEVICE_NAME_MAX = 64
_DEVICE_NAME = re.compile(DEVICE_NAME_PATTERN)
#: One sysfs attribute's text (a page) and PATH_MAX: no text a kernel reports is longer.
TEXT_MAX = 4096
SYSFS_PATH_MAX = 1024
#: Far beyond a real host (a SAN host with thousands of LUNs and paths), far below junk.
MAX_DEVICES = 16384
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Numbers as the kernel keeps them (u64 sizes, sectors, counts): never negative, never wider.
U64_MAX = 2**64 - 1
Count = Annotated[int, Field(ge=0, le=U64_MAX)]
Members = Annotated[int, Field(ge=0, le=MAX_DEVICES)]


def is_device_name(name: str) -> bool:
    return len(name) <= DEVICE_NAME_MAX and _DEVICE_NAME.fullmatch(name) is not None


def _device_name(name: str) -> str:
    if not is_device_name(name):
        raise ValueError(f"{name!r} is not a kernel block device name (letters, digits and . _ : ! + -, "
                         f"starting with a letter or a digit, no '..', at most {DEVICE_NAME_MAX} "
                         "characters)")
    return name


def _sysfs_path(path: str) -> str:
    if path.startswith("/") or _CONTROL.search(path) or any(
            part in ("", ".", "..") for part in path.split("/")):
        raise ValueError(f"{path[:100]!r} is not a path below the sysfs root (relative, no empty, "
                         "'.' or '..' component, no control characters)")
    return path


def _absolute(path: str) -> str:
    if not path.startswith("/") or "\x00" in path:
        raise ValueError("must be an absolute path without NUL")
    return path


DeviceName = Annotated[str, Field(max_length=DEVICE_NAME_MAX, json_schema_extra={
    "pattern": DEVICE_NAME_PATTERN}), AfterValidator(_device_name)]
DeviceNames = Annotated[list[DeviceName], Field(max_length=MAX_DEVICES)]
SysfsPath = Annotated[str, Field(max_length=SYSFS_PATH_MAX), AfterValidator(_sysfs_path)]


class DeviceKind(StrEnum):
    DISK = "disk"  # sd*, vd*, NVMe namespaces, hardware RAID volumes
    PARTITION = "partition"
    MD = "md"
    DM = "dm"
    LOOP = "loop"
    ZRAM = "zram"
    HOST = "host"  # the host itself, for host-wide tunables


class Role(StrEnum):
    MD_MEMBER = "md-member"
    MPATH_PATH = "mpath-path"
    LVM_PV = "lvm-pv"
    PARTITION = "partition"
    CRYPT_BACKING = "crypt-backing"
    MOUNTED = "mounted"
    HAS_HOLDERS = "has-holders"  # something (md, dm) is built on this device
    #: A whole disk one of whose partitions is an md member: the queue (scheduler,
    #: nr_requests) an md member partition runs on belongs to this disk.
    MD_MEMBER_DISK = "md-member-disk"


Transport = Literal["sata", "sas", "nvme", "virtio", "fc", "iscsi", "usb", "scsi", "unknown"]


class _Model(BaseModel):
    # str_max_length: every string of the topology, dict keys and list items included.
    model_config = ConfigDict(extra="forbid", frozen=False, str_max_length=TEXT_MAX)


def _absent(value: object) -> bool:
    return value is None


class RecordedOriginal(_Model):
    """What the agent's journal holds for a tunable stortune changed and has not put back.

    The agent fills it in whenever it reports values, so every planner (the
    agent's, the control plane's dry runs and reconciler) sees the same facts
    and can tell which settings a converge would put back.
    """

    value: int | str = Field(description="The value before stortune first changed it")
    direct: bool = Field(
        default=True,
        description="stortune set this tunable itself; false: it changed only as a side effect of"
                    " writing `cause`",
    )
    cause: str | None = Field(
        default=None, exclude_if=_absent,
        description="The tunable of the same device whose last write by stortune may have reset this one",
    )
    cause_left: int | str | None = Field(
        default=None, exclude_if=_absent, description="The value that write left here"
    )


class TunableState(_Model):
    """One tunable as the kernel shows it on one device, right now."""

    supported: bool
    value: int | str | None = None
    raw: str | None = Field(default=None, description="The attribute's text as read")
    writable: bool = False
    choices: list[str] | None = Field(default=None, description="Offered values (scheduler)")
    minimum: int | None = None
    maximum: int | None = Field(default=None, description="Static or device bound, e.g. max_hw_sectors_kb")
    reason: str | None = Field(default=None, description="Why unsupported, when it is")
    original: RecordedOriginal | None = Field(
        default=None, exclude_if=_absent,
        description="Set when stortune changed this tunable and has not put it back"
                    " (from the agent's journal)",
    )
    effective: int | str | None = Field(
        default=None, exclude_if=_absent,
        description="Controller settings: the value in effect when it differs from the configured"
                    " `value`, which takes effect only after a reboot (pendingReboot)",
    )


class Mount(_Model):
    mountpoint: Annotated[str, AfterValidator(_absolute)]
    fstype: str
    source: str
    options: list[str] = Field(max_length=256)
    super_options: list[str] = Field(default_factory=list, max_length=256)


class PciLink(_Model):
    """The PCI function a controller sits on and its negotiated PCIe link, as sysfs shows it."""

    address: str = Field(max_length=64, description="PCI address, e.g. 0000:04:00.0")
    current_link_speed: str | None = Field(default=None, description='e.g. "5.0 GT/s PCIe"')
    current_link_width: Members | None = None
    max_link_speed: str | None = None
    max_link_width: Members | None = None


class ScsiHost(_Model):
    name: str  # host0
    driver: str | None = None  # scsi_host/hostN/proc_name: megaraid_sas, mpt3sas, qla2xxx ...
    fc_speed: str | None = None  # fc_host/hostN/speed, e.g. "8 Gbit"
    fc_port_name: str | None = None  # WWPN
    fc_port_state: str | None = None
    pci: PciLink | None = Field(default=None, exclude_if=_absent,
                                description="The HBA's PCI function above this host")


class PartitionInfo(_Model):
    number: Count | None = None
    start_sector: Count  # in 512-byte units, as sysfs reports
    size_sectors: Count
    aligned: bool = Field(description="Start aligned to every applicable boundary below")
    aligned_1mib: bool
    aligned_optimal_io: bool | None = Field(
        default=None, description="None if the parent reports no optimal I/O size"
    )
    aligned_md_chunk: bool | None = Field(
        default=None, description="None unless the partition is an md member"
    )
    misalignment_bytes: Count = 0


class MdMember(_Model):
    device: DeviceName  # kernel name of the member (sdb1)
    slot: Members | None = None
    state: list[str] = Field(default_factory=list)  # in_sync, faulty, spare, write_mostly...
    errors: Count | None = None


class MdInfo(_Model):
    level: str | None = None  # raid0/1/4/5/6/10, linear
    chunk_bytes: Count | None = None
    raid_disks: Members | None = None
    members: list[MdMember] = Field(default_factory=list, max_length=MAX_DEVICES)
    degraded: Members | None = None
    sync_action: str | None = None
    array_state: str | None = None
    uuid: str | None = None
    metadata_version: str | None = None
    sync_completed: str | None = Field(default=None, exclude_if=_absent,
                                       description='md/sync_completed: "none" or "done / total" sectors')
    sync_speed_min_kib: Count | None = Field(default=None, exclude_if=_absent,
                                           description="Effective resync floor, KiB/s")
    sync_speed_max_kib: Count | None = Field(default=None, exclude_if=_absent,
                                           description="Effective resync ceiling, KiB/s")
    component_bytes: Count | None = Field(default=None, exclude_if=_absent,
                                        description="Space used on each member")


class DmInfo(_Model):
    name: str | None = None
    uuid: str | None = None
    type: Literal["lvm", "multipath", "crypt", "other"] = "other"
    paths: DeviceNames = Field(default_factory=list, description="Multipath paths (slave devices)")
    vg: str | None = None
    lv: str | None = None


class Device(_Model):
    name: DeviceName = Field(description="Kernel name, e.g. sda, nvme0n1, md126, dm-3")
    kind: DeviceKind
    # Room for a prefix and a whole path (loop:BACKING_FILE).
    id: str = Field(max_length=2 * TEXT_MAX,
                    description="Stable id: wwn:/wwid:/serial:/uuid: prefixed, else name:")
    devno: str | None = Field(default=None, pattern=r"^[0-9]{1,10}:[0-9]{1,10}$")  # major:minor
    sysfs_path: SysfsPath | None = Field(default=None,
                                         description="Resolved path relative to the sysfs root")
    size_bytes: Count | None = None
    logical_block_size: Count | None = None
    physical_block_size: Count | None = None
    minimum_io_size: Count | None = None
    optimal_io_size: Count | None = None
    rotational: bool | None = None
    removable: bool | None = None
    read_only: bool | None = None
    transport: Transport | None = None
    vendor: str | None = None
    model: str | None = None
    serial: str | None = None
    firmware: str | None = None
    wwn: str | None = None
    scsi_address: str | None = None  # H:C:T:L
    scsi_host: ScsiHost | None = None
    link_kind: Literal["sas-phy", "ata-link"] | None = Field(
        default=None, exclude_if=_absent, description="The link the disk hangs on, when sysfs shows it")
    link_name: str | None = Field(default=None, exclude_if=_absent,
                                  description="phy-0:3 (sas_phy) or link2 (ata_link)")
    link_rate: str | None = Field(
        default=None, exclude_if=_absent,
        description='Negotiated rate as sysfs prints it: "6.0 Gbit" (sas_phy), "6.0 Gbps" (ata_link)')
    rotation_rpm: Count | None = Field(
        default=None, exclude_if=_absent,
        description="Medium rotation rate from VPD page B1 (SCSI/SATA); 1 = not rotating")
    pci: PciLink | None = Field(default=None, exclude_if=_absent,
                                description="NVMe: the controller's PCI function and link")
    alignment_offset: Annotated[int, Field(ge=-1, le=U64_MAX)] | None = Field(
        default=None, exclude_if=_absent,
        description="Bytes the device's start is off its lower devices' natural alignment"
                    " (sysfs alignment_offset; -1: cannot be aligned)")
    driver: str | None = Field(default=None, description="Driver bound to the device's controller")
    roles: list[Role] = Field(default_factory=list, max_length=len(Role))
    parent: DeviceName | None = Field(default=None, description="Whole disk of a partition")
    partitions: DeviceNames = Field(default_factory=list)
    slaves: DeviceNames = Field(default_factory=list, description="Devices this one is built on")
    holders: DeviceNames = Field(default_factory=list, description="Devices built on this one")
    partition: PartitionInfo | None = None
    md: MdInfo | None = None
    dm: DmInfo | None = None
    mounts: list[Mount] = Field(default_factory=list, max_length=MAX_DEVICES)
    tunables: dict[str, TunableState] = Field(default_factory=dict, max_length=256)
    controller: VolumeRef | None = Field(
        default=None, exclude_if=_absent,
        description="The hardware RAID virtual drive this disk is, when a vendor tool maps it")


#: A protection reason is one sentence ("zram0 backs swap (/dev/zram0)"); the agent shortens longer.
PROTECTION_REASON_MAX = 512


def printable(text: str) -> str:
    """``text`` with each control character as '?'."""
    return _CONTROL.sub("?", text)


def _reason(text: str) -> str:
    if _CONTROL.search(text):
        raise ValueError("must be printable text (no control characters)")
    return text


class ProtectedDevice(_Model):
    """A device the agent refuses to experiments, benchmarks and probes, and why. The agent is
    the authority; the control plane shows these and previews the agent's refusals with them."""

    name: DeviceName
    id: str = Field(max_length=2 * TEXT_MAX, description="The device's stable id, as in devices[]")
    reason: Annotated[str, Field(max_length=PROTECTION_REASON_MAX), AfterValidator(_reason)] = Field(
        description='One sentence: "zram0 backs swap (/dev/zram0)", "loop7 is named protected by the'
                    ' host (--protect-device)"')


class Topology(_Model):
    hostname: str | None = None
    kernel: str | None = None
    devices: list[Device] = Field(default_factory=list, max_length=MAX_DEVICES)
    host_tunables: dict[str, TunableState] = Field(default_factory=dict, max_length=256)
    memory_bytes: Count | None = Field(default=None, exclude_if=_absent,
                                     description="MemTotal from /proc/meminfo")
    warnings: list[Annotated[str, Field(max_length=2 * TEXT_MAX)]] = Field(
        default_factory=list, max_length=4 * MAX_DEVICES, description="What discovery could not read")
    controllers: ControllerInventory | None = Field(
        default=None, exclude_if=_absent,
        description="Hardware RAID controllers as their vendor tools report them; None when the"
                    " agent did not ask (no vendor tool on its tool path)")
    protected: list[ProtectedDevice] | None = Field(
        default=None, exclude_if=_absent, max_length=MAX_DEVICES,
        description="The devices the agent protects (its mounts, swap, --protect-* flags, other users'"
                    " loop devices), each one of devices[] at most once; None: an agent that does not"
                    " report them (the control plane falls back to the default mounts)")

    @field_validator("devices")
    @classmethod
    def _one_device_per_name(cls, devices: list[Device]) -> list[Device]:
        seen: dict[str, int] = {}
        for i, dev in enumerate(devices):
            first = seen.setdefault(dev.name, i)
            if first != i:
                raise ValueError(f"devices[{i}].name {dev.name!r} is also devices[{first}]'s: "
                                 "a kernel name belongs to one device")
        return devices

    @model_validator(mode="after")
    def _protected_are_devices(self) -> Topology:
        """Each protected entry names one device of this topology, once, by its own id: so the
        list is never longer than devices[]."""
        ids = {dev.name: dev.id for dev in self.devices}
        seen: set[str] = set()
        for i, entry in enumerate(self.protected or ()):
            if ids.get(entry.name) != entry.id:
                raise ValueError(f"protected[{i}]: {entry.name!r} with id {entry.id[:100]!r} is not one of"
                                 " devices[] (a protected device is one the topology lists, by its id)")
            if entry.name in seen:
                raise ValueError(f"protected[{i}].name {entry.name!r} is listed twice: once per device")
            seen.add(entry.name)
        return self

    def device(self, name: str) -> Device | None:
        for dev in self.devices:
            if dev.name == name:
                return dev
        return None

    def structure_hash(self) -> str:
        """Hash of the device graph without tunable values: changes when hardware does."""
        # sync_completed moves every second of a resync: progress, not hardware
        # a battery's state moves with its learn cycle: not hardware either
        payload = [dev.model_dump(mode="json", exclude={"tunables": True, "md": {"sync_completed"},
                                                        "controller": {"backup"}})
                   for dev in self.devices]
        blob = json.dumps({"host": self.hostname, "devices": payload}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
