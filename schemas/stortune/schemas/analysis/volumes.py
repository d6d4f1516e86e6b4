"""Hardware RAID volumes: what a virtual drive's level and strip mean for the layout above it.

A controller's strip size and RAID level cannot change in place (only by rebuilding the
volume), so the analysis shows them and checks the layout against them: the stripe a
filesystem and a partition should follow is the strip x the data drives. Levels are
normalised across vendors (storcli ``RAID5``, arcconf ``RAID1E``, ssacli ``RAID 1+0``); a
level stortune does not model (``RAID 1ADM``, ``Simple_volume``, ``RAID1E``) is not judged,
and the analysis says so instead of guessing its geometry.

Facts come from the device's ``VolumeRef``; the volume's state, span depth and drive media,
when the mapping did not carry them, from the host's controller inventory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from stortune.schemas.controllers import ControllerInventory, VirtualDrive, VolumeRef
from stortune.schemas.topology import Device, Topology

#: The levels whose geometry and write penalty stortune models, as RAID planning names them.
MODELLED: Final = frozenset({"raid0", "raid1", "raid5", "raid6", "raid10", "raid50", "raid60"})
#: The tools' words for a volume with nothing wrong (storcli Optl, ssacli OK, arcconf Optimal).
OPTIMAL_STATES: Final = frozenset({"optl", "optimal", "ok"})
_PARITY: Final = {"raid5": 1, "raid50": 1, "raid6": 2, "raid60": 2}
_LEVEL: Final = re.compile(r"raid(\d{1,2})", re.ASCII)
_BACKUP: Final = {"bbu": "BBU", "cachevault": "CacheVault"}


def level(raw: str) -> str | None:
    """``RAID5``, ``raid 5``, ``RAID 1+0``, ``RAID10`` -> raid5 / raid10; None when not modelled."""
    text = re.sub(r"[\s+_-]", "", raw.lower())
    match = _LEVEL.fullmatch(text)
    found = f"raid{match.group(1)}" if match else None
    return found if found in MODELLED else None


@dataclass(frozen=True)
class Volume:
    """A mapped virtual drive with what the analysis needs, the inventory's facts filled in."""

    device: str
    ref: VolumeRef
    level: str | None  # normalised, None: not modelled
    state: str | None
    span_depth: int | None
    media: str | None  # "SSD" / "HDD" when every drive behind it agrees

    @property
    def shown_level(self) -> str:
        """``RAID5`` for a level modelled (mappings may normalise it to ``raid5``), else the
        tool's own word."""
        return self.level.upper() if self.level is not None else self.ref.raid_level

    @property
    def drives(self) -> int | None:
        return self.ref.physical_drives

    def data_drives(self) -> int | None:
        """Drives carrying data in one stripe; None when the level, the drive count or (RAID50/60)
        the span depth is unknown, or the numbers do not make such a volume (not judged)."""
        n, lvl = self.ref.physical_drives, self.level
        if n is None or lvl is None:
            return None
        if lvl == "raid0":
            return n
        if lvl == "raid1":
            return 1 if n >= 2 else None
        if lvl == "raid10":
            return n // 2 if n >= 4 and n % 2 == 0 else None
        parity = _PARITY[lvl]
        spans = 1 if lvl in ("raid5", "raid6") else self.span_depth
        if spans is None or (lvl in ("raid50", "raid60") and spans < 2) or n % spans:
            return None
        if n // spans < parity + 2:  # a RAID5 group has at least 3 drives, a RAID6 one 4
            return None
        return n - spans * parity

    def summary(self) -> str:
        """``PERC H710 VD0 RAID5, 8 drives, 256 KiB strip, CacheVault Optimal``."""
        ref = self.ref
        words = [f"{ref.model} VD{ref.virtual_drive} {self.shown_level}"]
        if ref.physical_drives is not None:
            words.append(f"{ref.physical_drives} drive{'s' if ref.physical_drives != 1 else ''}")
        if self.span_depth and self.span_depth > 1:
            words.append(f"{self.span_depth} spans")
        if ref.strip_size_bytes is not None:
            words.append(f"{size(ref.strip_size_bytes)} strip")
        if self.state is not None and self.state.lower() not in OPTIMAL_STATES:
            words.append(f"state {self.state}")
        backup = _BACKUP.get(ref.backup.kind)
        words.append(f"{backup} {ref.backup.state or '?'}" if backup else "no cache backup")
        return ", ".join(words)


