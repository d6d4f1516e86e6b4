"""Render a concrete step as a fio job file: text in fio's ini syntax, nothing else.

Every job file has ``group_reporting``, so one step yields one result entry
whatever its numjobs, unless the step asks for each job's figures (``per_job``:
fairness across concurrent jobs); the result adds the jobs up either way.
Sequential jobs of one step get disjoint regions (``offset_increment``), as
iozone's threads each have their own file, so they do not read each other's
cached pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stortune.schemas.bench.steps import WorkloadStep
from stortune.schemas.bench.units import format_size

#: fio aligns I/O to the block size; regions are rounded down to this at least.
_MIN_ALIGN = 4096
_SECTION = re.compile(r"[^A-Za-z0-9_.-]")


class JobError(ValueError):
    """The step cannot run on this target (it does not fit); says what to change."""


@dataclass(frozen=True)
class FioTarget:
    filename: str  # /dev/loop3, /srv/bench/stortune.dat
    size_bytes: int  # what the step may use: the device, or the file's spec size
    is_file: bool = False


def _escape(path: str) -> str:
    # fio separates several files in filename= with ':'.
    if any(c in path for c in "\x00\n\r"):
        raise JobError(f"file name {path!r} holds a control character")
    return path.replace("\\", "\\\\").replace(":", "\\:")


def _align(step: WorkloadStep) -> int:
    sizes = [e.size for e in step.block_size_split or []] or [step.block_size or _MIN_ALIGN]
    return max(_MIN_ALIGN, *sizes)


def regions(step: WorkloadStep, target: FioTarget) -> tuple[int, int | None]:
    """(bytes per job, offset increment or None) for ``step`` on ``target``."""
    align = _align(step)
    split = step.sequential and step.numjobs > 1
    if step.size is not None:
        per_job = step.size
    else:
        per_job = target.size_bytes // step.numjobs if split else target.size_bytes
    per_job = per_job // align * align
    if per_job <= 0:
        raise JobError(f"step {step.name}: the target ({format_size(target.size_bytes)}) has no room"
                       f" for {step.numjobs} job(s) of {format_size(align)} blocks")
    footprint = per_job * step.numjobs if split else per_job
    if footprint > target.size_bytes:
        raise JobError(f"step {step.name}: {step.numjobs} job(s) x {format_size(per_job)} need"
                       f" {format_size(footprint)}, more than the target's"
                       f" {format_size(target.size_bytes)}: lower size")
    return per_job, (per_job if split else None)


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def render(step: WorkloadStep, target: FioTarget) -> str:
    """The job file for one step."""
    per_job, increment = regions(step, target)
    opts: list[tuple[str, object]] = [
        ("filename", _escape(target.filename)),
        ("ioengine", step.ioengine),
        ("direct", int(step.direct)),
        ("rw", step.pattern),
    ]
    if step.block_size_split:
        opts.append(("bssplit", ":".join(f"{e.size}/{e.percent}" for e in step.block_size_split)))
    else:
        opts.append(("bs", step.block_size or _MIN_ALIGN))
    if step.rwmixread is not None:
        opts.append(("rwmixread", step.rwmixread))
    opts += [("iodepth", step.iodepth), ("numjobs", step.numjobs), ("size", per_job)]
    if increment is not None:
        opts.append(("offset_increment", increment))
    if step.runtime is not None:
        opts.append(("runtime", _ms(step.runtime)))
        if step.time_based:
            opts.append(("time_based", 1))
    if step.ramp_time:
        opts.append(("ramp_time", _ms(step.ramp_time)))
    opts.append(("invalidate", int(step.invalidate)))
    if step.end_fsync:
        opts.append(("end_fsync", 1))
    if not step.sequential:
        # Random offsets without fio's coverage map (its CPU cost skews high IOPS),
        # different on every repeat so no repeat replays another's pattern.
        opts += [("norandommap", 1), ("randrepeat", 0)]
    if target.is_file and step.fresh_file:
        opts.append(("fallocate", "none"))  # the write itself allocates, as iozone's does
    if not step.per_job:
        opts.append(("group_reporting", 1))
    section = _SECTION.sub("_", step.name)
    lines = [f"; stortune step {step.name} (workload {step.workload}"
             f"{', preset ' + step.preset if step.preset else ''})", "[global]"]
    lines += [f"{key}={value}" for key, value in opts]
    lines += ["", f"[{section}]", ""]
    return "\n".join(lines)
