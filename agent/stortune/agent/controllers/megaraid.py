"""Broadcom/LSI MegaRAID (``storcli64``) and Dell PERC (``perccli64``, the same CLI rebranded).

Three JSON answers, each ``{"Controllers": [{"Command Status": ..., "Response Data": ...}]}``
with one entry per controller:

- ``/call show all J``: ``Basics``, ``Version``, ``HwCfg``, ``BBU_Info`` / ``Cachevault_Info``,
  ``PD LIST``;
- ``/call/vall show all J``: per VD ``/cN/vM`` (the row with ``TYPE`` and ``Cache``),
  ``PDs for VD M`` and ``VDM Properties`` (strip, drives per span, disk cache, NAA id);
- ``/call/eall/sall show all J``: per drive ``Drive /cN/eE/sS - Detailed Information``
  holding the media error and predictive failure counters.

Writes are ``/cN/vM set rdcache=RA|NoRA|ADRA``, ``wrcache=WT|WB|AWB``, ``pdcache=On|Off|Default``
with ``J``: one JSON answer whose ``Command Status`` says Success or Failure and whose
``Detailed Status`` rows name the property and an ``ErrMsg``. Adaptive read-ahead (``ADRA``)
exists only on older firmware (PERC 5 to H710 generations, where it is the factory setting),
and current storcli documents RA/NoRA only: ``ADRA`` is still sent for ``adaptive``, because
putting a PERC's original adaptive policy back must be possible, and a firmware without it
answers Failure, which fails (and rolls back) that apply.

Parsing is pure (``parse_*``) and kept apart from running the tool. Keys differ between
CLI and firmware generations (older ones lack ``Version`` and ``SCSI NAA Id``, say
``Number of Drives`` instead of ``Number of Drives Per Span``, spell sizes ``1024 MB`` or
``1024MB``): what is absent becomes None, what is malformed fails that controller only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stortune.agent.controllers.base import (
    UNREADABLE,
    ToolFailure,
    digits,
    loads_json,
    run_json,
    run_write,
    unreadable,
    unsupported,
    where,
)
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import (
    AdapterName,
    BackupUnit,
    Controller,
    ControllerError,
    ControllerSetting,
    DriveCache,
    IOPolicy,
    PhysicalDrive,
    ReadPolicy,
    VirtualDrive,
    WritePolicy,
)

Json = Mapping[str, Any]
_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}
#: bounded digits: a float of hundreds of them is infinity, which no size can be rounded from
_SIZE = re.compile(r"^\s*([0-9]{1,20}(?:\.[0-9]{1,20})?)\s*([KMGTP]?B)\s*$", re.IGNORECASE)
# [0-9], not \d: \d takes any script's digits, which are no controller's numbers
_VD_KEY = re.compile(r"^/c([0-9]+)/v([0-9]+)$")
_DRIVE_KEY = re.compile(r"^Drive /c[0-9]+/e([0-9]+)/s([0-9]+) - Detailed Information$")
_BACKUP_OK = {"optimal", "ok", "good"}
_READ: dict[str, ReadPolicy] = {"ADRA": "adaptive", "NR": "no-read-ahead", "R": "read-ahead"}
_WRITE: dict[str, WritePolicy] = {"AWB": "always-write-back", "WB": "write-back", "WT": "write-through"}
_IO: dict[str, IOPolicy] = {"C": "cached", "D": "direct"}
_ANY_EXIT = tuple(range(256))
#: the only words a write puts on storcli's command line: setting -> (storcli key, value -> word)
SET_WORDS: dict[str, tuple[str, dict[str, str]]] = {
    "read_policy": ("rdcache", {"read-ahead": "RA", "no-read-ahead": "NoRA", "adaptive": "ADRA"}),
    "write_policy": ("wrcache", {"write-back": "WB", "write-through": "WT", "always-write-back": "AWB"}),
    "drive_cache": ("pdcache", {"enabled": "On", "disabled": "Off", "default": "Default"}),
}


class MegaRaidAdapter:
    """storcli64 and its rebrands; ``name`` says which family the tool belongs to."""

    def __init__(self, name: AdapterName = "megaraid", tools: tuple[str, ...] = ("storcli64", "storcli")):
        self.name: AdapterName = name
        self.tools = tools

    def discover(self, runner: ToolRunner, tool: str) -> tuple[list[Controller], list[ControllerError]]:
        def fail(index: int | None, message: str) -> ControllerError:
            return ControllerError(adapter=self.name, tool=tool, index=index, message=message[:2000])

        try:
            shows = responses(run_json(runner, [tool, "/call", "show", "all", "J"]))
            vds = responses(run_json(runner, [tool, "/call/vall", "show", "all", "J"]))
            pds = responses(run_json(runner, [tool, "/call/eall/sall", "show", "all", "J"]))
        except ToolFailure as exc:
            return [], [fail(None, str(exc))]
        controllers: list[Controller] = []
        errors: list[ControllerError] = []
        for index, data in shows.items():
            if isinstance(data, ToolFailure):
                errors.append(fail(index, str(data)))
                continue
            try:
                vd = vds.get(index, {})
                pd = pds.get(index, {})
                if isinstance(vd, ToolFailure) and not _no_vds(vd):
                    raise vd
                if isinstance(pd, ToolFailure):
                    pd = {}  # counters unavailable: the drives are still listed, counters None
                controllers.append(parse_controller(
                    self.name, tool, index, data, vall={} if isinstance(vd, ToolFailure) else vd, sall=pd))
            except UNREADABLE as exc:
                errors.append(fail(index, unreadable(exc)))
        return controllers, errors

    def set_policy(self, runner: ToolRunner, tool: str, controller: Controller, vd: VirtualDrive,  # noqa: PLR0917
                   setting: ControllerSetting, value: str) -> None:
        key, words = SET_WORDS.get(setting, ("", {}))
        word = words.get(value)
        if not key or word is None:
            why = ""
            raise unsupported(controller, vd, setting, value,
                              offered={k: w for k, (_, w) in SET_WORDS.items()}, why=why)
        context = where(controller, vd, setting, value)
        argv = [tool, f"/c{controller.index}/v{vd.id}", "set", f"{key}={word}", "J"]
        cmd = " ".join(argv)
        # any exit status: a failing storcli still says why in its JSON, read that first
        result = run_write(runner, argv, context, ok_exit=_ANY_EXIT)
        try:
            doc = loads_json(result.stdout)
        except ToolFailure:
            text = result.stdout.decode("utf-8", "replace").strip()[:200]
            raise ToolFailure(f"{context}: `{cmd}` exited with status {result.exit_code} without a JSON"
                              f" answer: {text!r}") from None
        failure = set_failure(doc, controller.index)
        if failure is not None or result.exit_code != 0:
            raise ToolFailure(f"{context}: `{cmd}` failed (exit status {result.exit_code}):"
                              f" {failure or 'the answer reports no failure'}")


def set_failure(doc: object, index: int) -> str | None:
    """Why a ``set`` answer is not a success for controller ``index``, None when it is one: the
    ``Command Status`` must say Success and every ``Detailed Status`` row too."""
    entries = doc.get("Controllers") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return 'unexpected JSON: no "Controllers" list'
    for entry in entries:
        status = _obj(entry, "Command Status")
        if status is None or str(status.get("Controller")) != str(index):
            continue
        rows = _rows(_obj(entry, "Response Data") or {}, "Detailed Status")
        bad = [r for r in rows if _text(r.get("Status")) != "Success"]
        if status.get("Status") != "Success" or bad:
            messages = [m for r in bad if (m := _text(r.get("ErrMsg"))) and m != "-"]
            detail = _text(status.get("Description"))
            return "; ".join(messages) or (detail if detail and detail != "None" else "status Failure")
        return None
    return f"the answer has no status for controller {index}"


def responses(doc: object) -> dict[int, Json | ToolFailure]:
    """Each controller's ``Response Data`` by index, or the failure its ``Command Status`` reports."""
    if not isinstance(doc, dict) or not isinstance(doc.get("Controllers"), list):
        raise ToolFailure('unexpected JSON: no "Controllers" list')
    out: dict[int, Json | ToolFailure] = {}
    for entry in doc["Controllers"]:
        status = _obj(entry, "Command Status") if isinstance(entry, dict) else None
        if status is None:
            raise ToolFailure('unexpected JSON: a controller entry without "Command Status"')
        index = status.get("Controller")
        if isinstance(index, str) and digits(index) and len(index) <= 4:
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= 1023:
            raise ToolFailure(f'unexpected JSON: controller index {index!r}')
        if status.get("Status") != "Success":
            out[index] = ToolFailure(f"controller {index}: {status.get('Description') or 'failed'}")
            continue
        data = _obj(entry, "Response Data")
        if data is None:
            raise ToolFailure(f'unexpected JSON: controller {index} without "Response Data"')
        out[index] = data
    return out


