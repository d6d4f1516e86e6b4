"""Device classes: the per-disk figures used where a disk was not measured.

One table for the layer analysis (a disk's estimated ceiling) and RAID planning (per-disk
IOPS, MB/s and unrecoverable-read-error rate by class), so both estimate a disk alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from stortune.schemas.topology import Device, DeviceKind

MB: Final = 1_000_000

#: Bits read per unrecoverable read error, as datasheets give them.
URE_DESKTOP: Final = 1e14  # desktop (5.4k/7.2k SATA) class
URE_ENTERPRISE: Final = 1e15  # 10k/15k SAS, enterprise SATA
URE_SSD: Final = 1e16

#: The names RAID planning takes (``stortune plan raid --disk-class``).
DiskClassName = Literal["hdd-5.4k", "hdd-7.2k", "hdd-10k", "hdd-15k", "ssd", "nvme"]


@dataclass(frozen=True)
class DiskClass:
    key: DiskClassName
    #: As the analysis shows it ("7.2k rpm HDD").
    name: str
    #: Sequential bytes/s.
    bytes_per_second: float
    #: Random IOPS.
    iops: float
    ure_bits: float


# Datasheet-ish sequential MB/s and random IOPS per class. 5.4k: the 7.2k figure scaled by
# the rotation rate (a track passes the head 5400/7200 as fast): 112 MB/s, rounded down.
# 15k: the vendor figure of an HP course is 115-120 IOPS (measured 352-386); 180 is the
# planning default.
HDD_5400: Final = DiskClass("hdd-5.4k", "5.4k rpm HDD", 110 * MB, 60, URE_DESKTOP)
HDD_7200: Final = DiskClass("hdd-7.2k", "7.2k rpm HDD", 150 * MB, 80, URE_DESKTOP)
HDD_10K: Final = DiskClass("hdd-10k", "10k rpm HDD", 200 * MB, 140, URE_ENTERPRISE)
HDD_15K: Final = DiskClass("hdd-15k", "15k rpm HDD", 250 * MB, 180, URE_ENTERPRISE)
SATA_SSD: Final = DiskClass("ssd", "SATA/SAS SSD", 520 * MB, 80_000, URE_SSD)
NVME_SSD: Final = DiskClass("nvme", "NVMe SSD", 3000 * MB, 500_000, URE_SSD)
CLASSES: Final[Mapping[DiskClassName, DiskClass]] = {
    c.key: c for c in (HDD_5400, HDD_7200, HDD_10K, HDD_15K, SATA_SSD, NVME_SSD)}

#: Drivers whose SCSI disks are a controller's RAID volumes, not drives.
RAID_DRIVERS: Final = frozenset({"megaraid_sas", "hpsa", "smartpqi", "aacraid", "cciss",
                                 "3w-9xxx", "3w-sas", "arcmsr", "mptsas_raid", "ips"})


def disk_class(dev: Device) -> DiskClass | None:
    """The class a disk's figures are estimated from, or None (an array LUN, a RAID volume, a
    virtual disk, a loop: unknown until measured)."""
    if dev.kind is not DeviceKind.DISK:
        return None
    if dev.transport == "nvme":
        return NVME_SSD
    if dev.transport in ("fc", "iscsi", "virtio") or dev.driver in RAID_DRIVERS:
        return None
    rpm = dev.rotation_rpm
    if rpm == 1:
        return SATA_SSD
    if rpm is not None and rpm > 1:
        return HDD_15K if rpm >= 15000 else HDD_10K if rpm >= 10000 else (
            HDD_7200 if rpm >= 7200 else HDD_5400)
    if dev.rotational is True:
        return HDD_7200
    if dev.rotational is False and dev.transport in ("sata", "sas", "scsi"):
        return SATA_SSD
    return None


def drive_class(dev: Device, media: str | None = None) -> DiskClass | None:
    """The class of the physical drives behind a hardware RAID volume ``dev``: from the
    controller's word for their media when it gives one, else from the volume's rotational
    flag (the controller reports an SSD volume as non-rotating). The rotation rate of the
    drives is not visible through the volume: a spinning one is taken as 7.2k rpm."""
    if media == "SSD":
        return SATA_SSD
    if media == "HDD" or dev.rotational is True:
        return HDD_7200
    if dev.rotational is False:
        return SATA_SSD
    return None
