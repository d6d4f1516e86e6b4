"""Which devices a host lives on: refused to experiments, benchmarks and probes.

A pure function of a discovered ``Topology`` and the host's choices (``Protection``).
A device is protected when it holds one of the protected mount points (``/``, ``/boot``,
``/var`` by default: the mount whose mountpoint is the longest prefix of the path, so a
``/var`` without a filesystem of its own is protected through ``/``), backs swap, or is
named by the host; and so is every device whose I/O lands on one of those: the whole
disk under a partition, an array's members and the disks under them, the other
partitions of that disk, the other volumes of that volume group. A loop device is
judged by itself: a loop whose backing file lies on ``/`` does not carry ``/`` (its
reads reach the disk through the filesystem), but the disk stays protected.

Profiles may still set protected devices: tuning the OS disk's read-ahead is legitimate;
measuring on it competes with the host's own I/O, and writing to it destroys the host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from stortune.schemas.bench.target import beneath
from stortune.schemas.topology import (
    PROTECTION_REASON_MAX,
    Device,
    DeviceKind,
    ProtectedDevice,
    Topology,
    printable,
)

#: The mount points protected unless the host gives its own list.
DEFAULT_MOUNTS: tuple[str, ...] = ("/", "/boot", "/var")
#: What a refusal tells the host to change (the agent's flags).
HOW_TO_CHANGE = ("the host's agent decides this: --protect-mount PATH and --protect-device NAME add to"
                 " it, --allow-loop NAME allows another user's loop device")


@dataclass(frozen=True)
class Protection:
    """The host's protected devices, as configured (not yet resolved against a topology)."""

    mounts: tuple[str, ...] = DEFAULT_MOUNTS
    #: Devices the host adds by kernel name (sdc, md0).
    devices: tuple[str, ...] = ()
    #: What backs swap: a device node (/dev/zram0, /dev/mapper/vg-swap) or a swap file.
    swaps: tuple[str, ...] = ()
    #: Loop devices of another user (their backing file is not the agent's), with why.
    foreign_loops: Mapping[str, str] | None = None
    #: Loop devices whose backing file is a block device: loop name -> that device.
    loop_devices: Mapping[str, str] | None = None


def _holder_of(topology: Topology, path: str) -> tuple[Device, str] | None:
    """The device whose mount is the longest prefix of ``path``, and that mountpoint."""
    best: tuple[Device, str] | None = None
    for dev in topology.devices:
        for m in dev.mounts:
            mp = m.mountpoint.rstrip("/") or "/"
            inside = path == mp or path.startswith(mp if mp == "/" else mp + "/")
            if inside and (best is None or len(mp) > len(best[1])):
                best = (dev, mp)
    return best


def _swap_device(topology: Topology, entry: str) -> Device | None:
    """The device a /proc/swaps entry names: /dev/zram0, /dev/dm-1 or /dev/mapper/NAME."""
    if entry.startswith("/dev/mapper/"):
        wanted = entry.removeprefix("/dev/mapper/")
        return next((d for d in topology.devices if d.dm is not None and d.dm.name == wanted), None)
    if entry.startswith("/dev/"):
        return topology.device(entry.removeprefix("/dev/").replace("/", "!"))
    return None


def _carriers(topology: Topology, config: Protection) -> dict[str, str]:
    """Device name -> what it carries (``holds /``, ``backs swap``, ``named by the host``)."""
    found: dict[str, str] = {}
    for path in config.mounts:
        held = _holder_of(topology, path)
        if held is not None:
            dev, mp = held
            found.setdefault(dev.name, f"holds {path}" if mp == path else f"holds {mp} (and so {path})")
    for entry in config.swaps:
        swap = _swap_device(topology, entry)
        if swap is not None:
            found.setdefault(swap.name, f"backs swap ({entry})")
            continue
        held = _holder_of(topology, entry)  # a swap file: its filesystem's device
        if held is not None:
            found.setdefault(held[0].name, f"holds the swap file {entry}")
    for name in config.devices:
        if topology.device(name) is not None:
            found.setdefault(name, "is named protected by the host (--protect-device)")
    return found


def protected_devices(topology: Topology, config: Protection) -> dict[str, str]:
    """Every protected device of ``topology`` -> why, in a sentence naming what it carries."""
    carriers = _carriers(topology, config)
    # What lies beneath a carrier carries it too: the disk under /'s partition, an array's members.
    carried: dict[str, str] = {}
    for name, what in carriers.items():
        for b in beneath(topology, name):
            carried.setdefault(b.device, what if b.device == name else f"carries {name}, which {what}")
    out: dict[str, str] = {}
    for dev in topology.devices:
        if dev.kind is DeviceKind.HOST:
            continue
        hit = next((b.device for b in beneath(topology, dev.name) if b.device in carried), None)
        if hit == dev.name:
            out[dev.name] = f"{dev.name} {carried[hit]}"
        elif hit is not None:
            out[dev.name] = f"{dev.name} is on {hit}, which {carried[hit]}"
        elif config.foreign_loops and dev.name in config.foreign_loops:
            out[dev.name] = f"{dev.name} {config.foreign_loops[dev.name]}"
    # A loop over a protected block device reads and writes that device, and so does what is
    # over that loop (another loop, a volume): passes until none is added (one pass over the
    # loops in device order missed a chain, and nothing looked above a loop).
    while added := _over_protected(topology, out, config.loop_devices or {}):
        out.update(added)
    return out


def _over_protected(topology: Topology, out: Mapping[str, str], loops: Mapping[str, str]) -> dict[str, str]:
    """Devices not yet in ``out`` whose I/O lands on one that is: through a loop's backing
    device or through what lies beneath them."""
    added = {loop: f"{loop} is backed by {under}: {out[under]}"
             for loop, under in loops.items() if under in out and loop not in out}
    for dev in topology.devices:
        if dev.kind is DeviceKind.HOST or dev.name in out or dev.name in added:
            continue
        hit = next((b.device for b in beneath(topology, dev.name)[1:] if b.device in out), None)
        if hit is not None:
            added[dev.name] = f"{dev.name} is on {hit}: {out[hit]}"
    return added


def reported(topology: Topology, protected: Mapping[str, str]) -> Topology:
    """``topology`` carrying its protected devices, as the agent reports them to the control plane:
    reasons made printable (a swap file's path is the kernel's text) and cut to the model's bound
    (a long chain of loops nests its reasons), so what the agent sends always validates."""
    def short(reason: str) -> str:
        reason = printable(reason)
        return reason if len(reason) <= PROTECTION_REASON_MAX else reason[:PROTECTION_REASON_MAX - 1] + "…"

    entries = [ProtectedDevice(name=dev.name, id=dev.id, reason=short(protected[dev.name]))
               for dev in topology.devices if dev.name in protected]
    return topology.model_copy(update={"protected": entries})


def topology_refusals(topology: Topology, devices: Iterable[str], what: str) -> list[str]:
    """The refusals a reported topology answers (the control plane's dry runs and submissions, a
    preview: the agent refuses again): the protected devices the host reported, or the default
    mounts alone from an agent that reports none."""
    if topology.protected is None:
        return refusals(protected_devices(topology, Protection()), devices, what)
    return refusals({p.name: p.reason for p in topology.protected}, devices, what)


def refusals(protected: Mapping[str, str], devices: Iterable[str], what: str) -> list[str]:
    """One sentence per protected device among ``devices`` that ``what`` (a benchmark, a probe)
    would use, saying how the host changes it."""
    return [f"{protected[d]}: a protected device, no {what} runs on it ({HOW_TO_CHANGE})"
            for d in dict.fromkeys(devices) if d in protected]
