"""The analysis documents: what every surface (agent CLI, REST, CLI, support bundle) shows.

JSON keys are camelCase (``ceilingBytesPerSecond``) like the Kubernetes-style documents;
Python attributes stay snake_case. Every figure says where it came from (``source``) and
whether it is an estimate, so a reader can tell a measured ceiling from a datasheet guess.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from stortune.schemas.controllers import ControllerInventory
from stortune.schemas.topology import DEVICE_NAME_MAX, MAX_DEVICES

#: Run and probe ids ("probe-..." with up to 58 more characters).
ID_MAX = 64
Severity = Literal["info", "warning", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              serialize_by_alias=True)


class LayerKind(StrEnum):
    """Top to bottom: the order a device's layers are listed in."""

    FILESYSTEM = "filesystem"
    LVM = "lvm"
    MULTIPATH = "multipath"
    DM = "dm"
    MD = "md"
    PARTITION = "partition"
    DISK = "disk"  # member disks, LUN paths, NVMe namespaces: where the I/O lands
    LINK = "link"  # SAS phys, ATA links
    PORT = "port"  # FC ports (fc_host), iSCSI sessions
    CONTROLLER = "controller"  # SCSI hosts, NVMe controllers
    PCI = "pci"  # the controllers' PCIe links


class Part(_Model):
    """One thing inside a layer: a disk, a phy, an FC port, a PCI function."""

    name: str
    ceiling_bytes_per_second: float | None = None
    ceiling_iops: float | None = None
    source: str = Field(description="Where the ceiling came from: the sysfs attribute and its"
                                    " text, a probe run, or the device class")
    estimate: bool = Field(default=False, description="From a device class, not measured or negotiated")
    detail: str | None = Field(default=None, description='What the ceiling rests on, e.g. "8 Gbit"')
    #: The bottom block devices (disks, LUN paths) whose I/O crosses this part: measured
    #: throughput of a part is the sum of theirs.
    devices: list[str] = Field(default_factory=list)


class Layer(_Model):
    """One layer of a device's chain: its parts, and the ceiling they give together."""

    name: str = Field(description='e.g. "md126 raid5", "host1+host2 qla2xxx", "sdb..sdf"')
    kind: LayerKind
    ceiling_bytes_per_second: float | None = Field(
        default=None, description="The layer's limit: its own, or the sum of its parts'")
    ceiling_iops: float | None = None
    source: str = Field(description='e.g. "2 x 8GFC (fc_host speed) = 2 x 797 MB/s"')
    estimate: bool = False
    parts: list[Part] = Field(default_factory=list)


class Check(_Model):
    severity: Severity
    code: str = Field(description="Stable identifier: partition-misaligned, fs-geometry, raid5-wide ...")
    message: str
    device: str | None = None


def _absent(value: object) -> bool:
    return value is None


class DeviceAnalysis(_Model):
    device: str
    kind: str
    volume: str | None = Field(default=None, exclude_if=_absent, description=(
        'The hardware RAID volume this disk is: "PERC H710 VD0 RAID5, 8 drives, 256 KiB strip,'
        ' CacheVault Optimal"'))
    ceiling_bytes_per_second: float | None = Field(
        default=None, description="The lowest layer ceiling: what the device can deliver at most")
    limit: str | None = Field(default=None, description="The layer whose ceiling that is")
    layers: list[Layer] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list)


class MeasuredCeiling(_Model):
    """A ceiling a probe measured on one device (a member disk or path alone, or a set at once)."""

    # a probe sends these: bounded so the control plane refuses junk instead of storing it
    device: str = Field(min_length=1, max_length=MAX_DEVICES * (DEVICE_NAME_MAX + 1),
                        description="The device, or '+'-joined devices read at once")
    read_bytes_per_second: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    read_iops: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    run_id: str | None = Field(default=None, max_length=ID_MAX)
    measured_at: float | None = Field(default=None, allow_inf_nan=False)


class LayerLoad(_Model):
    """One layer during a benchmark step: measured against its ceiling."""

    layer: str
    kind: LayerKind
    ceiling_bytes_per_second: float | None = None
    measured_bytes_per_second: float | None = None
    ceiling_iops: float | None = None
    measured_iops: float | None = None
    share: float | None = Field(default=None, description="Measured / ceiling (0.97 = 97 %)")
    estimate: bool = False


