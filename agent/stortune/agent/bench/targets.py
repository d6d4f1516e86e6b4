"""Find a spec's target on this host and decide whether it may be written.

A device target is the one device the spec's ``match`` selects (the same
matcher as profile rules). A file target must lie in a benchmark directory the
host allows, reached without following links and without crossing a mount
point (see ``files``); the device holding that directory's filesystem is found
through mountinfo, so its stack can be sampled.

Safety: a workload that writes to a raw device needs ``allowDestructive`` and
a device that is not mounted, has no holders and no partitions, is not
read-only and carries no signature libblkid knows (filesystem, RAID, volume
manager, encryption, partition table: see ``signatures``; a probe that cannot
answer refuses too). Every reason is reported at once. Reads are allowed anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stortune.agent import procfs
from stortune.agent.bench import signatures
from stortune.agent.bench.errors import BenchmarkError, UnsafeTargetError
from stortune.agent.bench.files import BenchFiles, Place
from stortune.agent.kernelfs import KernelFS
from stortune.agent.tools import ToolRunner
from stortune.schemas.bench.fiojob import FioTarget
from stortune.schemas.bench.results import TargetInfo
from stortune.schemas.bench.safety import write_refusals, writing_steps
from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.schemas.bench.steps import TargetFacts, WorkloadStep
from stortune.schemas.bench.target import Beneath, beneath, facts
from stortune.schemas.matching import mismatch
from stortune.schemas.profile import Match
from stortune.schemas.topology import Device, DeviceKind, Topology


@dataclass(frozen=True)
class ResolvedTarget:
    info: TargetInfo
    fio: FioTarget
    device: Device | None  # the target device, or the one holding the file
    beneath: list[Beneath]  # what the sampler watches
    node: Path  # device node or file path
    existed: bool  # file targets: was there before the run (a file stortune made earlier)
    place: Place | None = None  # file targets: where it resolved

    @property
    def is_file(self) -> bool:
        return self.info.kind == "file"


def resolve(fs: KernelFS, spec: BenchmarkSpec, topology: Topology,
            files: BenchFiles | None = None) -> ResolvedTarget:
    """The spec's target on this host; a file target is checked against ``files``, the
    benchmark directories the host allows."""
    target = spec.spec.target
    if target.device is not None:
        return _device(fs, target.device, topology)
    assert target.file is not None
    if files is None:
        raise BenchmarkError("spec.target.file: this agent has no benchmark directories to put files in")
    return _file(fs, files, target.file.path, target.file.size, topology)


def _device(fs: KernelFS, match: Match, topology: Topology) -> ResolvedTarget:
    chosen = [d for d in topology.devices if d.kind is not DeviceKind.HOST and mismatch(match, d) is None]
    if not chosen:
        raise BenchmarkError(f"spec.target.device matches none of the {len(topology.devices)} devices"
                             " on this host (stortune-agent topology lists them)")
    if len(chosen) > 1:
        names = ", ".join(d.name for d in chosen[:8]) + (" ..." if len(chosen) > 8 else "")
        raise BenchmarkError(f"spec.target.device matches {len(chosen)} devices ({names}); a benchmark"
                             " runs on exactly one: narrow the match, e.g. name: [...]")
    dev = chosen[0]
    node = fs.device_node(dev.name)
    if not node.exists():
        raise BenchmarkError(f"{dev.name}: device node {node} does not exist")
    try:
        size = dev.size_bytes or _size_of(node)
    except OSError as exc:
        raise BenchmarkError(f"cannot open {node}: {exc.strerror}") from None
    info = TargetInfo(kind="device", path=str(node), device=dev.name, device_id=dev.id,
                      size_bytes=size, facts=facts(topology, dev.name))
    return ResolvedTarget(info, FioTarget(str(node), size), dev, beneath(topology, dev.name), node,
                          existed=True)


def _size_of(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def _holding_device(fs: KernelFS, path: str, topology: Topology) -> Device | None:
    """The block device of the filesystem holding ``path``: the longest mountpoint containing it."""
    mounts, _ = procfs.parse_mountinfo(fs.read_table("self/mountinfo") or "")
    best: procfs.MountInfo | None = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        inside = path == mp or path.startswith(mp if mp == "/" else mp + "/")
        if inside and (best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/")):
            best = m  # later mounts over the same point win, as in the kernel
    if best is None:
        return None
    return next((d for d in topology.devices if d.devno == best.devno), None)


def _file(fs: KernelFS, files: BenchFiles, raw: str, size: int, topology: Topology) -> ResolvedTarget:
    place = files.check(raw)
    holder = _holding_device(fs, place.real, topology)
    base = facts(topology, holder.name) if holder is not None else TargetFacts()
    target_facts = TargetFacts(kind="file", drives=base.drives, rotational=base.rotational,
                               size_bytes=size)
    info = TargetInfo(kind="file", path=raw, device=holder.name if holder else None,
                      device_id=holder.id if holder else None, size_bytes=size, facts=target_facts)
    below = beneath(topology, holder.name) if holder is not None else []
    # fio opens the real path: the spec may spell the directory through a link (files.py)
    return ResolvedTarget(info, FioTarget(place.real, size, is_file=True), holder, below, Path(place.real),
                          existed=place.exists, place=place)


def check_safety(resolved: ResolvedTarget, steps: Sequence[WorkloadStep], allow_destructive: bool,
                 *, tools: ToolRunner | None = None) -> None:
    """Raise UnsafeTargetError with every reason a write workload may not run here.

    ``tools`` runs the signature probe (default: ``signatures.probe_tools()`` on this
    process's PATH and the sbin directories).
    """
    shown = writing_steps(steps)
    if not shown:
        return
    if resolved.is_file:
        if resolved.existed and not allow_destructive:
            raise UnsafeTargetError(resolved.info.path, [
                f"the file exists and {shown} would overwrite it; set allowDestructive: true,"
                " or give a path that does not exist yet"])
        return
    dev = resolved.device
    assert dev is not None
    reasons = write_refusals(dev, steps, allow_destructive)
    try:
        reasons += signatures.describe(dev.name, signatures.probe(resolved.node,
                                                                  tools or signatures.probe_tools()))
    except signatures.ProbeError as exc:
        reasons.append(f"cannot tell what {dev.name} holds, so it is not written: {exc}")
    if reasons:
        raise UnsafeTargetError(str(resolved.node), reasons)
