"""Layout checks: what in a device's layout costs performance or safety, from the topology alone.

Codes are stable (dashboards and tests key on them):

* ``partition-misaligned``: a partition whose start is off 1 MiB, the disk's optimal I/O size,
  its array's chunk, or a hardware RAID volume's strip or stripe (a DOS-era start at sector 63
  under a 512 KiB chunk splits I/O forever);
* ``fs-geometry``: XFS sunit/swidth (512-byte units in the mount's options) or ext4 stripe=
  (4 KiB blocks) against the array's chunk (a hardware volume's strip) x data disks, else the
  device's I/O size hints;
* ``lvm-misaligned``: a dm/LVM device whose start is off its lower devices' alignment;
* ``raid5-wide``: a RAID5/6 of more than 8 disks (md, or a controller's volume or span);
* ``array-degraded`` (md, or a controller volume whose tool says it is not optimal),
  ``array-resyncing``;
* ``volume-not-judged``: a hardware volume whose level stortune does not model, or whose drive
  count or span depth is unknown: its geometry is not checked, and this says so;
* ``stripe-cache-ram``: the md stripe cache's RAM (info), a warning above the allowed share.

Each check looks at the device itself (a member's alignment is reported on the member), so a
host's analysis lists each problem once.
"""

from __future__ import annotations

import re
from typing import Final

from stortune.schemas import stripecache
from stortune.schemas.analysis import volumes
from stortune.schemas.analysis.layers import Index
from stortune.schemas.analysis.model import Check, Severity
from stortune.schemas.analysis.raid import RAID5_MAX_WIDTH
from stortune.schemas.analysis.volumes import Volume
from stortune.schemas.topology import Device, DeviceKind, Mount, Topology

