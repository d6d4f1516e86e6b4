"""HPE Smart Array (``ssacli``, formerly ``hpssacli`` / ``hpacucli``): read-only discovery.

``ssacli ctrl all show config detail`` prints indented ``Key: Value`` text, no JSON:

- a header at column 0 per controller, ``Smart Array P440ar in Slot 0 (Embedded)``, its
  own keys one level in (``Serial Number``, ``Firmware Version``, ``Cache Ratio: 10% Read /
  90% Write``, ``Total Cache Size: 2.0`` (GB, unit omitted; older tools say ``1024 MB``),
  ``Battery/Capacitor Status``);
- ``Array: A`` sections holding ``Logical Drive: N`` (``Fault Tolerance``, ``Strip Size``,
  ``Caching``, ``Unique Identifier``, ``Disk Name``, members listed as ``physicaldrive 1I:1:1
  (port ...)``) and ``physicaldrive 1I:1:1`` detail sections (``Status``, ``Model``);
- ``unassigned`` drives, and enclosure / expander / port sections that are not ours.

Writes: a volume's ``caching`` (``ctrl slot=N ld K modify caching=enable|disable``: the
controller cache serves it or not; stortune reads it as the volume's write policy, write-back
or write-through) and the drive write cache (``ctrl slot=N modify drivewritecache=...
forced``), which is controller wide: Gen10 controllers take ``usage=configured`` (the drives
in volumes) and offer ``default``; older ones enable or disable it for all drives. There is
no per-volume read-ahead (the read share of the cache is one controller-wide ratio) and no
always-write-back per volume (``nobatterywritecache`` is controller wide): both refused
before anything runs. ssacli prints nothing on success and ``Error: ...`` on failure.

Parsing is line-based: indentation opens and closes sections, each line is split once on
``": "``; no regex, so a hostile line costs time linear in its length. Generation
differences (``Fault Tolerance: 5`` vs ``RAID 5`` vs ``ADG``, ``Accelerator Ratio`` vs
``Cache Ratio``, ``Battery Status`` vs ``Battery/Capacitor Status``) are absorbed here; what
is absent becomes None, what is malformed fails that controller only.
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
    MAX_DRIVES,
    AdapterName,
    BackupUnit,
    Controller,
    ControllerError,
    ControllerSetting,
    DriveCache,
    PhysicalDrive,
    VirtualDrive,
)

COMMAND = ("ctrl", "all", "show", "config", "detail")
#: more controllers than PCI slots on any server: the text is not what we think it is
MAX_CONTROLLERS = 64
_NO_CONTROLLERS = "no controllers detected"  # ssacli says so and exits 1 on a host without any
_UNASSIGNED = ("unassigned", "HBA Drives")
_UNITS = ("B", "KB", "MB", "GB", "TB")
#: the only words a write puts on ssacli's command line: setting -> value -> word
SET_WORDS: dict[str, dict[str, str]] = {
    "write_policy": {"write-back": "enable", "write-through": "disable"},
    "drive_cache": {"enabled": "enable", "disabled": "disable", "default": "default"},
}
_DRIVE_CACHE: dict[str, DriveCache] = {
    "enabled": "enabled", "enable": "enabled", "disabled": "disabled", "disable": "disabled",
    "default": "default"}
_WHY_NOT = {
    "read_policy": "Smart Array has no per-volume read-ahead (the cache ratio is controller wide)",
    "write_policy": "always-write-back is the controller-wide no-battery write cache",
}
#: controllers whose drive write cache policy is set per usage (configured / unconfigured / HBA)
_USAGE_GENERATIONS = ("Gen10", "Gen11")


@dataclass
class _Section:
    """One ``Logical Drive`` or ``physicaldrive`` block: its keys (first wins) and members."""

    name: str
    array: str | None
    keys: dict[str, str] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)
    key_indent: int | None = None


@dataclass
class _Block:
    """One controller's share of the text, split into its own keys and its sections."""

    header: str
    keys: dict[str, str] = field(default_factory=dict)
    logical: list[_Section] = field(default_factory=list)
    physical: list[_Section] = field(default_factory=list)


