"""The experiment's result as a StorageProfile a GitOps repository can commit.

Its rules match the same class of device by stable facts (kind, model, driver, RAID level,
role); the kernel name only when the device has none of those. The settings are the
recommended values (the current ones when the advice is to keep them) and the annotations
name the experiment, the workload, the gain and its 95% interval.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from stortune.schemas import catalog
from stortune.schemas.bench.spec import PresetRef
from stortune.schemas.documents import DocumentError, parse_profile
from stortune.schemas.patterns import MAX_PATTERN_LENGTH
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device, DeviceKind, Role, Topology
from stortune.schemas.tuning.evidence import Outcome
from stortune.schemas.tuning.experiment import TuningExperiment
from stortune.schemas.tuning.overlay import EXPERIMENT_ANNOTATION, devices_beneath, glob_literal, split_point

#: Roles that say what a device is for, not its passing state (mounted, has holders).
_CLASS_ROLES = (Role.MD_MEMBER, Role.MPATH_PATH, Role.LVM_PV)


def _char(c: str) -> str:
    if c.isascii() and c.isalnum():
        return c
    if c in string.punctuation:
        return "\\" + c  # RE2 reads an escaped punctuation character as itself
    if not c.isascii() and c.isprintable():
        return c  # no RE2 metacharacter is outside ASCII
    return f"\\x{{{ord(c):x}}}"


def regex_literal(text: str, limit: int = MAX_PATTERN_LENGTH) -> str:
    """An RE2 expression matching exactly ``text``; when that would pass ``limit`` (a model of
    hundreds of characters), one matching the longest prefix that fits and anything after it."""
    pieces = [_char(c) for c in text]
    if sum(map(len, pieces)) <= limit:
        return "".join(pieces)
    rest, out, used = "(?s:.*)", [], 0
    for piece in pieces:
        if used + len(piece) + len(rest) > limit:
            break
        out.append(piece)
        used += len(piece)
    return "".join(out) + rest


def _driver(dev: Device) -> str | None:
    # The matcher's driver, stripped as it strips what it compares (matching.mismatch).
    driver = dev.scsi_host.driver if dev.scsi_host else dev.driver
    return driver.strip() if driver and driver.strip() else None


def class_match(dev: Device) -> dict[str, Any]:
    """A match for devices like ``dev`` by stable facts; its kernel name only when it has none."""
    match: dict[str, Any] = {"kind": [dev.kind.value]}
    stable = False
    if dev.model and dev.model.strip():
        match["model"] = regex_literal(dev.model.strip())
        stable = True
    if driver := _driver(dev):
        match["driver"] = regex_literal(driver)
        stable = True
    if dev.md is not None and dev.md.level:
        match["raidLevel"] = [dev.md.level]
        stable = True
    roles = [r.value for r in dev.roles if r in _CLASS_ROLES]
    if roles:
        match["role"] = roles
        stable = True
    if not stable and dev.kind is DeviceKind.LOOP and dev.id.startswith("loop:/"):
        # A loop device is stable by its backing file, not its number; kind alone would
        # match every loop device on the host (snaps, images, other tools' scratch devices).
        # Its file name, in any directory, as examples/local-demo.yaml matches the demo's.
        match["id"] = ["loop:*/" + glob_literal(dev.id.rsplit("/", 1)[-1])]
    elif not stable and dev.kind is not DeviceKind.LOOP:
        match["name"] = [glob_literal(dev.name)]
    return match


def _workload(exp: TuningExperiment) -> str:
    return ", ".join(w.label if isinstance(w, PresetRef) else w.name for w in exp.spec.workloads)


def profile_annotations(exp: TuningExperiment, outcome: Outcome) -> dict[str, str]:
    rec = outcome.recommendation
    out = {EXPERIMENT_ANNOTATION: exp.name, "stortune.io/workload": _workload(exp)[:1000],
           "stortune.io/objective": f"{outcome.goal} {outcome.metric}",
           "stortune.io/keep-current": str(rec.keepCurrent).lower(),
           "stortune.io/reliable": str(outcome.baseline.reliable).lower()}
    if rec.gain is not None:
        out["stortune.io/gain"] = f"{rec.gain.pct:+.1f}%"
        out["stortune.io/interval"] = f"{rec.gain.low:+.1f}%..{rec.gain.high:+.1f}%"
    return out


def recommended_profile(exp: TuningExperiment, outcome: Outcome, target: Device,
                        topology: Topology | None = None, beneath: Sequence[Device] = ()) -> StorageProfile:
    """The StorageProfile carrying the recommendation for devices of ``target``'s class."""
    on_target, on_beneath = split_point(outcome.recommendation.values)
    rules: list[dict[str, Any]] = []
    if on_target:
        rules.append({"name": "target", "match": class_match(target), "settings": on_target})
    if on_beneath:
        below = list(beneath)
        if not below and topology is not None:
            # As the overlay set them: the md members are partitions, their scheduler the disks'.
            below = devices_beneath(topology, target.name)
        for dev in _one_per_kind(below):
            settings = {k: v for k, v in on_beneath.items() if dev.kind in catalog.get(k).applies_to}
            if settings:
                rules.append({"name": f"beneath-{dev.kind.value}", "match": class_match(dev),
                              "settings": settings})
        if not rules or rules[-1]["name"] == "target":
            raise ValueError(f"none of the devices beneath {target.name} takes"
                             f" {', '.join(sorted(on_beneath))}")
    document: dict[str, Any] = {
        "apiVersion": "stortune/v1", "kind": "StorageProfile",
        "metadata": {"name": exp.result_name, "annotations": profile_annotations(exp, outcome)},
        "spec": {"rules": rules},
    }
    if exp.spec.hostSelector is not None:
        document["spec"]["hostSelector"] = exp.spec.hostSelector.model_dump(exclude_defaults=True)
    try:
        return parse_profile(document, f"recommendation of experiment {exp.name}")
    except DocumentError as exc:
        raise ValueError(str(exc)) from None


def _one_per_kind(devices: Sequence[Device]) -> list[Device]:
    seen: dict[DeviceKind, Device] = {}
    for dev in devices:
        seen.setdefault(dev.kind, dev)
    return list(seen.values())
