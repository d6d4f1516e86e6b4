"""``stortune-agent controllers -o table``: controllers, their virtual and physical drives, errors."""

from __future__ import annotations

from typing import TextIO

from stortune.agent.render import table
from stortune.schemas.controllers import ControllerInventory


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n >> 10}K" if n < 1 << 20 else f"{n >> 20}M"


def inventory_table(inv: ControllerInventory, out: TextIO | None = None) -> None:
    table("Controllers", ["ctl", "adapter", "model", "firmware", "cache", "backup"], [
        (c.index, c.adapter, c.model, c.firmware_version, _kib(c.cache_size_bytes),
         f"{c.backup.kind} {c.backup.state or ''}".strip())
        for c in inv.controllers], out)
    table("Virtual drives", ["ctl", "vd", "raid", "state", "strip", "drives", "read", "write", "io",
                             "drive cache"], [
        (c.index, v.id, v.raid_level, v.state, _kib(v.strip_size_bytes), v.drive_count, v.read_policy,
         v.write_policy, v.io_policy, v.drive_cache)
        for c in inv.controllers for v in c.virtual_drives], out)
    table("Physical drives", ["ctl", "slot", "state", "model", "media errors", "predictive failures"], [
        (c.index, d.slot, d.state, d.model, d.media_errors, d.predictive_failures)
        for c in inv.controllers for d in c.physical_drives], out)
    if inv.errors:
        table("Errors", ["adapter", "ctl", "tool", "error"], [
            (e.adapter, "all" if e.index is None else e.index, e.tool, e.message) for e in inv.errors], out)
    if inv.unmanaged:
        print(f"not managed (tool not on the tool path): {', '.join(inv.unmanaged)}", file=out)