_SECTOR: Final = 512
_EXT4_BLOCK: Final = 4096
_KIB: Final = 1024
#: md's sync_completed ("done / total" sectors) and a mount's numeric option: ASCII digits
#: only (str.isdigit takes "²", which int() refuses), at most 20 (a u64): longer is junk.
_PROGRESS = re.compile(r"^ *([0-9]{1,20}) */ *([0-9]{1,20}) *$", re.ASCII)
_NUMBER = re.compile(r"[0-9]{1,20}", re.ASCII)


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def _data_disks(dev: Device) -> int | None:
    md = dev.md
    if md is None or not md.raid_disks:
        return None
    n = md.raid_disks
    level = (md.level or "").lower()
    return {"raid0": n, "raid4": n - 1, "raid5": n - 1, "raid6": n - 2,
            "raid10": n // 2 if n >= 2 else None}.get(level)


def _volume_boundaries(part_start: int, vol: Volume | None) -> list[tuple[str, bool, int]]:
    """(boundary, aligned, bytes off) for a partition of a hardware RAID volume: its strip, and
    the full stripe (strip x data drives) when the volume has more than one data drive."""
    strip = vol.ref.strip_size_bytes if vol is not None else None
    if vol is None or strip is None:
        return []
    start = part_start * _SECTOR
    out = [(f"the volume's {_size(strip)} strip", start % strip == 0, start % strip)]
    data = vol.data_drives()
    if data is not None and data > 1:
        width = strip * data
        out.append((f"its {_size(width)} stripe ({data} data drives x {_size(strip)})",
                    start % width == 0, start % width))
    return out


def _partition(dev: Device, vol: Volume | None) -> list[Check]:
    part = dev.partition
    if part is None:
        return []
    on_volume = _volume_boundaries(part.start_sector, vol)
    if part.aligned and all(ok for _, ok, _ in on_volume):
        return []
    missed = [what for what, ok in (("1 MiB", part.aligned_1mib),
                                    ("the disk's optimal I/O size", part.aligned_optimal_io),
                                    ("the md chunk", part.aligned_md_chunk)) if ok is False]
    missed += [what for what, ok, _ in on_volume if not ok]
    off = part.misalignment_bytes or next((n for _, ok, n in on_volume if not ok), 0)
    # Off only a stripe width that is no power of two (7 data disks x 64 KiB): nothing but the
    # chunk can be aligned to, so this is worth knowing, not fixing; so for a volume's full
    # stripe when its strip is met (the controller's cache absorbs partial stripes).
    widths = {"the disk's optimal I/O size", *(what for what, _, _ in on_volume[1:])}
    width_only = bool(part.aligned_1mib and missed and set(missed) <= widths)
    severity: Severity = "info" if width_only else "warning"
    return [Check(severity=severity, code="partition-misaligned", device=dev.name, message=(
        f"{dev.name} starts at sector {part.start_sector}, {off} bytes off "
        f"{' and '.join(missed) or 'its boundaries'}: I/O straddles chunk or sector boundaries; "
        "only re-partitioning fixes it" + (" (an md member: fail it, re-partition from sector 2048, re-add)"
                                           if part.aligned_md_chunk is not None else "")))]


def _stripe(dev: Device, vol: Volume | None) -> tuple[int, int, str] | None:
    """(stripe unit, stripe width) in bytes the filesystem should use, and where that comes from."""
    data = _data_disks(dev)
    md = dev.md
    if md is not None and md.chunk_bytes and data:
        chunk = md.chunk_bytes
        return (chunk, chunk * data,
                f"{dev.name}, a {md.level} of {md.raid_disks} disks ({data} data disks x {_size(chunk)})")
    if vol is not None:
        strip, data = vol.ref.strip_size_bytes, vol.data_drives()
        # A mirror or a one-drive volume has no stripe for a filesystem to follow; a volume not
        # judged (unknown level or drive count) is not held to its I/O hints either: they come
        # from the same controller and the volume-not-judged check says why.
        if strip is None or data is None or data < 2:
            return None
        return (strip, strip * data, f"{vol.device}, a hardware {vol.shown_level} of {vol.drives}"
                                     f" drives ({data} data drives x {_size(strip)} strip)")
    minimum, optimal = dev.minimum_io_size, dev.optimal_io_size
    if optimal and minimum and optimal > minimum and optimal % minimum == 0:
        hints = f"minimum {_size(minimum)}, optimal {_size(optimal)}"
        return minimum, optimal, f"{dev.name}'s I/O hints ({hints})"
    return None


def _option(mount: Mount, key: str) -> int | None:
    for option in mount.super_options:
        name, _, value = option.partition("=")
        if name == key:
            # junk (0x.., "²", 30 digits, negative) is no geometry: the check then says so
            return int(value) if _NUMBER.fullmatch(value) else None
    return None


def _fs_geometry(dev: Device, vol: Volume | None) -> list[Check]:
    wanted = _stripe(dev, vol)
    if wanted is None:
        return []
    unit, width, why = wanted
    out: list[Check] = []
    for mount in dev.mounts:
        if mount.fstype == "xfs":
            sunit, swidth = _option(mount, "sunit"), _option(mount, "swidth")
            want = (unit // _SECTOR, width // _SECTOR)
            if (sunit, swidth) == want:
                continue
            have = ("no stripe geometry" if sunit is None else
                    f"sunit={sunit},swidth={swidth} ({_size(sunit * _SECTOR)} x "
                    f"{(swidth or 0) // max(sunit, 1)})")
            out.append(Check(severity="warning", code="fs-geometry", device=dev.name, message=(
                f"{mount.mountpoint} (xfs) has {have}, not sunit={want[0]},swidth={want[1]} (512-byte units) "
                f"for {why}: writes are not stripe-aligned and RAID parity is read back; set "
                f"sunit/swidth at mount or mkfs")))
        elif mount.fstype == "ext4":
            stripe = _option(mount, "stripe")
            want_blocks = width // _EXT4_BLOCK
            if stripe == want_blocks:
                continue
            have = "no stripe=" if stripe is None else f"stripe={stripe}"
            out.append(Check(severity="warning", code="fs-geometry", device=dev.name, message=(
                f"{mount.mountpoint} (ext4) has {have}, not stripe={want_blocks} (4 KiB blocks; "
                f"stride={unit // _EXT4_BLOCK}) for {why}: set it with tune2fs -E stride=,stripe_width= "
                "or at mount")))
    return out


def _lvm(dev: Device) -> list[Check]:
    offset = dev.alignment_offset
    if dev.kind is not DeviceKind.DM or offset in (None, 0):
        return []
    what = "cannot be aligned" if offset == -1 else f"starts {offset} bytes off"
    return [Check(severity="warning", code="lvm-misaligned", device=dev.name, message=(
        f"{dev.name} ({dev.dm.type if dev.dm else 'dm'}) {what} its lower devices' alignment: the PV's data "
        "start (pvcreate --dataalignment) does not match the chunk or optimal I/O size"))]


def _array(dev: Device) -> list[Check]:
    md = dev.md
    if md is None:
        return []
    out: list[Check] = []
    level = (md.level or "").lower()
    if level in ("raid5", "raid6") and md.raid_disks and md.raid_disks > RAID5_MAX_WIDTH:
        out.append(Check(severity="warning", code="raid5-wide", device=dev.name, message=(
            f"{dev.name} is a {level} of {md.raid_disks} disks, more than {RAID5_MAX_WIDTH}: long rebuilds "
            "with a high chance of a second failure during them; split into narrower arrays (RAID50/60)")))
    faulty = [m.device for m in md.members if "faulty" in m.state]
    if md.degraded or faulty:
        missing = f"{md.degraded} member(s) missing" if md.degraded else "members faulty"
        out.append(Check(severity="error", code="array-degraded", device=dev.name, message=(
            f"{dev.name} is degraded ({missing}{': ' + ', '.join(faulty) if faulty else ''}): no longer "
            "redundant (RAID5) or less so, and slower; replace the member and rebuild")))
    if md.sync_action not in (None, "idle", "frozen"):
        progress = ""
        match = _PROGRESS.match(md.sync_completed or "")
        if match and int(match.group(2)):
            progress = f", {int(match.group(1)) / int(match.group(2)):.1%} done"
        limits = ""
        if md.sync_speed_min_kib is not None and md.sync_speed_max_kib is not None:
            limits = f" at {md.sync_speed_min_kib:,} to {md.sync_speed_max_kib:,} KiB/s (sync_speed_min/max)"
        out.append(Check(severity="warning", code="array-resyncing", device=dev.name, message=(
            f"{dev.name} is running {md.sync_action}{progress}{limits}: benchmarks and tuning measure the "
            "array under that load")))
    return out


def _volume(vol: Volume | None) -> list[Check]:
    """A hardware RAID volume's own checks: width, state, and whether its geometry is judged."""
    if vol is None:
        return []
    out: list[Check] = []
    name, ref = vol.device, vol.ref
    n, spans = vol.drives, vol.span_depth or 1
    if vol.level in ("raid5", "raid6", "raid50", "raid60") and n is not None and n % spans == 0 \
            and n // spans > RAID5_MAX_WIDTH:
        what = f"a hardware {vol.shown_level} of {n} drives" + (
            f" in {spans} spans of {n // spans}" if spans > 1 else "")
        out.append(Check(severity="warning", code="raid5-wide", device=name, message=(
            f"{name} is {what}, more than {RAID5_MAX_WIDTH} per group: long rebuilds with a high chance"
            " of a second failure during them; rebuild it as narrower spans (RAID50/60) or RAID6")))
    if vol.state is not None and vol.state.strip().lower() not in volumes.OPTIMAL_STATES:
        out.append(Check(severity="error", code="array-degraded", device=name, message=(
            f"{name} ({ref.model} VD{ref.virtual_drive} {vol.shown_level}) is {vol.state!r}, not optimal,"
            " by its controller: less redundant or none, and slower; replace the failed drive and let"
            " it rebuild (the vendor tool shows which)")))
    if vol.level is None:
        out.append(Check(severity="info", code="volume-not-judged", device=name, message=(
            f"{name} is a {ref.model} volume of level {ref.raid_level!r}, which stortune does not model:"
            " partition alignment to its stripe, filesystem geometry and its write penalty are not"
            " judged")))
    elif vol.data_drives() is None:
        why = ("its drive count is unknown" if n is None else
               "its span depth is unknown" if vol.level in ("raid50", "raid60") and vol.span_depth is None
               else f"{n} drives{f' in {spans} spans' if spans > 1 else ''} make no such {vol.level}")
        out.append(Check(severity="info", code="volume-not-judged", device=name, message=(
            f"{name} ({ref.model} VD{ref.virtual_drive} {vol.shown_level}): {why}, so its stripe width is"
            " not known: partition alignment to the full stripe and filesystem geometry are not judged")))
    return out


def _stripe_cache(topology: Topology, dev: Device, ram_share: float) -> list[Check]:
    state = dev.tunables.get("stripe_cache_size")
    if dev.md is None or state is None or not isinstance(state.value, int):
        return []
    cost = stripecache.cost(topology, dev, state.value)
    over = cost.refusal(ram_share) is not None
    message = f"{dev.name} stripe_cache_size {state.value} {cost.describe()}"
    if over:
        message += (f": more than the {ram_share * 100:g} % allowed (at most"
                    f" {cost.max_entries(ram_share)} entries fit; stortune would refuse to set it)")
    return [Check(severity="warning" if over else "info", code="stripe-cache-ram", device=dev.name,
                  message=message)]


def device_checks(topology: Topology | Index, name: str, *, ram_share: float) -> list[Check]:
    """The layout checks of one device (its own layout, not its members'). An ``Index`` finds
    the device by name at once (a host's 16,384 devices, each checked)."""
    index = topology if isinstance(topology, Index) else Index(topology)
    topology, dev = index.topology, index.by_name.get(name)
    if dev is None:
        return []
    own = index.volumes.get(dev.name)
    below = index.volumes.get(dev.parent) if dev.kind is DeviceKind.PARTITION and dev.parent else None
    return [*_partition(dev, below), *_fs_geometry(dev, own or below), *_lvm(dev), *_array(dev),
            *_volume(own), *_stripe_cache(topology, dev, ram_share)]


def host_checks(topology: Topology, *, ram_share: float) -> list[Check]:
    """Host-wide: the stripe caches of all arrays together against the host's RAM."""
    costs = [stripecache.cost(topology, d, s.value) for d in topology.devices
             if d.md is not None and (s := d.tunables.get("stripe_cache_size")) is not None
             and isinstance(s.value, int)]
    known = [c.bytes for c in costs if c.bytes is not None]
    if len(costs) < 2 or not known:
        return []  # one array: its own check says it
    total = sum(known)
    memory = topology.memory_bytes
    if not memory:
        return [Check(severity="info", code="stripe-cache-ram", message=(
            f"{len(costs)} arrays' stripe caches cost {total / 2**20:,.0f} MiB of RAM together; "
            "the host's RAM is unknown"))]
    share = total / memory
    return [Check(severity="warning" if share > ram_share else "info", code="stripe-cache-ram", message=(
        f"{len(costs)} arrays' stripe caches cost {total / 2**20:,.0f} MiB of RAM together, {share:.1%} of "
        f"{memory / 2**30:,.1f} GiB" + (f": more than the {ram_share * 100:g} % allowed"
                                        if share > ram_share else "")))]


def layout_checks(topology: Topology, *, ram_share: float) -> list[Check]:
    """Every device's layout checks and the host's, as the topology listing shows them."""
    index = Index(topology)
    return [*(c for d in topology.devices for c in device_checks(index, d.name, ram_share=ram_share)),
            *host_checks(topology, ram_share=ram_share)]