def parse_controller(adapter: AdapterName, tool: str, index: int, show: Json, *, vall: Json,
                     sall: Json) -> Controller:
    basics = _obj(show, "Basics") or {}
    version = _obj(show, "Version") or {}
    hw = _obj(show, "HwCfg") or {}
    model = _text(basics.get("Model")) or _text(show.get("Product Name"))
    if not model:
        raise ToolFailure(f'controller {index}: no "Basics"/"Model" in the answer')
    counters = parse_drive_counters(sall)
    drives = [parse_physical_drive(row, counters) for row in _rows(show, "PD LIST")]
    return Controller(
        adapter=adapter, tool=tool, index=index, model=model,
        serial=_text(basics.get("Serial Number")),
        pci_address=_text(basics.get("PCI Address")),
        firmware_version=_text(version.get("Firmware Version") or show.get("FW Version")),
        firmware_package=_text(version.get("Firmware Package Build") or show.get("FW Package Build")),
        driver=_text(version.get("Driver Name")),
        cache_size_bytes=parse_size(hw.get("On Board Memory Size")),
        backup=parse_backup(show, hw),
        virtual_drives=parse_virtual_drives(vall),
        physical_drives=drives,
    )


def parse_backup(show: Json, hw: Json) -> BackupUnit:
    for key, kind in (("Cachevault_Info", "cachevault"), ("BBU_Info", "bbu")):
        rows = _rows(show, key)
        if rows:
            state = _text(rows[0].get("State"))
            return BackupUnit(kind="cachevault" if kind == "cachevault" else "bbu", state=state,
                              optimal=(state or "").lower() in _BACKUP_OK)
    if str(hw.get("BBU", "")).lower() == "present":  # present but its details not reported
        return BackupUnit(kind="bbu", state=None, optimal=False)
    return BackupUnit(kind="none")