class Saturation(_Model):
    """A device the USE method calls saturated or standing out during a step."""

    device: str
    util_percent: float | None = None
    queue_depth: float | None = None
    await_ms: float | None = None
    peers_await_ms: float | None = Field(default=None, description="Median await of its peers")
    reasons: list[str] = Field(default_factory=list)


class Bottleneck(_Model):
    """The verdict on one benchmark step (or experiment trial): which layer is the limit."""

    step: str
    device: str
    layers: list[LayerLoad] = Field(default_factory=list)
    limit: LayerLoad | None = None
    summary: str = Field(description='e.g. "host1+host2 qla2xxx, 2 x 8GFC = 1,594 MB/s:'
                                     ' measured 1,540 MB/s, 97 %"')
    saturated: list[Saturation] = Field(default_factory=list)


class SlowMember(_Model):
    """A member (or path) persistently slower than its peers across runs."""

    group: str = Field(description="The array or LUN the member belongs to")
    member: str
    runs_slow: int
    runs: int
    ratio: float = Field(description="Median over runs of its await / its peers' median await")
    peers: int
    message: str = Field(description="e.g. \"sdd: await 3.1 x its 4 peers' median in 5 of 5 runs\"")


class PathShare(_Model):
    """One path's (or HBA port's) share of a group's I/O against an even share."""

    group: str = Field(description="The multipath LUN, or 'ports' for the HBA ports")
    path: str
    port: str | None = None
    bytes: int
    ios: int
    share: float
    even_share: float
    idle: bool


class LevelPlan(_Model):
    """What one RAID level gives with the disks and workload given. None: not computable here."""

    level: str
    disks: int
    groups: int | None = Field(default=None, description="RAID50/60: RAID5/6 groups striped together")
    possible: bool = True
    usable_bytes: int | None = None
    write_penalty: int
    random_iops: float | None = None
    random_mbps: float | None = Field(default=None, description="random IOPS x block size")
    sequential_read_mbps: float | None = None
    sequential_write_mbps: float | None = None
    sequential_mbps: float | None = Field(default=None, description="At the workload's read share")
    fault_tolerance: int = Field(description="Disks that may fail, whichever they are")
    rebuild_seconds_idle: float | None = Field(
        default=None, description="At min(speed_limit_max, the disk's sequential rate)")
    rebuild_seconds_busy: float | None = Field(
        default=None, description="At speed_limit_min: md's floor when the array is busy")
    degraded_random_iops: float | None = Field(default=None, description="One disk lost, before the rebuild")
    rebuilding_random_iops: float | None = Field(
        default=None, description="Degraded, and each disk also rebuilding at speed_limit_min")
    rebuild_ure_risk: float | None = Field(
        default=None, description="Chance a single-redundancy rebuild meets an unrecoverable read error")
    disks_needed: int | None = Field(default=None, description="Fewest disks meeting the requirements")
    meets_requirements: bool | None = None
    estimate: bool = Field(description="Some per-disk figure came from a device class")
    warnings: list[str] = Field(default_factory=list)


class ExistingArray(_Model):
    """What an md array of a host can do, from its members' classes or measured figures."""

    array: str
    level: str
    members: list[str]
    per_disk_iops: float | None
    per_disk_mbps: float | None
    per_disk_source: str
    plan: LevelPlan | None = Field(description="None when the level is not one RAID planning models")


class HostAnalysis(_Model):
    hostname: str | None = None
    devices: list[DeviceAnalysis] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list, description="Host-wide checks")
    slow_members: list[SlowMember] = Field(default_factory=list)
    balance: list[PathShare] = Field(default_factory=list)
    measured: list[MeasuredCeiling] = Field(default_factory=list, description="Probe figures used")
    arrays: list[ExistingArray] = Field(
        default_factory=list, description="What each md array can do: RAID planning's model over its"
                                          " members' measured or class figures")
    controllers: ControllerInventory | None = Field(
        default=None, exclude_if=_absent,
        description="The host's hardware RAID controllers as their vendor tools report them (the"
                    " topology's inventory, in its own snake_case keys); None: not asked")
