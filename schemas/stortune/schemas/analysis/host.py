"""A whole host's analysis: every device's layer model and layout checks, plus host checks.

``host_analysis`` is what ``stortune-agent analyze``, the control plane's
``/hosts/{name}/analysis`` and the support bundle show.
"""

from __future__ import annotations

from collections.abc import Sequence

from stortune.schemas.analysis.checks import device_checks, host_checks
from stortune.schemas.analysis.layers import (
    MAX_DEVICE_WORK,
    MAX_HOST_WORK,
    Index,
    bounded,
    device_analysis_work,
)
from stortune.schemas.analysis.members import balance, slow_members
from stortune.schemas.analysis.model import Check, HostAnalysis, MeasuredCeiling
from stortune.schemas.analysis.raid import MAX_DISKS, existing_array
from stortune.schemas.bench.results import BenchmarkResult, DeviceStats
from stortune.schemas.stripecache import DEFAULT_RAM_SHARE
from stortune.schemas.topology import DeviceKind, Topology

#: Device figures (one device over one step run) judged for slow members and balance, newest
#: first: 100,000 devices x 3 runs take about a second, and an agent's result is not bounded.
MAX_JUDGED_STATS = 500_000


def judged_runs(results: Sequence[BenchmarkResult],
                limit: int = MAX_JUDGED_STATS) -> tuple[list[Sequence[DeviceStats]], int]:
    """The successful step runs' device figures of ``results`` (newest first), up to ``limit``
    figures in all, and how many step runs were left out past it."""
    runs: list[Sequence[DeviceStats]] = []
    left_out = 0
    total = 0
    for result in results:
        for run in result.runs:
            if run.state != "done":
                continue
            if left_out or total + len(run.devices) > limit:
                left_out += 1
                continue
            total += len(run.devices)
            runs.append(run.devices)
    return runs, left_out


def host_analysis(topology: Topology, *, measured: Sequence[MeasuredCeiling] = (),
                  results: Sequence[BenchmarkResult] = (),
                  ram_share: float = DEFAULT_RAM_SHARE, work: int = MAX_HOST_WORK,
                  max_stats: int = MAX_JUDGED_STATS) -> HostAnalysis:
    """Every device of ``topology`` (the host pseudo-device aside) with its layers and checks.

    ``measured``: probe ceilings; a single device's figure replaces its class estimate (for a
    device measured twice, the later entry wins). ``results``: this host's benchmark results:
    every successful step run of them is one sample for the slow members (a member must stand
    out in most of them), and their figures add up for the path balance. ``work``: the walking
    of stacked devices the whole analysis may take (``layers.MAX_HOST_WORK``); devices past it
    are listed without layers, with an ``analysis-bounded`` check.
    ``ram_share``: the share of RAM md stripe caches may cost before the checks say the
    planner refuses them. ``max_stats``: the device figures judged at most (newest results
    first, as the control plane passes them); the step runs past it are left out, with an
    ``analysis-bounded`` check saying how many.
    """
    runs, left_out = judged_runs(results, max_stats)
    by_device = {m.device: m for m in measured if "+" not in m.device}
    index = Index(topology)
    devices = []
    left = work  # the whole analysis' size follows this: junk stacking stays bounded
    skipped = 0
    for dev in topology.devices:
        if dev.kind is DeviceKind.HOST:
            continue
        if left <= 0:
            skipped += 1
            analysis = bounded(dev, f"not analysed: the host's devices took more than {work:,}"
                                    " steps of stacking to walk before it")
        else:
            analysis, spent = device_analysis_work(index, dev.name, by_device, min(left, MAX_DEVICE_WORK))
            left -= spent
        analysis.checks.extend(device_checks(index, dev.name, ram_share=ram_share))
        devices.append(analysis)
    used = [m for m in measured if m.device in by_device and by_device[m.device] is m]
    checks = host_checks(topology, ram_share=ram_share)
    if skipped:
        checks.append(Check(severity="warning", code="analysis-bounded", message=(
            f"{skipped} devices not analysed: the topology's stacking (slaves, partitions) took more"
            f" than {work:,} steps to walk; no real host stacks so")))
    if left_out:
        checks.append(Check(severity="info", code="analysis-bounded", message=(
            f"slow members and path balance judged from the newest {len(runs)} step runs"
            f" ({max_stats:,} device figures at most): {left_out} older step runs left out")))
    # What each md array can do, by RAID planning's model (an array too wide to model, or one
    # the walk gave up on, is left out: its members would be walked again here).
    analysed = {a.device for a in devices if not any(c.code == "analysis-bounded" for c in a.checks)}
    arrays = [existing_array(topology, dev.name, by_device, by_name=index.by_name)
              for dev in topology.devices
              if dev.md is not None and dev.name in analysed and len(dev.md.members) <= MAX_DISKS]
    return HostAnalysis(hostname=topology.hostname, devices=devices, checks=checks, measured=used,
                        slow_members=slow_members(runs),
                        balance=balance(topology, [d for run in runs for d in run]), arrays=arrays,
                        controllers=topology.controllers)