def parse_virtual_drives(vall: Json) -> list[VirtualDrive]:
    out: list[VirtualDrive] = []
    for key, value in vall.items():
        match = _VD_KEY.match(key)
        if not match or not isinstance(value, list) or not value or not isinstance(value[0], dict):
            continue
        vd = int(match.group(2))
        row: Json = value[0]
        props = _obj(vall, f"VD{vd} Properties") or {}
        read, write, io = parse_cache_flags(_text(row.get("Cache")) or "", vd)
        per_span = _int(props.get("Number of Drives Per Span", props.get("Number of Drives")))
        depth = _int(props.get("Span Depth"))
        dg = str(row.get("DG/VD", "")).split("/")[0]
        out.append(VirtualDrive(
            id=vd, drive_group=int(dg) if digits(dg) and len(dg) <= 5 else None,
            name=_text(row.get("Name")) or "", raid_level=_text(row.get("TYPE")) or "unknown",
            state=_text(row.get("State")) or "unknown", size_bytes=parse_size(row.get("Size")),
            strip_size_bytes=parse_size(props.get("Strip Size")),
            drive_count=per_span * (depth or 1) if per_span is not None else None,
            span_depth=depth, read_policy=read, write_policy=write, io_policy=io,
            drive_cache=parse_drive_cache(props.get("Disk Cache Policy")),
            wwn=_text(props.get("SCSI NAA Id")),
            drives=[s for r in _rows(vall, f"PDs for VD {vd}") if (s := _text(r.get("EID:Slt")))],
        ))
    return sorted(out, key=lambda v: v.id)