class SmartArrayAdapter:
    name: AdapterName = "smartarray"
    tools: tuple[str, ...] = ("ssacli", "hpssacli", "hpacucli")

    def discover(self, runner: ToolRunner, tool: str) -> tuple[list[Controller], list[ControllerError]]:
        def fail(index: int | None, message: str) -> ControllerError:
            return ControllerError(adapter=self.name, tool=tool, index=index, message=message[:2000])

        argv = [tool, *COMMAND]
        try:
            result = run_ok(runner, argv, ok_exit=(0, 1))
            text = result.stdout.decode("utf-8")
        except ToolFailure as exc:
            return [], [fail(None, str(exc))]
        except UnicodeDecodeError:
            return [], [fail(None, f"`{' '.join(argv)}` did not print text (invalid UTF-8)")]
        if _NO_CONTROLLERS in text.lower():
            return [], []  # the tool is installed but this host has no Smart Array: nothing to manage
        if result.exit_code != 0:
            detail = (result.stderr or result.stdout).decode("utf-8", "replace").strip()[:200]
            return [], [fail(None, f"`{' '.join(argv)}` exited with status 1"
                                   + (f": {detail}" if detail else ""))]
        try:
            blocks = split_blocks(text)
        except ToolFailure as exc:
            return [], [fail(None, f"`{' '.join(argv)}`: {exc}")]
        controllers: list[Controller] = []
        errors: list[ControllerError] = []
        for position, block in enumerate(blocks):
            index = slot_of(block.header)
            try:
                if index is None:
                    raise ToolFailure(f"controller {block.header[:80]!r}: no slot number in its header")
                controllers.append(parse_controller(self.name, tool, index, block))
            except UNREADABLE as exc:
                errors.append(fail(index, unreadable(exc)))
            if position + 1 >= MAX_CONTROLLERS and len(blocks) > MAX_CONTROLLERS:
                errors.append(fail(None, f"more than {MAX_CONTROLLERS} controllers: the rest ignored"))
                break
        return controllers, errors

    def set_policy(self, runner: ToolRunner, tool: str, controller: Controller, vd: VirtualDrive,  # noqa: PLR0917
                   setting: ControllerSetting, value: str) -> None:
        word = SET_WORDS.get(setting, {}).get(value)
        per_usage = any(g in controller.model for g in _USAGE_GENERATIONS)
        if word is None or (word == "default" and not per_usage):
            why = _WHY_NOT.get(setting, "") if word is None else "only Gen10 and later have a default policy"
            raise unsupported(controller, vd, setting, value, offered=SET_WORDS, why=why)
        slot = f"slot={controller.index}"
        if setting == "write_policy":
            argv = [tool, "ctrl", slot, "ld", str(vd.id), "modify", f"caching={word}"]
        else:  # forced: without it ssacli asks for a y/n confirmation it cannot get
            usage = ["usage=configured"] if per_usage else []
            argv = [tool, "ctrl", slot, "modify", f"drivewritecache={word}", *usage, "forced"]
        context = where(controller, vd, setting, value)
        result = run_write(runner, argv, context)
        if b"\x00" in result.stdout:
            raise ToolFailure(f"{context}: `{' '.join(argv)}` printed binary garbage")
        text = (result.stdout + result.stderr).decode("utf-8", "replace")
        error = next((line.strip() for line in text.splitlines() if "error" in line.lower()), None)
        if error is not None:  # some failures still exit 0
            raise ToolFailure(f"{context}: `{' '.join(argv)}` failed: {error[:200]}")


