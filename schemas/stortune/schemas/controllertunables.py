"""Controller tunables as the planner sees them: a virtual drive's policies as TunableStates,
and the rule that keeps write-back off a controller that cannot protect its cache.

Pure: the agent's discovery calls ``states`` for each mapped virtual drive, the planner calls
``refusal`` for each winning value, and both read only their arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

from stortune.schemas import catalog
from stortune.schemas.catalog import ControllerTunable
from stortune.schemas.controllers import BackupUnit, Controller, ControllerSetting, VirtualDrive
from stortune.schemas.topology import Device, TunableState

#: catalog name -> the virtual drive's policy field it is
TUNABLES: Mapping[str, ControllerTunable] = {
    t.name: t for t in catalog.ordered() if isinstance(t, ControllerTunable)}
BY_SETTING: Mapping[ControllerSetting, ControllerTunable] = {t.setting: t for t in TUNABLES.values()}

#: Words a battery or CacheVault shows while it is fine but busy (a learn cycle recharges it on
#: purpose): the controller runs write-through meanwhile and returns to write-back by itself, so
#: refusing write-back then would make a profile flap with the learn schedule.
_BUSY = ("learn", "charg")


def _policy(vd: VirtualDrive, setting: ControllerSetting) -> str | None:
    value: str | None = getattr(vd, setting)
    return value


def states(controller: Controller, vd: VirtualDrive) -> dict[str, TunableState]:
    """Each controller tunable of ``vd``: the configured value, and what is in effect when a
    reboot is still needed for the configured one (``effective``). A policy the controller
    does not have (Smart Array has no per-volume read-ahead) is unsupported, with the reason."""
    out: dict[str, TunableState] = {}
    for setting, tunable in BY_SETTING.items():
        in_effect = _policy(vd, setting)
        pending = vd.pending.get(setting)
        configured = pending if pending is not None else in_effect
        if configured is None:
            out[tunable.name] = TunableState(
                supported=False,
                reason=f"{controller.model} ({controller.adapter}) reports no {setting.replace('_', ' ')}"
                       " for this volume")
            continue
        out[tunable.name] = TunableState(
            supported=True, value=configured, raw=configured, writable=True,
            choices=list(tunable.known),
            effective=in_effect if pending is not None and in_effect != pending else None)
    return out


def backup_usable(backup: BackupUnit) -> bool:
    """Can the controller keep cached writes across a power loss now (or once a learn cycle ends)?"""
    if backup.kind == "none":
        return False
    state = (backup.state or "").lower()
    return backup.optimal or any(word in state for word in _BUSY)


def refusal(dev: Device, tunable: str, value: object) -> str | None:
    """Why this winning value must not be applied to ``dev``, or None."""
    if tunable != "controller_write_cache" or value != "write-back" or dev.controller is None:
        return None
    backup = dev.controller.backup
    if backup_usable(backup):
        return None
    what = {"bbu": "battery", "cachevault": "CacheVault", "none": "battery or CacheVault"}[backup.kind]
    state = "absent" if backup.kind == "none" else f"{backup.state or 'in an unknown state'}"
    return (f"{dev.controller.model} has its {what} {state}: write-back would lose acknowledged"
            " writes on a power loss; fix the backup unit, or choose always-write-back to accept"
            " that explicitly")
