"""The agent's seam to hardware RAID controllers, beside ``KernelFS`` for the kernel.

Discovery asks it for the inventory and attaches each virtual drive to its Linux disk; the
executor reads and writes controller tunables through it. The inventory is kept for ``ttl``
seconds between discoveries (storcli takes a second or more per call on real hardware and the
control plane asks every few seconds); a read for the executor always asks the tool again.

Adapters are imported on first use, and only when one of their tools is on the tool path: an
agent on a host without RAID controllers never loads them (its idle RSS has no room to spare).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import (
    AdapterName,
    Controller,
    ControllerInventory,
    VirtualDrive,
    VolumeRef,
)

if TYPE_CHECKING:
    from stortune.agent.kernelfs import KernelFS
    from stortune.schemas.catalog import Tunable
    from stortune.schemas.topology import Topology, TunableState

#: The executables each adapter speaks to, first found wins (``discover.ADAPTERS`` uses these).
TOOLS: Mapping[AdapterName, tuple[str, ...]] = {
    "megaraid": ("storcli64", "storcli"),
    "perc": ("perccli64", "perccli"),
    "arcconf": ("arcconf", "hrconf"),
    "smartarray": ("ssacli", "hpssacli", "hpacucli"),
}


def _key(ref: VolumeRef) -> tuple[AdapterName, int, int]:
    return ref.adapter, ref.controller, ref.virtual_drive


def _identity(ctrl: Controller, vd: VirtualDrive) -> tuple[object, ...]:
    """What tells a volume apart besides its number: nothing a policy write changes."""
    return (ctrl.serial, ctrl.pci_address, ctrl.model, vd.wwn, vd.block_device, vd.raid_level,
            vd.size_bytes, vd.strip_size_bytes, tuple(vd.drives))


class ControllerWriteError(Exception):
    """A controller policy could not be written (the tool failed, or no volume backs the disk)."""


class ControllerAccess:
    def __init__(self, runner: ToolRunner, *, ttl: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, ControllerInventory] | None = None
        #: disk -> its volume and what that volume is beyond the tool's numbering, from the last
        #: discovery (mapped against every device of the host); replaced whole, never edited
        self._refs: dict[str, tuple[VolumeRef, tuple[object, ...]]] = {}

    def managed(self) -> bool:
        """Is any vendor tool on the tool path? (A few stat calls: asked on every discovery.)"""
        return any(self.runner.which(name) for names in TOOLS.values() for name in names)

    def inventory(self, *, fresh: bool = False) -> ControllerInventory | None:
        """Every controller the tools answer for; None when no tool is on the tool path."""
        if not self.managed():
            return None
        with self._lock:
            now = self._clock()
            if not fresh and self._cached is not None and now - self._cached[0] < self.ttl:
                return self._cached[1]
            from stortune.agent.controllers.discover import discover_controllers

            inv = discover_controllers(self.runner)
            self._cached = (self._clock(), inv)
            return inv

    def invalidate(self) -> None:
        with self._lock:
            self._cached = None

    def attach(self, topology: Topology) -> None:
        """Puts the inventory on ``topology`` and each mapped volume on its disk, with its
        controller tunables; a host without vendor tools is left as it is."""
        inv = self.inventory()
        if inv is None:
            return
        from stortune.schemas import controllertunables
        from stortune.schemas.controllermap import attach_controllers

        attach_controllers(topology, inv, controllertunables.states)
        vds = {(c.adapter, c.index, vd.id): (c, vd) for c in inv.controllers for vd in c.virtual_drives}
        self._refs = {d.name: (d.controller, _identity(*vds[_key(d.controller)]))
                      for d in topology.devices if d.controller is not None}

    # -- the executor's reads and writes --------------------------------------------------
    def _volume(self, fs: KernelFS, device: str) -> tuple[Controller, VirtualDrive] | None:
        inv = self.inventory(fresh=True)
        if inv is None:
            return None
        found = self._mapped(inv, device)
        if found is None:
            # Not mapped yet, or the volume the last (maybe cached) discovery mapped no longer has
            # that number (deleted and recreated, controllers renumbered): a mapping is only safe
            # against every device of the host (no other disk with this WWN, no other
            # megaraid_sas host), so discover them all with this fresh inventory, which maps again.
            from stortune.agent.discovery import discover

            discover(fs)
            found = self._mapped(inv, device)
        return found

    def _mapped(self, inv: ControllerInventory, device: str) -> tuple[Controller, VirtualDrive] | None:
        """``device``'s volume in ``inv``, when it is still the volume discovery mapped."""
        ref, identity = self._refs.get(device, (None, None))
        if ref is None:
            return None
        for ctrl in inv.controllers:
            if ctrl.adapter == ref.adapter and ctrl.index == ref.controller:
                for vd in ctrl.virtual_drives:
                    if vd.id == ref.virtual_drive:
                        return (ctrl, vd) if _identity(ctrl, vd) == identity else None
        return None

    def read(self, fs: KernelFS, tunable: Tunable, device: str) -> TunableState:
        """The tunable as the controller shows it now (the tool is asked again)."""
        from stortune.schemas import controllertunables
        from stortune.schemas.topology import TunableState

        found = self._volume(fs, device)
        if found is None:
            return TunableState(supported=False, reason=f"no managed RAID controller volume backs {device}")
        state = controllertunables.states(*found).get(tunable.name)
        return state or TunableState(supported=False, reason=f"{tunable.name} is not a controller tunable")

    def write(self, fs: KernelFS, tunable: Tunable, device: str, value: str) -> None:
        from stortune.agent.controllers.base import ToolFailure
        from stortune.agent.controllers.discover import adapter_for
        from stortune.schemas.catalog import ControllerTunable

        if not isinstance(tunable, ControllerTunable):
            raise ControllerWriteError(f"{tunable.name} is not a controller tunable")
        found = self._volume(fs, device)
        if found is None:
            raise ControllerWriteError(f"no managed RAID controller volume backs {device}")
        ctrl, vd = found
        try:
            adapter_for(ctrl.adapter).set_policy(self.runner, ctrl.tool, ctrl, vd, tunable.setting, value)
        except ToolFailure as exc:
            raise ControllerWriteError(
                f"{ctrl.model} (controller {ctrl.index}) volume {vd.id} {tunable.setting}: {exc}") from None
        finally:
            self.invalidate()
