"""The field's workloads, usable by name in a BenchmarkSpec (``preset: iometer-4k``).

Each preset expands, for a given target, into concrete steps. Expansion is a
pure function of the preset, the overrides written next to it and the target's
facts: on an array, asynchronous presets keep at least
``OUTSTANDING_PER_DRIVE`` I/Os in flight per member drive, as IOmeter practice
asks, so a 12-disk RAID is not measured with the queue depth of one disk.

Step names do not depend on the target (``names``), so a document can be
checked (duplicates, threshold globs) before any host is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from stortune.schemas.bench.preset_names import PRESET_NAMES
from stortune.schemas.bench.steps import IoEngine, Pattern, TargetFacts, WorkloadStep

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
OUTSTANDING_PER_DRIVE = 2
IOZONE_THREADS = (1, 2, 10)
IOZONE_PHASES = ("write", "rewrite", "read", "reread")
STREAM_READERS = 8
#: Time-bound presets run this long unless the spec says otherwise.
DEFAULT_RUNTIME = 30.0
#: Size-bound presets (iozone, stream) stop after this long at the latest.
DEFAULT_CAP = 600.0


@dataclass(frozen=True)
class Overrides:
    """What a spec may change on a preset; None keeps the preset's choice."""

    size: int | None = None
    runtime: float | None = None
    ramp_time: float | None = None
    direct: bool | None = None
    repeats: int = 1


def outstanding(base: int, numjobs: int, facts: TargetFacts) -> int:
    """iodepth per job so the step keeps >= OUTSTANDING_PER_DRIVE I/Os per drive in flight."""
    return max(base, math.ceil(OUTSTANDING_PER_DRIVE * facts.drives / numjobs))


def _iozone_size(facts: TargetFacts, ov: Overrides) -> int:
    """Bytes per thread: every thread of the largest count gets its own region."""
    if ov.size is not None:
        return ov.size
    if facts.size_bytes is None:
        return GiB
    share = facts.size_bytes // max(IOZONE_THREADS) // MiB * MiB
    return max(MiB, min(GiB, share))


def _iozone(label: str, ov: Overrides, facts: TargetFacts) -> list[WorkloadStep]:
    direct = bool(ov.direct)
    steps = []
    for threads in IOZONE_THREADS:
        for phase in IOZONE_PHASES:
            reading = phase in ("read", "reread")
            steps.append(WorkloadStep(
                name=f"{label}/t{threads}/{phase}", workload=label, preset="iozone-seq",
                phase=phase, pattern="read" if reading else "write", block_size=MiB,
                numjobs=threads, iodepth=1, direct=direct, ioengine="psync",
                size=_iozone_size(facts, ov), runtime=ov.runtime or DEFAULT_CAP,
                time_based=False, ramp_time=ov.ramp_time or 0, repeats=ov.repeats,
                # iozone's re-read is meant to find the data cached; the read is not.
                invalidate=phase != "reread",
                end_fsync=not reading and not direct, fresh_file=phase == "write",
            ))
    return steps


def _async(label: str, ov: Overrides, facts: TargetFacts, *, preset: str,
           phases: list[tuple[str, Pattern, int | None]], bs: int, base_depth: int,
           engine: IoEngine = "libaio") -> list[WorkloadStep]:
    direct = True if ov.direct is None else ov.direct
    return [
        WorkloadStep(
            name=f"{label}/{phase}" if len(phases) > 1 else label, workload=label,
            preset=preset, phase=phase, pattern=pattern, rwmixread=mix, block_size=bs,
            # Buffered I/O is synchronous whatever the engine: one I/O in flight.
            iodepth=outstanding(base_depth, 1, facts) if direct else 1, numjobs=1, direct=direct,
            ioengine=engine if direct else "psync", size=ov.size,
            runtime=ov.runtime or DEFAULT_RUNTIME, time_based=True,
            ramp_time=ov.ramp_time or 0, repeats=ov.repeats,
        )
        for phase, pattern, mix in phases
    ]


_IOMETER: list[tuple[str, Pattern, int | None]] = [
    ("randread", "randread", None), ("randwrite", "randwrite", None), ("oltp", "randrw", 67),
]
_SEQ: list[tuple[str, Pattern, int | None]] = [("read", "read", None), ("write", "write", None)]


def _stream(label: str, ov: Overrides, facts: TargetFacts) -> list[WorkloadStep]:
    # Buffered sequential readers, each through its own region once: read-ahead
    # decides how big the requests reaching the device are.
    direct = bool(ov.direct)
    return [WorkloadStep(
        name=label, workload=label, preset="stream-32k", phase="read", pattern="read",
        block_size=32 * KiB, numjobs=STREAM_READERS, iodepth=1, direct=direct,
        ioengine="psync", size=ov.size, runtime=ov.runtime or DEFAULT_CAP, time_based=False,
        ramp_time=ov.ramp_time or 0, repeats=ov.repeats, invalidate=True,
    )]


_Expand = Callable[[str, Overrides, TargetFacts], list[WorkloadStep]]
_PRESETS: dict[str, _Expand] = {
    "iozone-seq": _iozone,
    "iometer-4k": lambda label, ov, f: _async(label, ov, f, preset="iometer-4k", phases=_IOMETER,
                                              bs=4 * KiB, base_depth=4),
    "iometer-64k": lambda label, ov, f: _async(label, ov, f, preset="iometer-64k", phases=_IOMETER,
                                               bs=64 * KiB, base_depth=4),
    "seq-64k": lambda label, ov, f: _async(label, ov, f, preset="seq-64k", phases=_SEQ,
                                           bs=64 * KiB, base_depth=4),
    "seq-1m": lambda label, ov, f: _async(label, ov, f, preset="seq-1m", phases=_SEQ, bs=MiB,
                                          base_depth=4),
    "stream-32k": _stream,
    "oltp-8k": lambda label, ov, f: _async(label, ov, f, preset="oltp-8k",
                                           phases=[("oltp", "randrw", 70)], bs=8 * KiB,
                                           base_depth=64),
}
assert set(_PRESETS) == set(PRESET_NAMES), "every preset name needs an expansion"

DESCRIPTIONS: dict[str, str] = {
    "iozone-seq": "1M sequential write, rewrite, read, re-read at 1, 2 and 10 threads (buffered, psync)",
    "iometer-4k": "4K random read, random write and a 67/33 OLTP mix, direct,"
                  " >= 2 outstanding I/Os per drive",
    "iometer-64k": "the iometer-4k access specifications at 64K",
    "seq-64k": "64K sequential read and write, direct",
    "seq-1m": "1M sequential read and write, direct",
    "stream-32k": f"{STREAM_READERS} buffered 32K sequential readers (read-ahead decides)",
    "oltp-8k": "8K random 70/30 read/write with 64 outstanding I/Os",
}


def expand(preset: str, label: str, overrides: Overrides, facts: TargetFacts) -> list[WorkloadStep]:
    """The concrete steps of ``preset`` on a target with ``facts``; names start with ``label``."""
    try:
        make = _PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESET_NAMES)}") from None
    return make(label, overrides, facts)


def names(preset: str, label: str) -> list[str]:
    """Step names of a preset, which do not depend on the target."""
    return [s.name for s in expand(preset, label, Overrides(), TargetFacts())]
