"""Microchip Adaptec (Series 5 to 8, SmartRAID) and IBM ServeRAID 8 through ``arcconf``.

arcconf prints text, not JSON: ``arcconf GETVERSION`` starts with ``Controllers found: N``
(controllers are numbered from 1), ``arcconf GETCONFIG N AL`` prints sections, each a title
between dashed rules, holding ``key : value`` lines:

- ``Controller information`` with sub-sections ``Controller Version Information`` and the
  cache backup: ``Controller Battery Information`` (ServeRAID 8, Series 2/5),
  ``Controller ZMM Information`` (Series 5Z/6), ``Controller Cache Backup Unit Information``
  (Series 7/8 supercap);
- ``Logical device information``: ``Logical device number M`` blocks, then their
  ``segment information`` (one ``Segment K`` / ``Group G, Segment K`` line per member drive);
- ``Physical Device information``: ``Device #K`` blocks, enclosures among them.

A logical drive shows each cache twice: ``Read-cache setting`` (configured) and ``Read-cache
status`` (in effect). On a ServeRAID 8 a new read-cache setting takes effect only after a
reboot: while setting and status disagree, the policy fields hold the status and ``pending``
the setting. The write cache's status legitimately differs from its setting when the battery
is not ready (write-back when protected falls back to write-through), so it is not read as
pending.

Writes: ``SETCACHE <ctrl> LOGICALDRIVE <ld> RON|ROFF|WT|WB|WBB noprompt``; success ends with
``Command completed successfully.``, asking for the mode a drive already has is refused with a
non-zero exit and a message saying it is the same as the old one (the wanted state: not a
failure). Adaptive read-ahead is shown by some firmware but has no SETCACHE mode, and a
drive's own write cache is set per physical device (``SETCACHE DEVICE``), not per logical
drive: both refused before anything runs.

Parsing is line based (``str.partition``, no regular expressions): a line is bounded by the
runner's output cap and each line costs one pass. Keys differ between arcconf generations
(``Logical device number`` / ``Logical Device number``, ``Reported Location`` only on newer
ones, ``Disk Name`` only on 2.x+): what is absent becomes None, what is malformed fails that
controller only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stortune.agent.controllers.base import (
    UNREADABLE,
    ToolFailure,
    digits,
    run_ok,
    run_write,
    unreadable,
    unsupported,
    where,
)
from stortune.agent.controllers.megaraid import parse_size
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import (
    AdapterName,
    BackupKind,
    BackupUnit,
    Controller,
    ControllerError,
    ControllerSetting,
    PhysicalDrive,
    ReadPolicy,
    VirtualDrive,
    WritePolicy,
)

#: more than any host holds; a tool claiming more is broken
MAX_CONTROLLERS = 64
_BACKUP_SECTIONS: dict[str, BackupKind] = {
    "controller battery information": "bbu",
    "controller zmm information": "cachevault",  # flash + supercap: the CacheVault equivalent
    "controller cache backup unit information": "cachevault",
}
_BACKUP_ABSENT = ("not installed", "not present", "none", "absent")
_BACKUP_OK = ("optimal", "ready", "ok")
_SKIPPED_DEVICES = ("enclosure", "sgpio", "ses ", "backplane", "expander")
#: the only words a write puts on arcconf's command line: setting -> value -> logical mode
SET_WORDS: dict[str, dict[str, str]] = {
    "read_policy": {"read-ahead": "RON", "no-read-ahead": "ROFF"},
    "write_policy": {"write-through": "WT", "write-back": "WBB", "always-write-back": "WB"},
}
_ANY_EXIT = tuple(range(256))  # the exit status is judged with the text (see set_policy)
_DONE = "command completed successfully"
_SAME = "same as the old"


@dataclass
class _Block:
    """One ``Logical device number M`` or ``Device #K`` block: its keys and its segment lines."""

    number: int
    keys: dict[str, str] = field(default_factory=dict)
    segments: list[str] = field(default_factory=list)
    kind: str = ""  # "Device is a Hard drive" -> "a hard drive"


@dataclass
class _Config:
    controller: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    backup_kind: BackupKind | None = None
    backup: dict[str, str] = field(default_factory=dict)
    logical: list[_Block] = field(default_factory=list)
    physical: list[_Block] = field(default_factory=list)


