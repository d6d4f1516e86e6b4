"""This host's protected devices: the agent's own configuration, resolved against the kernel.

The host decides, never the API: ``HostProtection`` is built once from the agent's flags
(``--protect-mount``, ``--protect-device``, ``--allow-loop``), and ``check`` refuses an
experiment, benchmark or probe that would use a protected device (the rule itself is the
pure ``stortune.schemas.protection``). Swap comes from /proc/swaps under the procfs root.

Loop devices: one whose backing file belongs to another user (its owner is not the
agent's effective uid) is that user's, and protected unless the host allows it with
``--allow-loop NAME``. A backing file that cannot be looked at (deleted, a path of
another mount namespace) proves nothing and does not protect the loop. A loop whose
backing file is a block device node reads and writes that device: it is protected when
the device is.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stortune.agent import procfs
from stortune.agent.bench.errors import BenchmarkError
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.topology import DeviceKind, Topology

if TYPE_CHECKING:
    from stortune.schemas.profile import StorageProfile

#: schemas.protection's default, repeated so that building the serving agent's options does not
#: load the benchmark models (tests/agent/test_serve_footprint.py); a test keeps them equal.
DEFAULT_MOUNTS: tuple[str, ...] = ("/", "/boot", "/var")

#: A path's stat, or None when it cannot be looked at.
Stat = Callable[[str], "os.stat_result | None"]


class ProtectedDeviceError(BenchmarkError):
    """An experiment, benchmark or probe aimed at a device the host protects."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("refused: " + "; ".join(reasons))


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class HostProtection:
    mounts: tuple[str, ...] = DEFAULT_MOUNTS
    devices: tuple[str, ...] = ()
    allow_loops: tuple[str, ...] = ()
    stat: Stat = _stat
    uid: int = os.geteuid()

    def resolve(self, fs: KernelFS, topology: Topology) -> dict[str, str]:
        """Every protected device of ``topology`` -> why."""
        from stortune.schemas.protection import Protection, protected_devices

        swaps = tuple(procfs.parse_swaps(fs.read_table("swaps") or ""))
        foreign, backed = self._loops(fs, topology)
        config = Protection(mounts=self.mounts, devices=self.devices, swaps=swaps,
                            foreign_loops=foreign, loop_devices=backed)
        return protected_devices(topology, config)

    def report(self, fs: KernelFS, topology: Topology) -> Topology:
        """``topology`` with this host's protected devices, for the control plane: its dry runs
        preview the refusals this agent makes (it still makes them)."""
        from stortune.schemas.protection import reported

        return reported(topology, self.resolve(fs, topology))

    def _loops(self, fs: KernelFS, topology: Topology) -> tuple[dict[str, str], dict[str, str]]:
        """(another user's loop devices -> why, loop devices over a block device -> that device)."""
        by_devno = {d.devno: d.name for d in topology.devices if d.devno}
        foreign: dict[str, str] = {}
        backed: dict[str, str] = {}
        for dev in topology.devices:
            if dev.kind is not DeviceKind.LOOP:
                continue
            backing = (fs.read_sys(f"block/{dev.name}/loop/backing_file") or "").strip()
            st = self.stat(backing) if backing.startswith("/") else None
            if st is None:
                continue
            if stat.S_ISBLK(st.st_mode):  # losetup over a disk: its I/O is that disk's
                under = by_devno.get(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
                if under is not None:
                    backed[dev.name] = under
            elif st.st_uid != self.uid and dev.name not in self.allow_loops:
                foreign[dev.name] = ("is another user's loop device (its backing file belongs to"
                                     f" uid {st.st_uid})")
        return foreign, backed

    def check(self, fs: KernelFS, topology: Topology, devices: Iterable[str], what: str) -> None:
        """Raise ProtectedDeviceError naming every protected device among ``devices``."""
        from stortune.schemas.protection import refusals

        found = refusals(self.resolve(fs, topology), devices, what)
        if found:
            raise ProtectedDeviceError(found)


def trial_overlays(profiles: Iterable[StorageProfile]) -> list[StorageProfile]:
    """The experiment trial overlays among ``profiles`` (the control plane's experiments reach the
    agent as an Apply with one; the recommended profile an experiment leaves is an ordinary
    profile and is not one)."""
    from stortune.schemas.trialprofile import EXPERIMENT_ANNOTATION, OVERLAY_PRIORITY

    return [p for p in profiles
            if EXPERIMENT_ANNOTATION in p.metadata.annotations and p.spec.priority == OVERLAY_PRIORITY]


def matched_devices(profiles: Iterable[StorageProfile], topology: Topology) -> list[str]:
    """The devices the rules of ``profiles`` match."""
    from stortune.schemas.matching import mismatch

    return [d.name for p in profiles for rule in p.spec.rules for d in topology.devices
            if d.kind is not DeviceKind.HOST and mismatch(rule.match, d) is None]
