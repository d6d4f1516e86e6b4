"""How a trial's values reach the device: a profile laid over the host's desired profiles.

``overlay_profile`` makes a StorageProfile named ``tune-<experiment>`` with the highest
priority there is, whose rules match the target (and the devices beneath it) by stable id,
never by kernel name: loop devices re-attached in another order, or disks renumbered at a
reboot, swap their names, and trial values must not follow a name onto another device.
Applied together with the host's desired profiles it makes the trial values win
through the one transactional, journaled apply every profile goes through; applying the
desired profiles alone afterwards puts everything back (the planner restores originals).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stortune.schemas import catalog
from stortune.schemas.bench.target import beneath
from stortune.schemas.catalog import Value
from stortune.schemas.documents import DocumentError, parse_profile
from stortune.schemas.patterns import MAX_PATTERN_LENGTH, glob_matches
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device, Topology

# The overlay's name and marks live apart: the serving agent reads them without this package.
from stortune.schemas.trialprofile import EXPERIMENT_ANNOTATION, OVERLAY_PRIORITY, profile_name
from stortune.schemas.tuning.experiment import BENEATH

__all__ = ["EXPERIMENT_ANNOTATION", "OVERLAY_PRIORITY", "devices_beneath", "glob_literal", "id_glob",
           "other_device", "overlay_conflicts", "overlay_profile", "profile_name", "shared_ids",
           "split_point"]


def glob_literal(text: str) -> str:
    """A glob matching exactly ``text`` (its ``*``, ``?`` and ``[`` bracketed)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def id_glob(device_id: str) -> str:
    """A glob matching exactly ``device_id``; an id too long for one glob (a loop device's deep
    backing path) is matched by its end, the part that tells such ids apart."""
    literal = glob_literal(device_id)
    if len(literal) <= MAX_PATTERN_LENGTH:
        return literal
    tail: list[str] = []
    room = MAX_PATTERN_LENGTH - 1  # the leading '*'
    for char in reversed(device_id):
        piece = glob_literal(char)
        if len(piece) > room:
            break
        tail.append(piece)
        room -= len(piece)
    return "*" + "".join(reversed(tail))


def shared_ids(topology: Topology, devices: Sequence[Device]) -> list[str]:
    """Why the overlay's id match would reach further than ``devices``: each id of theirs that
    another device of the host matches too (two loop devices over one file). Empty when safe."""
    ours = {d.name for d in devices}
    globs = {d.name: id_glob(d.id) for d in devices}
    return [f"{other.name} has the id of {name} ({other.id})"
            for name, glob in globs.items() for other in topology.devices
            if other.name not in ours and glob_matches(glob, other.id)]


def other_device(device: Device, read_id: str | None) -> str | None:
    """None when fio read ``device`` (the run's target has its stable id), else what it read:
    a trial tunes one device, by id, and must measure that one."""
    if read_id == device.id:
        return None
    return (f"the trial tuned {device.name} ({device.id}) but fio read "
            f"{read_id or 'a device of unknown id'}: the device names moved")


def devices_beneath(topology: Topology, name: str) -> list[Device]:
    """Every device under ``name`` (md members, the disks holding them, multipath paths, PVs):
    what ``at: beneath`` parameters are set on, each on the devices of a kind that takes it."""
    found = (topology.device(b.device) for b in beneath(topology, name)[1:])
    return [d for d in found if d is not None]


def split_point(point: Mapping[str, Value]) -> tuple[dict[str, Value], dict[str, Value]]:
    """(settings on the target, settings on the devices beneath) of a point."""
    target = {k: v for k, v in point.items() if not k.endswith(BENEATH)}
    beneath = {k.removesuffix(BENEATH): v for k, v in point.items() if k.endswith(BENEATH)}
    return target, beneath


def _rules(point: Mapping[str, Value], target: Device, beneath: Sequence[Device]) -> list[dict[str, Any]]:
    on_target, on_beneath = split_point(point)
    rules: list[dict[str, Any]] = []
    if on_target:
        rules.append({"name": "target", "match": {"kind": [target.kind.value], "id": [id_glob(target.id)]},
                      "settings": on_target})
    if on_beneath:
        # Each device beneath takes the settings that apply to its kind (a partition has no scheduler).
        for kind in sorted({d.kind for d in beneath}, key=lambda k: k.value):
            settings = {k: v for k, v in on_beneath.items() if kind in catalog.get(k).applies_to}
            ids = list(dict.fromkeys(id_glob(d.id) for d in beneath if d.kind is kind))
            if settings:
                rules.append({"name": f"beneath-{kind.value}", "match": {"kind": [kind.value], "id": ids},
                              "settings": settings})
        if len(rules) == (1 if on_target else 0):
            raise ValueError(f"none of the devices beneath {target.name} takes"
                             f" {', '.join(sorted(on_beneath))}")
    return rules


def overlay_profile(experiment_name: str, point: Mapping[str, Value], target: Device,
                    beneath: Sequence[Device] = ()) -> StorageProfile:
    """The profile that sets ``point`` on ``target`` (and beneath it) above every other profile."""
    rules = _rules(point, target, beneath)
    if not rules:
        raise ValueError("the point sets nothing")

    document = {
        "apiVersion": "stortune/v1", "kind": "StorageProfile",
        "metadata": {"name": profile_name(experiment_name),
                     "annotations": {EXPERIMENT_ANNOTATION: experiment_name}},
        "spec": {"priority": OVERLAY_PRIORITY, "rules": rules},
    }
    try:
        return parse_profile(document, f"overlay of experiment {experiment_name}")
    except DocumentError as exc:
        raise ValueError(str(exc)) from None


def overlay_conflicts(overlay: StorageProfile, desired: Sequence[StorageProfile]) -> list[str]:
    """Desired profiles that would beat the overlay (same top priority, a name sorting first):
    the experiment would measure their values, not its own. Refuse to start on any."""
    return sorted(p.name for p in desired
                  if p.spec.priority >= overlay.spec.priority and p.name < overlay.name
                  and p.name != overlay.name)