class ArcconfAdapter:
    name: AdapterName = "arcconf"

    def __init__(self, tools: tuple[str, ...] = ("arcconf", "hrconf")):
        self.tools = tools

    def discover(self, runner: ToolRunner, tool: str) -> tuple[list[Controller], list[ControllerError]]:
        def fail(index: int | None, message: str) -> ControllerError:
            return ControllerError(adapter=self.name, tool=tool, index=index, message=message[:2000])

        try:
            count = parse_controller_count(_text(run_ok(runner, [tool, "GETVERSION"]).stdout))
        except ToolFailure as exc:
            return [], [fail(None, str(exc))]
        controllers: list[Controller] = []
        errors: list[ControllerError] = []
        for index in range(1, count + 1):
            try:
                text = _text(run_ok(runner, [tool, "GETCONFIG", str(index), "AL"]).stdout)
                controllers.append(parse_controller(tool, index, text))
            except UNREADABLE as exc:
                errors.append(fail(index, unreadable(exc)))
        return controllers, errors

    def set_policy(self, runner: ToolRunner, tool: str, controller: Controller, vd: VirtualDrive,  # noqa: PLR0917
                   setting: ControllerSetting, value: str) -> None:
        word = SET_WORDS.get(setting, {}).get(value)
        if word is None:
            why = ("arcconf sets a drive's write cache per physical device, not per logical drive"
                   if setting == "drive_cache" else
                   "arcconf has no mode for adaptive read-ahead" if value == "adaptive" else "")
            raise unsupported(controller, vd, setting, value, offered=SET_WORDS, why=why)
        context = where(controller, vd, setting, value)
        argv = [tool, "SETCACHE", str(controller.index), "LOGICALDRIVE", str(vd.id), word, "noprompt"]
        result = run_write(runner, argv, context, ok_exit=_ANY_EXIT)
        try:
            text = _text(result.stdout).lower()
        except ToolFailure as exc:
            raise ToolFailure(f"{context}: `{' '.join(argv)}`: {exc}") from None
        if _SAME in text:
            return  # the drive already has this mode configured
        if result.exit_code != 0 or _DONE not in text:
            said = " ".join(line.strip() for line in _text(result.stdout + result.stderr).splitlines()
                            if line.strip() and not line.lower().startswith("controllers found"))
            raise ToolFailure(f"{context}: `{' '.join(argv)}` exited with status {result.exit_code}"
                              f" without confirming: {said[:200] or '(no output)'}")


