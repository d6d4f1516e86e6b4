"""The device graph an agent discovers: plain data, no I/O.

Discovery (in the agent) fills these models from sysfs/procfs; the planner, the
control plane and the CLI only read them. Anything the kernel did not show is
``None`` (unknown), never a guess.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: The pseudo-target that carries host-wide tunables (procfs sysctls).
HOST_TARGET = "host"


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


Transport = Literal["sata", "sas", "nvme", "virtio", "fc", "iscsi", "usb", "scsi", "unknown"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


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


class Mount(_Model):
    mountpoint: str
    fstype: str
    source: str
    options: list[str]
    super_options: list[str] = Field(default_factory=list)


class ScsiHost(_Model):
    name: str  # host0
    driver: str | None = None  # scsi_host/hostN/proc_name: megaraid_sas, mpt3sas, qla2xxx ...
    fc_speed: str | None = None  # fc_host/hostN/speed, e.g. "8 Gbit"
    fc_port_name: str | None = None  # WWPN
    fc_port_state: str | None = None


class PartitionInfo(_Model):
    number: int | None = None
    start_sector: int  # in 512-byte units, as sysfs reports
    size_sectors: int
    aligned: bool = Field(description="Start aligned to every applicable boundary below")
    aligned_1mib: bool
    aligned_optimal_io: bool | None = Field(
        default=None, description="None if the parent reports no optimal I/O size"
    )
    aligned_md_chunk: bool | None = Field(
        default=None, description="None unless the partition is an md member"
    )
    misalignment_bytes: int = 0


class MdMember(_Model):
    device: str  # kernel name of the member (sdb1)
    slot: int | None = None
    state: list[str] = Field(default_factory=list)  # in_sync, faulty, spare, write_mostly...
    errors: int | None = None


class MdInfo(_Model):
    level: str | None = None  # raid0/1/4/5/6/10, linear
    chunk_bytes: int | None = None
    raid_disks: int | None = None
    members: list[MdMember] = Field(default_factory=list)
    degraded: int | None = None
    sync_action: str | None = None
    array_state: str | None = None
    uuid: str | None = None
    metadata_version: str | None = None


class DmInfo(_Model):
    name: str | None = None
    uuid: str | None = None
    type: Literal["lvm", "multipath", "crypt", "other"] = "other"
    paths: list[str] = Field(default_factory=list, description="Multipath paths (slave devices)")
    vg: str | None = None
    lv: str | None = None


class Device(_Model):
    name: str = Field(description="Kernel name, e.g. sda, nvme0n1, md126, dm-3")
    kind: DeviceKind
    id: str = Field(description="Stable id: wwn:/wwid:/serial:/uuid: prefixed, else name:")
    devno: str | None = None  # major:minor
    sysfs_path: str | None = Field(default=None, description="Resolved path relative to the sysfs root")
    size_bytes: int | None = None
    logical_block_size: int | None = None
    physical_block_size: int | None = None
    minimum_io_size: int | None = None
    optimal_io_size: int | None = None
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
    driver: str | None = Field(default=None, description="Driver bound to the device's controller")
    roles: list[Role] = Field(default_factory=list)
    parent: str | None = Field(default=None, description="Whole disk of a partition")
    partitions: list[str] = Field(default_factory=list)
    slaves: list[str] = Field(default_factory=list, description="Devices this one is built on")
    holders: list[str] = Field(default_factory=list, description="Devices built on this one")
    partition: PartitionInfo | None = None
    md: MdInfo | None = None
    dm: DmInfo | None = None
    mounts: list[Mount] = Field(default_factory=list)
    tunables: dict[str, TunableState] = Field(default_factory=dict)


class Topology(_Model):
    hostname: str | None = None
    kernel: str | None = None
    devices: list[Device] = Field(default_factory=list)
    host_tunables: dict[str, TunableState] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list, description="What discovery could not read")

    def device(self, name: str) -> Device | None:
        for dev in self.devices:
            if dev.name == name:
                return dev
        return None

    def structure_hash(self) -> str:
        """Hash of the device graph without tunable values: changes when hardware does."""
        payload = [dev.model_dump(mode="json", exclude={"tunables"}) for dev in self.devices]
        blob = json.dumps({"host": self.hostname, "devices": payload}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
