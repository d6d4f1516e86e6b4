"""Asking every adapter whose tool is on the tool path; one failing never hides the others."""

from __future__ import annotations

from collections.abc import Sequence

from stortune.agent.controllers.access import TOOLS
from stortune.agent.controllers.arcconf import ArcconfAdapter
from stortune.agent.controllers.base import ControllerAdapter
from stortune.agent.controllers.megaraid import MegaRaidAdapter
from stortune.agent.controllers.smartarray import SmartArrayAdapter
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import (
    MAX_CONTROLLERS,
    AdapterName,
    Controller,
    ControllerError,
    ControllerInventory,
)

ADAPTERS: tuple[ControllerAdapter, ...] = (
    MegaRaidAdapter("megaraid", TOOLS["megaraid"]),
    MegaRaidAdapter("perc", TOOLS["perc"]),
    ArcconfAdapter(TOOLS["arcconf"]),
    SmartArrayAdapter(),  # its tools: TOOLS["smartarray"]
)
_BY_NAME = {a.name: a for a in ADAPTERS}


def adapter_for(name: AdapterName) -> ControllerAdapter:
    return _BY_NAME[name]


def discover_controllers(runner: ToolRunner,
                         adapters: Sequence[ControllerAdapter] = ADAPTERS) -> ControllerInventory:
    found: list[Controller] = []
    failed: list[ControllerError] = []
    unmanaged: list[AdapterName] = []
    for adapter in adapters:
        tool = next((p for name in adapter.tools if (p := runner.which(name))), None)
        if tool is None:
            unmanaged.append(adapter.name)
            continue
        try:
            controllers, errors = adapter.discover(runner, tool)
        except Exception as exc:  # an adapter bug must not take the host's other controllers down
            controllers, errors = [], [ControllerError(
                adapter=adapter.name, tool=tool, message=f"adapter failed: {type(exc).__name__}: {exc}")]
        room = MAX_CONTROLLERS - len(found)
        if len(controllers) > room:  # no host has that many: a tool printing junk, kept bounded
            errors = [*errors, ControllerError(
                adapter=adapter.name, tool=tool,
                message=f"reported {len(controllers)} controllers; {max(room, 0)} kept (a host lists at"
                        f" most {MAX_CONTROLLERS})")]
            controllers = controllers[:max(room, 0)]
        found.extend(controllers)
        failed.extend(errors[:MAX_CONTROLLERS - len(failed)])
    return ControllerInventory(controllers=found, errors=failed, unmanaged=unmanaged)
