"""This host's protected devices: the agent's own configuration, resolved against the kernel.

The host decides, never the API: ``HostProtection`` is built once from the agent's flags
(``--protect-mount``, ``--protect-device``, ``--allow-loop``), and ``check`` refuses an
experiment, benchmark or probe that would use a protected device (the rule itself is the
pure ``stortune.schemas.protection``). Swap comes from /proc/swaps under the procfs root.

Loop devices: one whose backing file belongs to another user (its owner is not the
agent's effective uid) is that user's, and protected unless the host allows it with
``--allow-loop NAME``. A backing file that cannot be looked at (deleted, a path of
another mount namespace) proves nothing and does not protect the loop.
"""

from __future__ import annotations

import os
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

#: A path's owner uid, or None when it cannot be looked at.
Owner = Callable[[str], "int | None"]


class ProtectedDeviceError(BenchmarkError):
    """An experiment, benchmark or probe aimed at a device the host protects."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("refused: " + "; ".join(reasons))


def _owner(path: str) -> int | None:
    try:
        return os.stat(path).st_uid
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class HostProtection:
    mounts: tuple[str, ...] = DEFAULT_MOUNTS
    devices: tuple[str, ...] = ()
    allow_loops: tuple[str, ...] = ()
    owner: Owner = _owner
    uid: int = os.geteuid()

    def resolve(self, fs: KernelFS, topology: Topology) -> dict[str, str]:
        """Every protected device of ``topology`` -> why."""
        from stortune.schemas.protection import Protection, protected_devices

        swaps = tuple(procfs.parse_swaps(fs.read_table("swaps") or ""))
        config = Protection(mounts=self.mounts, devices=self.devices, swaps=swaps,
                            foreign_loops=self._foreign_loops(fs, topology))
        return protected_devices(topology, config)

    def _foreign_loops(self, fs: KernelFS, topology: Topology) -> dict[str, str]:
        out: dict[str, str] = {}
        for dev in topology.devices:
            if dev.kind is not DeviceKind.LOOP or dev.name in self.allow_loops:
                continue
            backing = (fs.read_sys(f"block/{dev.name}/loop/backing_file") or "").strip()
            uid = self.owner(backing) if backing.startswith("/") else None
            if uid is not None and uid != self.uid:
                out[dev.name] = f"is another user's loop device (its backing file belongs to uid {uid})"
        return out

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
    from stortune.schemas.tuning.overlay import EXPERIMENT_ANNOTATION, OVERLAY_PRIORITY

    return [p for p in profiles
            if EXPERIMENT_ANNOTATION in p.metadata.annotations and p.spec.priority == OVERLAY_PRIORITY]


def matched_devices(profiles: Iterable[StorageProfile], topology: Topology) -> list[str]:
    """The devices the rules of ``profiles`` match."""
    from stortune.schemas.matching import mismatch

    return [d.name for p in profiles for rule in p.spec.rules for d in topology.devices
            if d.kind is not DeviceKind.HOST and mismatch(rule.match, d) is None]
