"""Does a rule's ``match`` select a device? Answers with the reason when not.

Patterns are matched by RE2 (schemas/patterns.py): linear in the value, whatever the pattern.
"""

from __future__ import annotations

from stortune.schemas.controllers import VolumeRef, normalise_raid_level
from stortune.schemas.patterns import glob_matches, regex_matches
from stortune.schemas.profile import ControllerMatch, Match
from stortune.schemas.topology import Device


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"


def _binary(n: int) -> str:
    """Strip sizes are powers of two: 64 KiB, 1 MiB."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _regex(field: str, pattern: str, actual: str | None, source: str = "sysfs") -> str | None:
    if actual is None:
        return f"{field} is unknown ({source} does not report it), rule wants /{pattern}/"
    if not regex_matches(pattern, actual.strip()):
        return f"{field} {actual!r} does not match /{pattern}/"
    return None


def mismatch(match: Match, dev: Device) -> str | None:
    """None when every criterion holds, else the first one that does not, in words."""
    if match.kind is not None and dev.kind not in match.kind:
        return f"kind {dev.kind.value} is not one of {[k.value for k in match.kind]}"
    if match.name is not None and not any(glob_matches(g, dev.name) for g in match.name):
        return f"name {dev.name} matches none of {match.name}"
    if match.id is not None and not any(glob_matches(g, dev.id) for g in match.id):
        return f"id {dev.id} matches none of {match.id}"
    if match.vendor is not None and (why := _regex("vendor", match.vendor, dev.vendor)):
        return why
    if match.model is not None and (why := _regex("model", match.model, dev.model)):
        return why
    if match.driver is not None:
        driver = dev.scsi_host.driver if dev.scsi_host else dev.driver
        if why := _regex("driver", match.driver, driver):
            return why
    if match.transport is not None and dev.transport not in match.transport:
        return f"transport {dev.transport or 'unknown'} is not one of {match.transport}"
    if match.rotational is not None and dev.rotational is not match.rotational:
        seen = "unknown" if dev.rotational is None else str(dev.rotational).lower()
        return f"rotational is {seen}, rule wants {str(match.rotational).lower()}"
    if match.raidLevel is not None:
        level = dev.md.level if dev.md else None
        if level is None:
            return f"not an md array, rule wants raidLevel {match.raidLevel}"
        if level not in match.raidLevel:
            return f"raidLevel {level} is not one of {match.raidLevel}"
    if match.role is not None and not set(match.role) & set(dev.roles):
        have = [r.value for r in dev.roles] or "none"
        return f"roles {have} include none of {[r.value for r in match.role]}"
    if match.controller is not None and (why := _controller(match.controller, dev.controller)):
        return why
    if match.size is not None:
        lo, hi = match.size.bounds()
        if dev.size_bytes is None:
            return "size is unknown"
        if (lo is not None and dev.size_bytes < lo) or (hi is not None and dev.size_bytes > hi):
            return f"size {_human(dev.size_bytes)} is outside [{match.size.min}, {match.size.max}]"
    return None


def _controller(want: ControllerMatch, ref: VolumeRef | None) -> str | None:
    if ref is None:
        return "not a hardware RAID volume (no vendor tool maps this device to a virtual drive)"
    if want.adapter is not None and ref.adapter not in want.adapter:
        return f"controller adapter {ref.adapter} is not one of {want.adapter}"
    if want.model is not None and (why := _regex("controller model", want.model, ref.model,
                                                 "the vendor tool")):
        return why
    if want.driver is not None and (why := _regex("controller driver", want.driver, ref.driver,
                                                  "the vendor tool")):
        return why
    if want.raidLevel is not None:
        level = normalise_raid_level(ref.raid_level)
        if level not in want.raidLevel:
            return f"controller raidLevel {level} is not one of {want.raidLevel}"
    if want.stripSize is not None:
        lo, hi = want.stripSize.bounds()
        strip = ref.strip_size_bytes
        if strip is None:
            return "controller strip size is unknown (the vendor tool does not report it)"
        if (lo is not None and strip < lo) or (hi is not None and strip > hi):
            low = "0" if want.stripSize.min is None else want.stripSize.min
            high = "any" if want.stripSize.max is None else want.stripSize.max
            return f"controller strip size {_binary(strip)} is outside [{low}, {high}]"
    return None
