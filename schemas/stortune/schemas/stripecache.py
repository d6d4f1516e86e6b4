"""What an md RAID4/5/6 stripe cache costs in RAM, and when a wanted size costs too much.

The kernel keeps ``stripe_cache_size`` stripe heads, each holding one page per member disk:
entries x 4 KiB x raid_disks bytes (4096 x 4 KiB x 5 disks = 80 MiB). It is unswappable
memory; a profile copied from a 4-disk box onto a 24-disk one can take gigabytes, so the
planner refuses a value above a share of the host's RAM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from stortune.schemas.topology import Device, Topology

PAGE_BYTES: Final = 4096
#: The share of the host's RAM a stripe cache may cost before the planner refuses it (the
#: one default of the agent's --stripe-cache-ram-share and the control plane's setting).
DEFAULT_RAM_SHARE: Final = 0.25
_MIB: Final = 2**20


def parse_ram_share(text: str) -> float:
    """A share of RAM as given on a command line or in the environment: 0 < share <= 1, else
    ValueError saying what is expected (the caller names the option)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:  # (NaN fails too)
        raise ValueError(f"{text!r} is not a share of the host's RAM: give a fraction more than 0"
                         f" and at most 1, e.g. {DEFAULT_RAM_SHARE}")
    return value


def tightest(own: float, asked: float | None) -> float:
    """The share an agent plans with: its own, or the control plane's when that is smaller. The
    API may only tighten the host's bound, never loosen it; None (none sent): the agent's own."""
    return own if asked is None else min(own, asked)


@dataclass(frozen=True)
class StripeCacheCost:
    entries: int
    raid_disks: int | None
    memory_bytes: int | None

    @property
    def bytes(self) -> int | None:
        return None if self.raid_disks is None else self.entries * PAGE_BYTES * self.raid_disks

    @property
    def share(self) -> float | None:
        cost = self.bytes
        return None if cost is None or not self.memory_bytes else cost / self.memory_bytes

    def describe(self) -> str:
        cost = self.bytes
        if cost is None:
            return f"{self.entries} entries x 4 KiB x the member disks of RAM (member count unknown)"
        text = f"costs {cost / _MIB:,.0f} MiB of RAM ({self.entries} x 4 KiB x {self.raid_disks} disks)"
        share, memory = self.share, self.memory_bytes
        if share is None or not memory:
            return f"{text}; the host's RAM is unknown, so it is not checked against it"
        return f"{text}, {share:.1%} of the host's {memory / 2**30:,.1f} GiB"

    def refusal(self, ram_share: float) -> str | None:
        """Why this size is refused, or None when it fits (or the RAM is unknown)."""
        share = self.share
        if share is None or share <= ram_share:
            return None
        return (f"stripe_cache_size {self.entries} {self.describe()}: more than the"
                f" {ram_share * 100:g} % allowed; at most {self.max_entries(ram_share)} entries fit")

    def max_entries(self, ram_share: float) -> int:
        if not self.raid_disks or not self.memory_bytes:
            return 0
        return int(self.memory_bytes * ram_share // (PAGE_BYTES * self.raid_disks))


def raid_disks(dev: Device) -> int | None:
    if dev.md is None:
        return None
    return dev.md.raid_disks or (len(dev.md.members) or None)


def cost(topology: Topology, dev: Device, entries: int) -> StripeCacheCost:
    return StripeCacheCost(entries=entries, raid_disks=raid_disks(dev), memory_bytes=topology.memory_bytes)
