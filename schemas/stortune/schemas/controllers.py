"""Hardware RAID controllers as the agent sees them through the vendor tools (read-only).

Pure documents, no I/O: the agent's adapters (``stortune.agent.controllers``) parse each
tool's output into these. Policies are normalised across vendors (``read-ahead``,
``write-back`` ...) so a profile can later name them without knowing storcli's ``RWBD``.

Bounds reject nonsense a broken tool could print (a negative media error count, a 3 TB
strip) instead of letting it reach the planner. ``VolumeRef`` is what a Linux block device
carries once discovery has mapped it to a virtual drive (by WWN, SCSI target id, or the name
the tool itself prints, checked against sysfs).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

AdapterName = Literal["megaraid", "perc", "arcconf", "smartarray"]
ReadPolicy = Literal["read-ahead", "no-read-ahead", "adaptive"]
WritePolicy = Literal["write-back", "write-through", "always-write-back"]
IOPolicy = Literal["direct", "cached"]
DriveCache = Literal["enabled", "disabled", "default"]
BackupKind = Literal["bbu", "cachevault", "none"]
#: The per-volume policies stortune can write through a vendor tool (catalog scope "controller")
ControllerSetting = Literal["read_policy", "write_policy", "drive_cache"]
MappedBy = Literal["wwn", "target-id", "tool"]

#: Largest strip any controller offers is 1 MiB (MegaRAID 9[3-5]xx); 16 MiB leaves headroom.
MAX_STRIP_BYTES = 16 << 20
#: More drives than one controller can address (MegaRAID: 240 per controller).
MAX_DRIVES = 1024
#: Controller cache: 8 GB on the largest current cards; 1 TiB rejects unit mistakes only.
MAX_CACHE_BYTES = 1 << 40
Count = Annotated[int, Field(ge=0, le=(1 << 63) - 1)]
Text = Annotated[str, Field(max_length=256)]
Percent = Annotated[int, Field(ge=0, le=100)]


def normalise_raid_level(text: str) -> str:
    """``RAID5`` -> ``raid5``, ``RAID 1+0`` / ``RAID10`` -> ``raid10``, ``5`` -> ``raid5``.

    The words profiles match on. A level a tool spells its own way (``Simple_volume``,
    ``Cac1``) is kept, lower-cased, so a profile can still name it."""
    word = re.sub(r"[\s_-]+", "", text.strip().lower())
    if word[:1].isdigit():
        word = f"raid{word}"
    if word in ("raidadg", "adg"):  # HPE's name for RAID 6 (Advanced Data Guarding)
        return "raid6"
    return re.sub(r"^raid(\d)\+0$", r"raid\g<1>0", word)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackupUnit(_Doc):
    """What keeps the write cache safe across a power loss: a battery or a CacheVault (flash)."""

    kind: BackupKind
    state: Text | None = None  # the tool's word: "Optimal", "Learning", "Failed", "Degraded" ...
    optimal: bool = False


class PhysicalDrive(_Doc):
    slot: Text  # enclosure:slot as the tool names it, "32:4"
    device_id: Annotated[int, Field(ge=0, le=65535)] | None = None
    state: Text  # "Onln", "UGood", "Offln", "Rbld", "UBad", "GHS", "DHS", "JBOD" ...
    drive_group: Annotated[int, Field(ge=0, le=65535)] | None = None
    interface: Text | None = None
    media: Text | None = None
    model: Text | None = None
    size_bytes: Count | None = None
    media_errors: Count | None = None  # None: the tool did not report it
    other_errors: Count | None = None
    predictive_failures: Count | None = None
    smart_alert: bool | None = None


class VirtualDrive(_Doc):
    id: Annotated[int, Field(ge=0, le=65535)]
    drive_group: Annotated[int, Field(ge=0, le=65535)] | None = None
    name: Text = ""
    raid_level: Text  # "RAID5", "RAID10" ...
    state: Text
    size_bytes: Count | None = None
    strip_size_bytes: Annotated[int, Field(ge=512, le=MAX_STRIP_BYTES)] | None = None
    drive_count: Annotated[int, Field(ge=1, le=MAX_DRIVES)] | None = None
    span_depth: Annotated[int, Field(ge=1, le=MAX_DRIVES)] | None = None
    # None: the tool has no per-drive policy of that kind (Adaptec: no I/O policy; Smart
    # Array: a controller-wide read/write cache ratio and a per-drive on/off ``caching``)
    read_policy: ReadPolicy | None = None
    write_policy: WritePolicy | None = None
    io_policy: IOPolicy | None = None
    caching: bool | None = None  # Smart Array: the controller cache serves this drive
    drive_cache: DriveCache | None = None
    wwn: Annotated[str, Field(max_length=64)] | None = None  # for the later block-device mapping
    #: the Linux disk the tool itself names (arcconf / ssacli "Disk Name"), not checked against sysfs
    block_device: Annotated[str, Field(max_length=64, pattern=r"^/dev/[A-Za-z0-9/_-]+$")] | None = None
    drives: list[Text] = Field(default_factory=list, max_length=MAX_DRIVES)  # slots of its drives
    #: settings the tool shows configured but not yet in effect (arcconf on ServeRAID: after a
    #: reboot), setting -> the configured value; the policy fields above hold what is in effect
    pending: dict[ControllerSetting, Text] = Field(default_factory=dict)


class Controller(_Doc):
    adapter: AdapterName
    tool: Text  # the executable that answered, absolute path
    index: Annotated[int, Field(ge=0, le=1023)]
    model: Text
    serial: Text | None = None
    pci_address: Text | None = None
    firmware_version: Text | None = None
    firmware_package: Text | None = None
    driver: Text | None = None
    cache_size_bytes: Annotated[int, Field(ge=0, le=MAX_CACHE_BYTES)] | None = None
    #: Smart Array: how the cache is split between reads and writes ("25% Read / 75% Write")
    cache_read_percent: Percent | None = None
    cache_write_percent: Percent | None = None
    backup: BackupUnit
    virtual_drives: list[VirtualDrive] = Field(default_factory=list, max_length=MAX_DRIVES)
    physical_drives: list[PhysicalDrive] = Field(default_factory=list, max_length=MAX_DRIVES)


class ControllerError(_Doc):
    """One controller (or one tool's controllers, ``index`` None) that could not be read."""

    adapter: AdapterName
    tool: Text
    index: int | None = None
    message: Annotated[str, Field(max_length=2000)]


#: controllers one host reports (indexes run 0..1023): an uploaded topology cannot list more
MAX_CONTROLLERS = 1024


class ControllerInventory(_Doc):
    controllers: list[Controller] = Field(default_factory=list, max_length=MAX_CONTROLLERS)
    #: one per controller at most, plus one per tool that could not be asked at all
    errors: list[ControllerError] = Field(default_factory=list, max_length=MAX_CONTROLLERS + 4)
    #: adapters whose tool is not on the tool path: "controller not managed", not an error
    unmanaged: list[AdapterName] = Field(default_factory=list, max_length=4)


class VolumeRef(_Doc):
    """The virtual drive behind a Linux block device, with the controller facts profiles match.

    Policies are not here: they are the device's controller tunables (``Device.tunables``), so
    a policy change is a value change, not a change of the device graph."""

    adapter: AdapterName
    controller: Annotated[int, Field(ge=0, le=1023)]
    virtual_drive: Annotated[int, Field(ge=0, le=65535)]
    mapped_by: MappedBy
    model: Text
    driver: Text | None = None
    firmware_version: Text | None = None
    raid_level: Text
    strip_size_bytes: Annotated[int, Field(ge=512, le=MAX_STRIP_BYTES)] | None = None
    #: physical drives behind the volume (all spans): what the benchmark presets count
    physical_drives: Annotated[int, Field(ge=1, le=MAX_DRIVES)] | None = None
    backup: BackupUnit
    #: the tool's word for the volume's state ("Optl", "Dgrd", "OK", "Optimal" ...); None: not
    #: reported with the mapping (the analysis then looks it up in the inventory)
    state: Text | None = None
    #: spans striped together (RAID50/60: the RAID5/6 groups; RAID10: the mirrors); None: unknown
    span_depth: Annotated[int, Field(ge=1, le=MAX_DRIVES)] | None = None
