"""The target's place in the device graph: what lies beneath it and how many drives.

Pure functions of a discovered ``Topology``: the agent uses them to choose the
devices it samples during a run, and preset expansion uses ``facts`` to scale
outstanding I/Os with an array's member drives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from stortune.schemas.topology import Device, DeviceKind, Topology

if TYPE_CHECKING:  # the step models load with a benchmark, not with protection's use of beneath()
    from stortune.schemas.bench.steps import TargetFacts

Relation = Literal["target", "md-member", "mpath-path", "lvm-pv", "crypt-backing", "slave", "disk"]


@dataclass(frozen=True)
class Beneath:
    device: str
    relation: Relation
    #: The device right above (None for the target itself).
    above: str | None = None


def _slave_relation(upper: Device) -> Relation:
    if upper.md is not None:
        return "md-member"
    if upper.dm is not None:
        return {"multipath": "mpath-path", "lvm": "lvm-pv", "crypt": "crypt-backing"}.get(
            upper.dm.type, "slave")  # type: ignore[return-value]
    return "slave"


def beneath(topology: Topology, name: str) -> list[Beneath]:
    """The target, then every device under it, breadth first, each once.

    Under an md array its members, under multipath its paths, under LVM its
    PVs; under a partition (a member or the target) the disk holding it.
    """
    out = [Beneath(name, "target")]
    seen = {name}
    queue = [name]
    while queue:
        dev = topology.device(queue.pop(0))
        if dev is None:
            continue
        below: list[tuple[str, Relation]] = [(s, _slave_relation(dev)) for s in dev.slaves]
        if dev.kind is DeviceKind.PARTITION and dev.parent:
            below.append((dev.parent, "disk"))
        for child, relation in below:
            if child not in seen:
                seen.add(child)
                out.append(Beneath(child, relation, dev.name))
                queue.append(child)
    return out


def drives(topology: Topology, name: str) -> int:
    """Distinct drives under a device: md members and LVM PVs add up, the paths of one
    multipath LUN are one drive, partitions count as their disk, and a hardware RAID volume
    counts the physical drives behind it (``controller.physical_drives``): the controller
    spreads the I/O over them as md does over its members, so presets keep each one busy."""

    def leaves(dev_name: str, depth: int = 0) -> set[str]:
        dev = topology.device(dev_name)
        if dev is None or depth > 16:
            return {dev_name}
        if dev.dm is not None and dev.dm.type == "multipath":
            return {dev.name}
        if dev.slaves:
            return set().union(*(leaves(s, depth + 1) for s in dev.slaves))
        if dev.kind is DeviceKind.PARTITION and dev.parent:
            return {dev.parent}
        return {dev.name}

    return max(1, sum(_spindles(topology, leaf) for leaf in leaves(name)))


def _spindles(topology: Topology, name: str) -> int:
    """The drives one leaf stands for: a RAID volume's physical drives, else one (a
    multipath LUN's array is not visible from the host: one drive)."""
    dev = topology.device(name)
    if dev is not None and dev.controller is not None and dev.controller.physical_drives:
        return dev.controller.physical_drives
    return 1


def facts(topology: Topology, name: str) -> TargetFacts:
    from stortune.schemas.bench.steps import TargetFacts

    dev = topology.device(name)
    if dev is None:
        raise ValueError(f"no device {name!r} in the topology")
    return TargetFacts(kind="device", drives=drives(topology, name), rotational=dev.rotational,
                       size_bytes=dev.size_bytes)