def parse_controller_count(text: str) -> int:
    """``Controllers found: N`` from GETVERSION (or LIST); anything else is not arcconf."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "controllers found":
            value = value.strip()
            if not digits(value) or len(value) > 4 or int(value) > MAX_CONTROLLERS:
                raise ToolFailure(f"unexpected controller count {value[:40]!r}")
            return int(value)
    raise ToolFailure(f'no "Controllers found" line in the answer{_excerpt(text)}')


def parse_config(text: str) -> _Config:
    """Splits GETCONFIG AL into its sections; unknown sections and lines are skipped."""
    cfg = _Config()
    section = ""
    target: dict[str, str] | None = None
    block: _Block | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("---"):
            continue
        low = line.lower()
        key, value = _key_value(line)
        if key is None:  # a title or a free-standing line
            if low in ("controller information", "controller version information"):
                section, block = low, None
                target = cfg.controller if low == "controller information" else cfg.versions
            elif low in _BACKUP_SECTIONS:
                section, block, target = low, None, cfg.backup
                cfg.backup_kind = _BACKUP_SECTIONS[low]
            elif low.startswith("logical device information") or low == "logical drive information":
                section, block, target = "logical", None, None
            elif low.startswith("physical device information"):
                section, block, target = "physical", None, None
            elif low.endswith("information") and section not in ("logical", "physical"):
                section, block, target = low, None, None  # a sub-section we do not read
            elif section == "logical" and low.startswith(("logical device number", "logical drive number")):
                block = _Block(_number(low.rsplit(" ", 1)[-1], "logical device number"))
                cfg.logical.append(block)
                target = block.keys
            elif section == "physical" and low.startswith("device #"):
                block = _Block(_number(low[len("device #"):], "device number"))
                cfg.physical.append(block)
                target = block.keys
            elif block is not None and low.startswith("device is "):
                block.kind = low[len("device is "):]
            continue
        if section == "logical" and block is not None and _is_segment(key):
            block.segments.append(value)
        elif target is not None and key not in target:  # first wins: later sub-blocks repeat keys
            target[key] = value
    return cfg


def parse_controller(tool: str, index: int, text: str) -> Controller:
    cfg = parse_config(text)
    model = cfg.controller.get("Controller Model")
    if not model:
        raise ToolFailure(f'controller {index}: no "Controller Model" in the answer{_excerpt(text)}')
    return Controller(
        adapter="arcconf", tool=tool, index=index, model=model,
        serial=cfg.controller.get("Controller Serial Number"),
        pci_address=cfg.controller.get("PCI Address (Bus:Device:Function)")
        or cfg.controller.get("PCI Address"),
        firmware_version=cfg.versions.get("Firmware"),
        driver=None,  # GETCONFIG names the driver's version only (aacraid or smartpqi)
        cache_size_bytes=parse_size(cfg.controller.get("Installed memory")),
        backup=parse_backup(cfg),
        virtual_drives=[parse_logical_device(b) for b in cfg.logical],
        physical_drives=[parse_physical_device(b) for b in cfg.physical
                         if not any(s in b.kind for s in _SKIPPED_DEVICES)],
    )


def parse_backup(cfg: _Config) -> BackupUnit:
    state = cfg.backup.get("Status") or cfg.backup.get("Overall Backup Unit Status")
    if cfg.backup_kind is None or state is None:
        return BackupUnit(kind="none")
    low = state.lower()
    if any(word in low for word in _BACKUP_ABSENT):
        return BackupUnit(kind="none", state=state)
    return BackupUnit(kind=cfg.backup_kind, state=state,
                      optimal=any(word in low for word in _BACKUP_OK) and "not" not in low)


def parse_logical_device(block: _Block) -> VirtualDrive:
    keys = block.keys
    where = f"logical device {block.number}"
    level = keys.get("RAID level") or keys.get("RAID Level")
    members = len(block.segments)
    disk = (keys.get("Disk Name") or "").split(" ", 1)[0]
    configured = parse_read_cache(keys.get("Read-cache setting"), where)
    read, pending = configured, {}
    on = _on_off(keys.get("Read-cache status"))
    if on is not None and on != (configured != "no-read-ahead"):
        read, pending = ("read-ahead" if on else "no-read-ahead"), {"read_policy": configured}
    return VirtualDrive(
        id=block.number, name=keys.get("Logical device name") or keys.get("Logical Device name") or "",
        raid_level=_raid_level(level) if level else "unknown",
        state=keys.get("Status of logical device") or keys.get("Status of Logical Device") or "unknown",
        size_bytes=parse_size(keys.get("Size")),
        strip_size_bytes=parse_size(keys.get("Stripe-unit size")),
        drive_count=members or None,
        read_policy=read,
        write_policy=parse_write_cache(keys.get("Write-cache setting"), where),
        io_policy=None,
        wwn=keys.get("Unique Identifier"),
        block_device=disk if disk.startswith("/dev/") else None,
        drives=[_segment_slot(s) for s in block.segments],
        pending=pending,
    )


def _on_off(status: str | None) -> bool | None:
    """A cache status, ``On`` / ``Off`` (sometimes followed by a reason); anything else: unknown."""
    word = (status or "").strip().lower().split(" ", 1)[0]
    return {"on": True, "off": False, "enabled": True, "disabled": False}.get(word)


def parse_read_cache(value: str | None, where: str) -> ReadPolicy:
    """Adaptec's read cache is its read-ahead: ``Enabled`` / ``Disabled``; ServeRAID can say
    ``Enabled (adaptive)``."""
    low = (value or "").lower()
    if "adaptive" in low:
        return "adaptive"
    if low.startswith("enabled") or low == "on":
        return "read-ahead"
    if low.startswith("disabled") or low == "off":
        return "no-read-ahead"
    raise ToolFailure(f"{where}: unknown read-cache setting {value!r} (expected Enabled/Disabled)")


def parse_write_cache(value: str | None, where: str) -> WritePolicy:
    """``Disabled (write-through)`` / ``Off``; ``Enabled (write-back) when protected by battery/ZMM``
    (newer arcconf: ``On when protected by battery/ZMM``) falls
    back to write-through without its backup, like MegaRAID's WB; plain ``Enabled (write-back)``
    (arcconf's WB, not WBB) stays write-back without it: MegaRAID's "always write-back"."""
    low = (value or "").lower()
    if "write-through" in low or low.startswith("disabled") or low == "off":
        return "write-through"
    if "write-back" in low or low.startswith("enabled") or low == "on" or low.startswith("on "):
        return "write-back" if "protected" in low else "always-write-back"
    raise ToolFailure(f"{where}: unknown write-cache setting {value!r}"
                      " (expected Enabled (write-back) / Disabled (write-through))")


def parse_physical_device(block: _Block) -> PhysicalDrive:
    keys = block.keys
    smart = keys.get("S.M.A.R.T.")
    vendor, model = keys.get("Vendor", ""), keys.get("Model", "")
    return PhysicalDrive(
        slot=_device_slot(block), state=keys.get("State") or "unknown",
        interface=(keys.get("Transfer Speed") or "").split(" ", 1)[0] or None,
        media="SSD" if keys.get("SSD", "").lower() == "yes" or "solid state" in block.kind else None,
        model=" ".join(p for p in (vendor, model) if p) or None,
        size_bytes=parse_size(keys.get("Total Size")),
        media_errors=_count(keys.get("Medium Error Count"), "Medium Error Count"),
        other_errors=_count(keys.get("Hardware Error Count"), "Hardware Error Count"),
        predictive_failures=_count(keys.get("S.M.A.R.T. warnings") or keys.get("SMART Warning Count"),
                                   "S.M.A.R.T. warnings"),
        smart_alert=None if smart is None else smart.lower() == "yes",
    )


def _device_slot(block: _Block) -> str:
    """``Enclosure 0, Slot 3`` -> ``0:3``; older tools: ``Reported Channel,Device(T:L) : 0,3(3:0)``
    -> ``0,3``; neither: ``#K``."""
    location = block.keys.get("Reported Location", "")
    enclosure, sep, slot = location.partition(",")
    if sep and enclosure.strip().lower().startswith("enclosure") and slot.strip().lower().startswith("slot"):
        return f"{enclosure.split()[-1]}:{slot.split()[-1]}"
    channel = block.keys.get("Reported Channel,Device(T:L)") or block.keys.get("Reported Channel,Device")
    if channel:
        return channel.split("(", 1)[0].strip()
    return f"#{block.number}"


def _segment_slot(value: str) -> str:
    """``Present (Controller:1,Enclosure:0,Slot:2) SN`` -> ``0:2``; ``Channel:0,Device:2`` ->
    ``0,2``; arcconf 3.x ``Present (558GB, SAS, HDD, Enclosure:0, Slot:2) SN`` -> ``0:2``."""
    inside = value.partition("(")[2].partition(")")[0]
    parts = {k.strip().lower(): v.strip() for k, _, v in (p.partition(":") for p in inside.split(","))}
    if "enclosure" in parts and "slot" in parts:
        return f"{parts['enclosure']}:{parts['slot']}"
    if "channel" in parts and "device" in parts:
        return f"{parts['channel']},{parts['device']}"
    return (inside or value).strip()[:64] or "?"


def _raid_level(level: str) -> str:
    """``5`` -> ``RAID5``, ``1E`` -> ``RAID1E``, ``Simple_volume`` kept as the tool says it."""
    word = level.split(maxsplit=1)[0] if level.split() else level
    return f"RAID{word}" if word[:1].isdigit() else word


def _is_segment(key: str) -> bool:
    low = key.lower()
    return low.startswith("segment ") or (low.startswith("group ") and ", segment " in low)


def _key_value(line: str) -> tuple[str | None, str]:
    """arcconf pads ``key : value``; keys may hold a colon themselves (``Device(T:L)``)."""
    key, sep, value = line.partition(" : ")
    if not sep:
        if line.endswith(" :"):
            return line[:-2].strip(), ""
        return None, ""
    return key.strip(), value.strip()


def _count(text: str | None, what: str) -> int | None:
    """A counter the tool reported (``0``, ``12``); absent (older arcconf) is None, not 0."""
    if text is None or text.strip().upper() in ("", "N/A", "NA"):
        return None
    number = text.strip().lstrip("-")
    if not digits(number) or len(number) > 19:
        raise ToolFailure(f"{what}: expected a number, got {text[:40]!r}")
    return int(text.strip())


def _number(text: str, what: str) -> int:
    text = text.strip()
    if not digits(text) or len(text) > 5:
        raise ToolFailure(f"unreadable {what} {text[:40]!r}")
    return int(text)


def _text(stdout: bytes) -> str:
    if b"\x00" in stdout:
        raise ToolFailure("the answer holds NUL bytes: not arcconf text")
    return stdout.decode("utf-8", "replace")


def _excerpt(text: str) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f": {first[:200]}" if first else " (empty)"