def size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


_Key = tuple[str, int, int]  # adapter, controller index, virtual drive id


def _inventory_index(inventory: ControllerInventory | None) -> dict[_Key, tuple[VirtualDrive, str | None]]:
    """Each virtual drive of the inventory by its key, with its drives' common media ("SSD" /
    "HDD", None when they differ or are not reported). Built once per host: a lookup per
    volume would walk every controller's drives again (a hostile inventory of thousands)."""
    out: dict[_Key, tuple[VirtualDrive, str | None]] = {}
    for ctl in inventory.controllers if inventory is not None else ():
        media_of = {d.slot: (d.media or "").upper() for d in ctl.physical_drives}
        for vd in ctl.virtual_drives:
            key = (ctl.adapter, ctl.index, vd.id)
            if key in out:
                continue  # the same controller twice (a tool listed it twice): the first one
            media = {media_of.get(slot, "") for slot in vd.drives}
            out[key] = (vd, next(iter(media)) if len(media) == 1 and media <= {"SSD", "HDD"} else None)
    return out


def _volume(dev: Device, ref: VolumeRef, found: tuple[VirtualDrive, str | None] | None) -> Volume:
    vd, media = found if found is not None else (None, None)
    state = ref.state if ref.state is not None else (vd.state if vd else None)
    spans = ref.span_depth if ref.span_depth is not None else (vd.span_depth if vd else None)
    return Volume(device=dev.name, ref=ref, level=level(ref.raid_level), state=state, span_depth=spans,
                  media=media)


def by_device(topology: Topology) -> dict[str, Volume]:
    """Every mapped controller volume of the host by device name, the inventory's facts filled in."""
    mapped = [(d, d.controller) for d in topology.devices if d.controller is not None]
    if not mapped:
        return {}
    inventory = _inventory_index(topology.controllers)
    return {d.name: _volume(d, ref, inventory.get((ref.adapter, ref.controller, ref.virtual_drive)))
            for d, ref in mapped}


#: A tool's error message as the listings show it: one line, this long at most.
MESSAGE_SHOWN: Final = 160


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MESSAGE_SHOWN else flat[:MESSAGE_SHOWN - 3] + "..."


def inventory_lines(inventory: ControllerInventory) -> list[str]:
    """The host's controllers, short: one line each, then each tool error, then the adapters
    whose tool is not installed (not managed, which is not an error)."""
    out: list[str] = []
    for ctl in inventory.controllers:
        words = [f"{ctl.adapter} {ctl.index}: {ctl.model}"]
        if ctl.firmware_version:
            words.append(f"firmware {ctl.firmware_version}")
        vds, pds = len(ctl.virtual_drives), len(ctl.physical_drives)
        words.append(f"{vds} virtual drive{'s' if vds != 1 else ''}, {pds} physical")
        bad = [v for v in ctl.virtual_drives if v.state.strip().lower() not in OPTIMAL_STATES]
        if bad:
            words.append("not optimal: " + ", ".join(f"VD{v.id} {v.state}" for v in bad[:4])
                         + (f" and {len(bad) - 4} more" if len(bad) > 4 else ""))
        backup = _BACKUP.get(ctl.backup.kind)
        words.append(f"{backup} {ctl.backup.state or '?'}" if backup else "no cache backup")
        out.append(", ".join(words))
    for err in inventory.errors:
        which = f" controller {err.index}" if err.index is not None else ""
        out.append(f"error: {err.adapter}{which} ({err.tool}): {_one_line(err.message)}")
    if inventory.unmanaged:
        out.append(f"not managed (no tool on the tool path): {', '.join(sorted(set(inventory.unmanaged)))}")
    return out
