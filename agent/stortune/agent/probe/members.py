"""What a probe reads: the bottom block devices under a device, each checked to be the
discovered device's own node.

The device is named by its kernel name and resolved from this agent's own topology;
nothing from the caller becomes a path. Each member's node under the KernelFS dev
root must be a block device node (not followed through a link) whose device number is
the one sysfs reports for it, so a stray file or a stale node is refused, not read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stortune.agent.bench.errors import BenchmarkError
from stortune.agent.kernelfs import KernelFS, UnsafePathError, check_device_name
from stortune.agent.protection import ProtectedDeviceError
from stortune.schemas.protection import refusals
from stortune.schemas.topology import DeviceKind, Topology

#: At most this many members are probed: each costs two steps of a few seconds.
MAX_MEMBERS = 64


class ProbeDeviceError(BenchmarkError):
    """The ``device`` asked for is not one this host can probe; the message names it."""


@dataclass(frozen=True)
class Member:
    name: str
    node: Path


def bottom_devices(topology: Topology, name: str) -> list[str]:
    """The devices where a read of ``name`` lands, in slave order, each once: md members'
    disks, multipath paths, LVM PVs' disks, or ``name`` itself when nothing lies beneath."""
    out: list[str] = []

    def walk(dev_name: str, depth: int) -> None:
        dev = topology.device(dev_name)
        if dev is None or depth > 16:
            return
        if dev.slaves:
            # an array's members in slot order (sysfs lists slaves by name)
            slots = {m.device: m.slot for m in dev.md.members} if dev.md is not None else {}
            for slave in sorted(dev.slaves, key=lambda s: (slots.get(s) is None, slots.get(s) or 0)):
                walk(slave, depth + 1)
            return
        leaf = dev.parent if dev.kind is DeviceKind.PARTITION and dev.parent else dev.name
        if leaf not in out:
            out.append(leaf)

    walk(name, 0)
    return out


def every_disk(topology: Topology) -> list[str]:
    """With no device named: the host's whole disks (no partitions, loops, zram, arrays)."""
    return [d.name for d in topology.devices if d.kind is DeviceKind.DISK]


def resolve(fs: KernelFS, topology: Topology, device: str | None,
            protected: Mapping[str, str] | None = None) -> list[Member]:
    """The members a probe of ``device`` reads (None: every disk the host does not protect);
    ``protected`` (``HostProtection.resolve``): a named device on or over one is refused."""
    protected = protected or {}
    if device is not None:
        try:
            check_device_name(device)
        except UnsafePathError:
            raise ProbeDeviceError(f"device {device!r} is not a kernel block device name (e.g."
                                   " md126, sdb, dm-3): give a device of this host, not a path") from None
        if topology.device(device) is None or device == "host":
            raise ProbeDeviceError(f"device {device!r} is not a block device of this host"
                                   " (stortune-agent topology lists them)")
        names = bottom_devices(topology, device)
        refused = refusals(protected, [device, *names], "probe")
        if refused:
            raise ProtectedDeviceError(refused)
    else:
        names = [n for n in every_disk(topology) if n not in protected]
    if not names:
        raise ProbeDeviceError("device: this host has no disk to probe that it does not protect"
                               if device is None else
                               f"device {device!r}: nothing beneath it can be read")
    if len(names) > MAX_MEMBERS:
        raise ProbeDeviceError(f"device {device or '(every disk)'}: {len(names)} members, more than"
                               f" the {MAX_MEMBERS} a probe reads; name one array or LUN")
    return [_checked(fs, topology, n) for n in names]


def _checked(fs: KernelFS, topology: Topology, name: str) -> Member:
    node = fs.device_node(name)
    try:
        st = os.lstat(node)
    except OSError as exc:
        raise ProbeDeviceError(f"device {name}: its node {node} cannot be read ({exc.strerror})") from None
    if not stat.S_ISBLK(st.st_mode):
        raise ProbeDeviceError(f"device {name}: {node} is not a block device node")
    dev = topology.device(name)
    expected = dev.devno if dev is not None else None
    found = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if expected is not None and found != expected:
        raise ProbeDeviceError(f"device {name}: {node} is device {found}, but sysfs says {name} is"
                               f" {expected}; refusing to read another device")
    return Member(name, node)