def split_blocks(text: str) -> list[_Block]:
    """The text cut into controller blocks; each line read once, sections closed by indentation."""
    blocks: list[_Block] = []
    block: _Block | None = None
    section: _Section | None = None
    section_indent = 0
    ctrl_indent: int | None = None  # indentation of the controller's own keys
    array: str | None = None
    skipping: int | None = None  # inside a section that is not ours (enclosure, port ...): its indent
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.lstrip(" \t")
        if not stripped:
            continue
        indent = len(line) - len(stripped)
        if indent == 0:
            if " in Slot " not in stripped:
                continue  # notes and warnings ssacli prints between controllers
            if len(blocks) > MAX_CONTROLLERS:
                break
            block = _Block(header=stripped)
            blocks.append(block)
            section, ctrl_indent, array, skipping = None, None, None, None
            continue
        if block is None:
            continue  # text before the first controller: banners, not data
        if skipping is not None:
            if indent > skipping:
                continue
            skipping = None
        if section is not None and indent <= section_indent:
            section = None
        word, _, rest = stripped.partition(" ")
        key, sep, value = stripped.partition(": ")
        if stripped.startswith("Array: ") or stripped.startswith("Array:"):
            array, section = stripped[len("Array:"):].strip() or "?", None
            continue
        if stripped in _UNASSIGNED:
            array, section = None, None
            continue
        if stripped.startswith("Logical Drive: "):
            name = stripped[len("Logical Drive: "):].strip()
            section, section_indent = _Section(name=name, array=array), indent
            block.logical.append(section)
            _bound(block.logical, "logical drives")
            continue
        if word == "physicaldrive":
            slot = rest.split(" ", 1)[0]
            if "(" in rest:  # a member listed inside a logical drive (or an array summary)
                if section is not None and section in block.logical and slot not in section.members:
                    section.members.append(slot)
                    _bound(section.members, "member drives")
                continue
            section, section_indent = _Section(name=slot, array=array), indent
            block.physical.append(section)
            _bound(block.physical, "physical drives")
            continue
        if section is not None:
            if sep and (section.key_indent is None or indent == section.key_indent):
                section.key_indent = indent
                section.keys.setdefault(key.strip(), value.strip())
            continue
        if ctrl_indent is None and sep and array is None:
            ctrl_indent = indent
        if sep and indent == ctrl_indent and array is None:
            block.keys.setdefault(key.strip(), value.strip())
        elif not sep and ctrl_indent is not None and indent <= ctrl_indent:
            skipping, array = indent, None  # "Enclosure SEP ...", "Expander 378": not ours
    if not blocks and text.strip():
        raise ToolFailure(f"no controller header (\"... in Slot N\") in the output: {text.strip()[:200]!r}")
    return blocks


def slot_of(header: str) -> int | None:
    after = header.split(" in Slot ", 1)[1] if " in Slot " in header else ""
    slot = after.split(" ", 1)[0]
    return int(slot) if digits(slot) and len(slot) <= 4 and int(slot) <= 1023 else None


def parse_controller(adapter: AdapterName, tool: str, index: int, block: _Block) -> Controller:
    keys = block.keys
    model = block.header.split(" in Slot ", 1)[0].strip()
    if not model:
        raise ToolFailure(f"controller {index}: no model in its header")
    read_pct, write_pct = parse_ratio(keys.get("Cache Ratio") or keys.get("Accelerator Ratio"), index)
    members_by_array: dict[str | None, list[str]] = {}
    for pd in block.physical:
        if "spare" not in pd.keys.get("Drive Type", "").lower():
            members_by_array.setdefault(pd.array, []).append(pd.name)
    # Gen10: a policy per drive usage; older: one switch for every drive (controller wide either way)
    policy = keys.get("Configured Drive Write Cache Policy") or keys.get("Drive Write Cache") or ""
    drive_cache = _DRIVE_CACHE.get(policy.strip().lower())
    return Controller(
        adapter=adapter, tool=tool, index=index, model=model,
        serial=keys.get("Serial Number") or None,
        firmware_version=keys.get("Firmware Version") or None,
        pci_address=keys.get("PCI Address (Domain:Bus:Device.Function)") or None,
        driver=keys.get("Driver Name") or None,
        cache_size_bytes=parse_cache_size(keys.get("Total Cache Size")),
        cache_read_percent=read_pct, cache_write_percent=write_pct,
        backup=parse_backup(keys),
        virtual_drives=sorted((parse_logical_drive(ld, members_by_array, drive_cache)
                               for ld in block.logical), key=lambda v: v.id),
        physical_drives=[parse_physical_drive(pd) for pd in block.physical],
    )