def parse_cache_flags(flags: str, vd: int) -> tuple[ReadPolicy, WritePolicy, IOPolicy]:
    """storcli's ``Cache`` column: read (``ADRA``/``NR``/``R``) + write (``AWB``/``WB``/``WT``)
    + I/O (``C``/``D``), e.g. ``RWBD``, ``NRWTD``, ``ADRAWBC``. Longest prefixes first."""
    rest = flags.strip()
    read = next((v for k, v in _READ.items() if rest.startswith(k)), None)
    rest = rest[len(next((k for k in _READ if rest.startswith(k)), "")):]
    write = next((v for k, v in _WRITE.items() if rest.startswith(k)), None)
    rest = rest[len(next((k for k in _WRITE if rest.startswith(k)), "")):]
    io = _IO.get(rest)
    if read is None or write is None or io is None:
        raise ToolFailure(f"virtual drive {vd}: unknown cache policy {flags!r}"
                          " (expected read ADRA/NR/R, write AWB/WB/WT, I/O C/D)")
    return read, write, io


def parse_drive_cache(value: object) -> DriveCache | None:
    text = (_text(value) or "").lower()
    if not text:
        return None
    if "default" in text:
        return "default"
    if text in ("enabled", "enable", "on"):
        return "enabled"
    if text in ("disabled", "disable", "off"):
        return "disabled"
    raise ToolFailure(f"unknown disk cache policy {value!r}")


def parse_drive_counters(sall: Json) -> dict[str, Json]:
    """``EID:Slt`` -> the drive's ``State`` block (error counters) from ``/call/eall/sall``."""
    out: dict[str, Json] = {}
    for key, value in sall.items():
        match = _DRIVE_KEY.match(key)
        if match and isinstance(value, dict):
            e, s = match.groups()
            state = _obj(value, f"Drive /c{key.split('/c', 1)[1].split('/', 1)[0]}/e{e}/s{s} State")
            if state is not None:
                out[f"{e}:{s}"] = state
    return out


def parse_physical_drive(row: Json, counters: Mapping[str, Json]) -> PhysicalDrive:
    slot = _text(row.get("EID:Slt")) or "?"
    c = counters.get(slot, {})
    smart = _text(c.get("S.M.A.R.T alert flagged by drive"))
    return PhysicalDrive(
        slot=slot, device_id=_int(row.get("DID")), state=_text(row.get("State")) or "unknown",
        drive_group=_int(row.get("DG")), interface=_text(row.get("Intf")),
        media=_text(row.get("Med")), model=_text(row.get("Model")),
        size_bytes=parse_size(row.get("Size")),
        media_errors=_int(c.get("Media Error Count")), other_errors=_int(c.get("Other Error Count")),
        predictive_failures=_int(c.get("Predictive Failure Count")),
        smart_alert=None if smart is None else smart.lower() == "yes",
    )


def parse_size(value: object) -> int | None:
    """``"64 KB"``, ``"2048MB"``, ``"1.089 TB"`` -> bytes (binary units, as storcli means them)."""
    text = _text(value)
    if text is None or text.upper() in ("NA", "N/A", "-"):
        return None
    match = _SIZE.match(text)
    if not match:
        raise ToolFailure(f"unreadable size {text!r}")
    return round(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _no_vds(failure: ToolFailure) -> bool:
    # a controller without virtual drives answers /vall with a failure status, not an empty list
    return "no vd" in str(failure).lower()


def _obj(doc: object, key: str) -> Json | None:
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, dict) else None


def _rows(doc: Json, key: str) -> list[Json]:
    value = doc.get(key)
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _text(value: object) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    text = str(value).strip()
    return text or None


def _int(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"-?[0-9]{1,20}", text):
        return int(text)
    if text in ("", "-", "NA", "N/A"):
        return None
    raise ToolFailure(f"expected a number, got {text!r}")