def parse_ratio(value: str | None, index: int) -> tuple[int | None, int | None]:
    """``"10% Read / 90% Write"`` -> (10, 90); absent (no cache board) -> (None, None)."""
    if value is None or value.strip().lower() in ("", "n/a", "not configured"):
        return None, None
    out: dict[str, int] = {}
    for part in value.split("/"):
        number, _, what = part.strip().partition("%")
        if not digits(number) or len(number) > 3 or what.strip().lower() not in ("read", "write"):
            raise ToolFailure(f"controller {index}: unreadable cache ratio {value[:80]!r}")
        out[what.strip().lower()] = int(number)
    if set(out) != {"read", "write"}:
        raise ToolFailure(f"controller {index}: unreadable cache ratio {value[:80]!r}")
    return out["read"], out["write"]


def parse_cache_size(value: str | None) -> int | None:
    """``"2.0"`` (ssacli: GB implied), ``"1024 MB"``, ``"4 GB"`` -> bytes."""
    if value is None or value.strip() in ("", "N/A", "0"):
        return None
    text = value.strip()
    if not text.upper().endswith(_UNITS):
        text += " GB"
    return parse_size(text)


def parse_backup(keys: dict[str, str]) -> BackupUnit:
    count = keys.get("Battery/Capacitor Count") or keys.get("Battery Pack Count")
    state = keys.get("Battery/Capacitor Status") or keys.get("Battery Status")
    if (count is not None and count.strip() == "0") or (count is None and state is None):
        return BackupUnit(kind="none")
    return BackupUnit(kind="bbu", state=state or None, optimal=(state or "").strip().upper() == "OK")


def raid_level(value: str | None, ld: str) -> str:
    """``Fault Tolerance``: ``1+0`` / ``RAID 1+0`` -> ``RAID10``, ``ADG`` -> ``RAID6``."""
    text = (value or "").strip().upper()
    if text.startswith("RAID"):
        text = text[4:].strip()
    text = text.replace("+", "").replace(" ", "")
    if text == "ADG":
        text = "6"
    if not text or len(text) > 16 or not all(ch.isalnum() or ch in "()" for ch in text):
        raise ToolFailure(f"logical drive {ld}: unknown fault tolerance {value!r}")
    return f"RAID{text}"


def parse_logical_drive(ld: _Section, members_by_array: dict[str | None, list[str]],
                        drive_cache: DriveCache | None = None) -> VirtualDrive:
    if not digits(ld.name) or len(ld.name) > 5:
        raise ToolFailure(f"logical drive {ld.name[:40]!r}: not a number")
    keys = ld.keys
    caching = (keys.get("Caching") or keys.get("Array Accelerator") or "").lower()  # hpacucli: the latter
    disk = keys.get("Disk Name", "").split(" ", 1)[0] or None
    if disk is not None and not disk.startswith("/dev/"):
        raise ToolFailure(f"logical drive {ld.name}: disk name {disk[:80]!r} is not under /dev/")
    # members: listed under the drive by newer tools; otherwise every data drive of its array
    drives = ld.members or members_by_array.get(ld.array, [])
    return VirtualDrive(
        id=int(ld.name), name=keys.get("Logical Drive Label", ""),
        raid_level=raid_level(keys.get("Fault Tolerance"), ld.name),
        state=keys.get("Status") or "unknown", size_bytes=parse_size(keys.get("Size")),
        strip_size_bytes=parse_size(keys.get("Strip Size")),
        drive_count=len(drives) or None,
        caching=None if caching not in ("enabled", "disabled") else caching == "enabled",
        # the controller cache serving the volume is its write-back (falling back to write-through
        # without a charged battery, like MegaRAID's WB); not serving it is write-through
        write_policy=None if caching not in ("enabled", "disabled")
        else "write-back" if caching == "enabled" else "write-through",
        drive_cache=drive_cache,
        wwn=keys.get("Unique Identifier") or None, block_device=disk, drives=drives,
    )


def parse_physical_drive(pd: _Section) -> PhysicalDrive:
    keys = pd.keys
    interface = keys.get("Interface Type")
    model = " ".join(keys.get("Model", "").split()) or None
    return PhysicalDrive(
        slot=pd.name, state=keys.get("Status") or "unknown", interface=interface,
        media=None if interface is None else "SSD" if "solid state" in interface.lower() else "HDD",
        model=model, size_bytes=parse_size(keys.get("Size")),
    )


def _bound(items: list[_Section] | list[str], what: str) -> None:
    if len(items) > MAX_DRIVES:
        raise ToolFailure(f"more than {MAX_DRIVES} {what} on one controller")

